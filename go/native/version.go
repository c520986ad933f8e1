package main

// version is the library's and the Python package's version, the only copy:
// dc_version exports it, dynamo_ctx.__version__ reads it from there, and
// pyproject.toml's build reads it from this line (see [tool.hatch.version]).
const version = "0.1.0"
