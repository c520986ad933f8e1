package main

// What every export shares: guard (no panic crosses into C), fail (the
// calling thread's last error), the conversions of strings and bytes
// between C and Go, and the handle kinds with their tables.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"

// Implemented in errors.c.
void dc_set_error(const char* msg, size_t len);
*/
import "C"

import (
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/handle"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/status"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/wake"
)

// The handle kinds, one per table, all here: a table tells its handles from
// another's by the kind alone (go/handle), so no two tables may share one
// (TestHandleKindsDiffer).
const (
	kindContext handle.Kind = iota + 1
	kindQueue
	kindRuntime
	kindEndpoint
	kindRequest
	kindClient
	kindStream
	kindFrontend
	kindStatus
	kindSpan
	kindEngineOutputs
)

var (
	contexts  = handle.NewTable[*ctxtree.Context](kindContext)
	queues    = handle.NewTable[*wake.EventQueue](kindQueue)
	runtimes  = handle.NewTable[*plane.Runtime](kindRuntime)
	endpoints = handle.NewTable[*plane.Endpoint](kindEndpoint)
	requests  = handle.NewTable[*plane.Request](kindRequest)
	clients   = handle.NewTable[*plane.Client](kindClient)
	streams   = handle.NewTable[*plane.Batch](kindStream)
	frontends = handle.NewTable[*frontend.Frontend](kindFrontend)
	statuses  = handle.NewTable[*status.Server](kindStatus)
	spans     = handle.NewTable[*tracing.Span](kindSpan)
	// engineReaders: engineout_exports.go.
	engineReaders = handle.NewTable[*engineOutputs](kindEngineOutputs)
)

// otherTables are the tables of neither contexts nor queues
// (dc_handle_counts' "other").
var otherTables = []interface {
	Kind() handle.Kind
	Len() int
}{runtimes, endpoints, requests, clients, streams, frontends, statuses, spans, engineReaders}

// fail records msg as the calling thread's last error and returns code.
func fail(code C.int, format string, args ...any) C.int {
	msg := fmt.Sprintf(format, args...)
	if len(msg) == 0 {
		C.dc_set_error(nil, 0)
	} else {
		C.dc_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	return code
}

// guard turns a panic in an exported function into DC_EINTERNAL: nothing may
// unwind across the C boundary.
func guard(name string, rc *C.int) {
	if r := recover(); r != nil {
		slog.Error("recovered panic", "function", name, "panic", fmt.Sprint(r))
		*rc = fail(C.DC_EINTERNAL, "%s: internal error (recovered panic): %v", name, r)
	}
}

// writeString copies s into the caller's buffer with a terminating NUL and
// stores its length (without the NUL) in *n; DC_ERANGE if it does not fit.
func writeString(name, s string, buf *C.char, bufLen C.size_t, n *C.size_t) C.int {
	if n != nil {
		*n = C.size_t(len(s))
	}
	if buf == nil || uint64(bufLen) < uint64(len(s))+1 {
		return fail(C.DC_ERANGE, "%s: buffer of %d bytes is too small for %d bytes and a NUL", name, bufLen, len(s))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(bufLen))
	copy(dst, s)
	dst[len(s)] = 0
	return C.DC_OK
}

// cString is the n bytes at p as a string without copying them: only for
// reading them during the call (nothing may keep it). "" for n == 0.
func cString(p *C.char, n C.size_t) string {
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), int(n))
}

// get resolves h in table t: DC_EBADF, with a message naming the export,
// for a handle that is not one of t's live handles.
func get[T any](t *handle.Table[T], name string, h C.uint64_t) (T, C.int) {
	v, err := t.Get(uint64(h))
	if err != nil {
		return v, fail(C.DC_EBADF, "%s: %v", name, err)
	}
	return v, C.DC_OK
}

// goBytes copies the n bytes at p into Go memory (nil for none).
func goBytes(p *C.char, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return C.GoBytes(unsafe.Pointer(p), C.int(n))
}
