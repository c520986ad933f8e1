package main

// The exports of the library as a whole: its version, the string constants
// Go owns, the calling thread's last error, and the diagnostics (handle
// counts, runtime statistics). The panic self-test is the test library's
// alone (selftest_exports.go).

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"

// Implemented in errors.c.
size_t dc_copy_error(char* buf, size_t cap);
*/
import "C"

import (
	"runtime"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/reasoning"
	"github.com/dynamo-ctx/dynamo-ctx/go/toolcall"
)

var cVersion = C.CString(version) // static for the life of the process

// dc_version: see dynamo_ctx.h, the reference.
//
//export dc_version
func dc_version() *C.char { return cVersion }

// stringConstants are the facts Python needs that Go owns (see
// dc_string_constant): each is written once, in its Go package.
var stringConstants = map[string]string{
	"handler_error_prefix": plane.HandlerErrorPrefix,
	"nats_env":             plane.NATSEnv,
	"nats_default_url":     plane.DefaultNATSURL,
	"kill_trace_env":       killtrace.Env,
	// The request parameters of go/modelcard, comma-separated.
	"base_params":       strings.Join(modelcard.BaseParams, ","),
	"engine_params":     strings.Join(modelcard.EngineParams, ","),
	"tool_call_parsers": strings.Join(toolcall.Names(), ","),
	"reasoning_parsers": strings.Join(reasoning.Names(), ","),
}

// dc_string_constant: see dynamo_ctx.h, the reference.
//
//export dc_string_constant
func dc_string_constant(name *C.char, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_string_constant", &rc)
	if name == nil {
		return fail(C.DC_EINVAL, "dc_string_constant: name is NULL")
	}
	key := C.GoString(name)
	v, ok := stringConstants[key]
	if !ok {
		return fail(C.DC_ENOENT, "dc_string_constant: no constant %q", key)
	}
	return writeString("dc_string_constant", v, buf, bufLen, n)
}

// dc_last_error: see dynamo_ctx.h, the reference.
//
//export dc_last_error
func dc_last_error(buf *C.char, bufLen C.size_t) C.size_t {
	return C.dc_copy_error(buf, bufLen)
}

// dc_handle_counts: see dynamo_ctx.h, the reference.
//
//export dc_handle_counts
func dc_handle_counts(nContexts, nQueues, nOther *C.uint64_t) (rc C.int) {
	defer guard("dc_handle_counts", &rc)
	if nContexts != nil {
		*nContexts = C.uint64_t(contexts.Len())
	}
	if nQueues != nil {
		*nQueues = C.uint64_t(queues.Len())
	}
	if nOther != nil {
		other := 0
		for _, t := range otherTables {
			other += t.Len()
		}
		*nOther = C.uint64_t(other)
	}
	return C.DC_OK
}

// dc_runtime_stats: see dynamo_ctx.h, the reference.
//
//export dc_runtime_stats
func dc_runtime_stats(collect C.int, goroutines, heapBytes *C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_stats", &rc)
	if collect != 0 {
		runtime.GC()
	}
	if goroutines != nil {
		*goroutines = C.uint64_t(runtime.NumGoroutine())
	}
	if heapBytes != nil {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		*heapBytes = C.uint64_t(ms.HeapAlloc)
	}
	return C.DC_OK
}
