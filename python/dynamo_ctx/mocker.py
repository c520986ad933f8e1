"""The mock engine, :mod:`dynamo_ctx.backends.mocker`, under its documented name."""

from .backends.mocker import CompletionOutput, EngineStats, MockAsyncLLM, MockEngineArgs, RequestOutput, SamplingParams

__all__ = ["CompletionOutput", "EngineStats", "MockAsyncLLM", "MockEngineArgs", "RequestOutput", "SamplingParams"]
