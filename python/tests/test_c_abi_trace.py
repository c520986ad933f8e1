"""The C ABI's tracing exports (docs/c-abi.md, "Tracing"): while tracing is off (no
OTEL_* endpoint: the test process has none), a span started under any context is 0 and
costs no handle, ``dc_trace_on`` reads 0, a context's event is a no-op; bad handles and
arguments are errors, never a crash. The spans themselves are checked end to end, over
OTLP, by fault_tolerance/test_ft_traces.py."""

from __future__ import annotations

from c_abi import DC_EBADF, DC_EINVAL, expect, ffi, free_all, lib_fixture, new_ctx, ok  # noqa: F401 - lib_fixture: "lib"


def test_off_spans_are_zero_and_free(lib):
    assert lib.dc_trace_on == 0
    ctx = new_ctx(lib)
    out = ffi.new("uint64_t*", 7)
    attrs = b'{"gen_ai.request.max_tokens": 16, "names": ["a", "b"], "ok": true}'
    ok(lib, lib.dc_trace_span_start(ctx, b"", 0, attrs, len(attrs), out))
    assert out[0] == 0, "not traced: no span, no handle"
    ok(lib, lib.dc_trace_context_event(ctx, b"dynamo_ctx.kv_blocks_freed", 26, b'{"count": 3}', 12))
    free_all(lib, ctx)


def test_bad_handles_and_arguments(lib):
    out = ffi.new("uint64_t*")
    expect(lib, lib.dc_trace_span_start(12345, b"x", 1, ffi.NULL, 0, out), DC_EBADF, "dc_trace_span_start")
    expect(lib, lib.dc_trace_span_event(0, b"x", 1, ffi.NULL, 0), DC_EBADF, "dc_trace_span_event")
    expect(lib, lib.dc_trace_span_end(0, ffi.NULL, 0, 0), DC_EBADF, "dc_trace_span_end")
    expect(lib, lib.dc_trace_context_event(12345, b"x", 1, ffi.NULL, 0), DC_EBADF, "dc_trace_context_event")
    ctx = new_ctx(lib)
    expect(lib, lib.dc_trace_span_start(ctx, b"x", 1, ffi.NULL, 0, ffi.NULL), DC_EINVAL, "dc_trace_span_start")
    for bad in (b"[1]", b"{", b'{"k": {"nested": 1}}', b'{"k": [1, "mixed"]}', b'{"k": null}'):
        expect(lib, lib.dc_trace_span_start(ctx, b"", 0, bad, len(bad), out), DC_EINVAL, "dc_trace_span_start")
    long_name = b"n" * 257
    expect(lib, lib.dc_trace_context_event(ctx, long_name, len(long_name), ffi.NULL, 0), DC_EINVAL, "dc_trace_context_event")
    expect(lib, lib.dc_trace_span_start(ctx, ffi.NULL, 3, ffi.NULL, 0, out), DC_EINVAL, "dc_trace_span_start")
    free_all(lib, ctx)
