package main

// The exports of tracing (go/tracing): the host's spans, the engine's
// generate, children of the span the library attached to a context (the
// worker's handler), with their events; and the runtimes' share in turning
// tracing on from the OTEL_* variables. Spans are made and exported here
// only: the host needs no OpenTelemetry of its own.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"

// Defined in trace_on.c.
extern uint32_t dc_trace_on;

static void dc_set_trace_on(uint32_t on) { __atomic_store_n(&dc_trace_on, on, __ATOMIC_RELEASE); }
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"math"
	"sync"

	"go.opentelemetry.io/otel/attribute"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// Limits of the span exports' arguments.
const (
	maxSpanName  = 256
	maxSpanAttrs = 64 << 10
)

var (
	traceMu       sync.Mutex
	traceReleases = map[*plane.Runtime]func(){} // each runtime's share in tracing
)

// traceRuntime gives rt a share in tracing: the first runtime of the
// process turns it on (if the environment asks), closeRuntime gives it back.
func traceRuntime(rt *plane.Runtime) {
	traceMu.Lock()
	defer traceMu.Unlock()
	traceReleases[rt] = tracing.Acquire()
	setTraceFlag()
}

// closeRuntime closes rt and gives its share in tracing back (the last one
// flushes the spans still queued, within tracing.ShutdownTimeout).
func closeRuntime(rt *plane.Runtime) {
	rt.Close()
	traceMu.Lock()
	defer traceMu.Unlock()
	if release, ok := traceReleases[rt]; ok {
		delete(traceReleases, rt)
		release()
		setTraceFlag()
	}
}

func setTraceFlag() {
	on := C.uint32_t(0)
	if tracing.Enabled() {
		on = 1
	}
	C.dc_set_trace_on(on)
}

// spanArgs checks and reads a span's name and attributes (a JSON object
// whose values are strings, numbers, booleans or arrays of one of them).
func spanArgs(fn string, name *C.char, nameLen C.size_t, attrs *C.char, attrsLen C.size_t) (string, []attribute.KeyValue, C.int) {
	if (name == nil && nameLen > 0) || (attrs == nil && attrsLen > 0) {
		return "", nil, fail(C.DC_EINVAL, "%s: name and attrs must not be NULL with a length", fn)
	}
	if nameLen > maxSpanName || attrsLen > maxSpanAttrs {
		return "", nil, fail(C.DC_EINVAL, "%s: a name of at most %d bytes, attributes of at most %d", fn, maxSpanName, maxSpanAttrs)
	}
	kvs, err := attributesOf(goBytes(attrs, attrsLen))
	if err != nil {
		return "", nil, fail(C.DC_EINVAL, "%s: %v", fn, err)
	}
	return C.GoStringN(name, C.int(nameLen)), kvs, C.DC_OK
}

// attributesOf reads a JSON object of attributes (empty: none).
func attributesOf(data []byte) ([]attribute.KeyValue, error) {
	if len(data) == 0 {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("attributes must be a JSON object: %v", err)
	}
	kvs := make([]attribute.KeyValue, 0, len(m))
	for k, v := range m {
		kv, ok := attributeOf(k, v)
		if !ok {
			return nil, fmt.Errorf("attribute %q: a string, number, boolean or array of one of them", k)
		}
		kvs = append(kvs, kv)
	}
	return kvs, nil
}

func attributeOf(k string, v any) (attribute.KeyValue, bool) {
	switch v := v.(type) {
	case string:
		return attribute.String(k, v), true
	case bool:
		return attribute.Bool(k, v), true
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return attribute.Int64(k, int64(v)), true
		}
		return attribute.Float64(k, v), true
	case []any:
		return sliceAttribute(k, v)
	}
	return attribute.KeyValue{}, false
}

func sliceAttribute(k string, v []any) (attribute.KeyValue, bool) {
	strs, nums, bools := []string{}, []float64{}, []bool{}
	for _, e := range v {
		switch e := e.(type) {
		case string:
			strs = append(strs, e)
		case float64:
			nums = append(nums, e)
		case bool:
			bools = append(bools, e)
		default:
			return attribute.KeyValue{}, false
		}
	}
	switch {
	case len(strs) == len(v):
		return attribute.StringSlice(k, strs), true
	case len(nums) == len(v):
		return attribute.Float64Slice(k, nums), true
	case len(bools) == len(v):
		return attribute.BoolSlice(k, bools), true
	}
	return attribute.KeyValue{}, false
}

// dc_trace_span_start: see dynamo_ctx.h, the reference.
//
//export dc_trace_span_start
func dc_trace_span_start(ctx C.uint64_t, name *C.char, nameLen C.size_t, attrs *C.char, attrsLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_trace_span_start", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_trace_span_start: out must not be NULL")
	}
	*out = 0
	c, rc := get(contexts, "dc_trace_span_start", ctx)
	if rc != C.DC_OK {
		return rc
	}
	n, kvs, rc := spanArgs("dc_trace_span_start", name, nameLen, attrs, attrsLen)
	if rc != C.DC_OK {
		return rc
	}
	if s := tracing.StartChild(c, n, kvs...); s != nil {
		*out = C.uint64_t(spans.Insert(s))
	}
	return C.DC_OK
}

// dc_trace_span_event: see dynamo_ctx.h, the reference.
//
//export dc_trace_span_event
func dc_trace_span_event(h C.uint64_t, name *C.char, nameLen C.size_t, attrs *C.char, attrsLen C.size_t) (rc C.int) {
	defer guard("dc_trace_span_event", &rc)
	s, rc := get(spans, "dc_trace_span_event", h)
	if rc != C.DC_OK {
		return rc
	}
	return addEvent("dc_trace_span_event", s, name, nameLen, attrs, attrsLen)
}

// addEvent adds the event of a dc_trace_*_event call to s (nil: none).
func addEvent(fn string, s *tracing.Span, name *C.char, nameLen C.size_t, attrs *C.char, attrsLen C.size_t) C.int {
	n, kvs, rc := spanArgs(fn, name, nameLen, attrs, attrsLen)
	if rc != C.DC_OK {
		return rc
	}
	s.Event(n, kvs...)
	return C.DC_OK
}

// dc_trace_span_end: see dynamo_ctx.h, the reference.
//
//export dc_trace_span_end
func dc_trace_span_end(h C.uint64_t, attrs *C.char, attrsLen C.size_t, failed C.int) (rc C.int) {
	defer guard("dc_trace_span_end", &rc)
	_, kvs, rc := spanArgs("dc_trace_span_end", nil, 0, attrs, attrsLen)
	if rc != C.DC_OK {
		return rc
	}
	s, err := spans.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_trace_span_end: %v", err)
	}
	if failed != 0 {
		s.Fail("failed")
	}
	s.End(kvs...)
	return C.DC_OK
}

// dc_trace_context_event: see dynamo_ctx.h, the reference.
//
//export dc_trace_context_event
func dc_trace_context_event(ctx C.uint64_t, name *C.char, nameLen C.size_t, attrs *C.char, attrsLen C.size_t) (rc C.int) {
	defer guard("dc_trace_context_event", &rc)
	c, rc := get(contexts, "dc_trace_context_event", ctx)
	if rc != C.DC_OK {
		return rc
	}
	return addEvent("dc_trace_context_event", tracing.Of(c), name, nameLen, attrs, attrsLen)
}
