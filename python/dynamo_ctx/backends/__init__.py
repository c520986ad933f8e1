"""Backend handlers for inference engines."""
