package main

// The exports of the caller's side of the request plane: clients and the
// response streams their requests return (plane_exports.go has the error
// map and the serving side).

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"context"
	"errors"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// dc_client_new: see dynamo_ctx.h, the reference.
//
//export dc_client_new
func dc_client_new(rtH C.uint64_t, path *C.char, pathLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_client_new", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	if out == nil || path == nil {
		return fail(C.DC_EINVAL, "dc_client_new: path and out must not be NULL")
	}
	rt, rc := get(runtimes, "dc_client_new", rtH)
	if rc != C.DC_OK {
		return rc
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	cl, err := rt.Client(ctx, string(goBytes(path, pathLen)))
	if err != nil {
		return planeError("dc_client_new", err)
	}
	*out = C.uint64_t(clients.Insert(cl))
	return C.DC_OK
}

// dc_client_instances: see dynamo_ctx.h, the reference.
//
//export dc_client_instances
func dc_client_instances(h C.uint64_t, buf *C.uint64_t, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_client_instances", &rc)
	if n == nil {
		return fail(C.DC_EINVAL, "dc_client_instances: n must not be NULL")
	}
	cl, rc := get(clients, "dc_client_instances", h)
	if rc != C.DC_OK {
		return rc
	}
	ids := cl.InstanceIDs()
	*n = C.size_t(len(ids))
	if uint64(bufLen) < uint64(len(ids)) || (len(ids) > 0 && buf == nil) {
		return fail(C.DC_ERANGE, "dc_client_instances: room for %d ids, %d known", bufLen, len(ids))
	}
	if len(ids) > 0 {
		copy(unsafe.Slice((*uint64)(unsafe.Pointer(buf)), len(ids)), ids)
	}
	return C.DC_OK
}

// dc_client_generate: see dynamo_ctx.h, the reference.
//
//export dc_client_generate
func dc_client_generate(h C.uint64_t, payload *C.char, payloadLen C.size_t, ctxH C.uint64_t, route C.int, instance C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_client_generate", &rc)
	return clientGenerate("dc_client_generate", h, goBytes(payload, payloadLen), nil, ctxH, route, instance, out)
}

// dc_client_generate_metadata: see dynamo_ctx.h, the reference.
//
//export dc_client_generate_metadata
func dc_client_generate_metadata(h C.uint64_t, payload *C.char, payloadLen C.size_t, meta *C.char, metaLen C.size_t, ctxH C.uint64_t, route C.int, instance C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_client_generate_metadata", &rc)
	return clientGenerate("dc_client_generate_metadata", h, goBytes(payload, payloadLen), goBytes(meta, metaLen), ctxH, route, instance, out)
}

func clientGenerate(name string, h C.uint64_t, payload, meta []byte, ctxH C.uint64_t, route C.int, instance C.uint64_t, out *C.uint64_t) C.int {
	if out == nil {
		return fail(C.DC_EINVAL, "%s: out must not be NULL", name)
	}
	if route < C.DC_ROUTE_ROUND_ROBIN || route > C.DC_ROUTE_DIRECT {
		return fail(C.DC_EINVAL, "%s: route must be 0, 1 or 2, got %d", name, route)
	}
	cl, rc := get(clients, name, h)
	if rc != C.DC_OK {
		return rc
	}
	var parent *ctxtree.Context
	if ctxH != 0 {
		p, rc := get(contexts, name, ctxH)
		if rc != C.DC_OK {
			return rc
		}
		parent = p
	}
	s, err := cl.Generate(payload, parent, plane.Route(route), uint64(instance), plane.WithMetadata(meta))
	if err != nil {
		return planeError(name, err)
	}
	*out = C.uint64_t(streams.Insert(plane.NewBatch(s)))
	return C.DC_OK
}

// dc_client_set_migration_limit: see dynamo_ctx.h, the reference.
//
//export dc_client_set_migration_limit
func dc_client_set_migration_limit(h C.uint64_t, limit C.int) (rc C.int) {
	defer guard("dc_client_set_migration_limit", &rc)
	cl, rc := get(clients, "dc_client_set_migration_limit", h)
	if rc != C.DC_OK {
		return rc
	}
	if err := cl.SetMigrationLimit(int(limit)); err != nil {
		return planeError("dc_client_set_migration_limit", err)
	}
	return C.DC_OK
}

// dc_client_free: see dynamo_ctx.h, the reference.
//
//export dc_client_free
func dc_client_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_client_free", &rc)
	cl, err := clients.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_client_free: %v", err)
	}
	cl.Close()
	return C.DC_OK
}

// dc_stream_started: see dynamo_ctx.h, the reference.
//
//export dc_stream_started
func dc_stream_started(h C.uint64_t) (rc C.int) {
	defer guard("dc_stream_started", &rc)
	e, rc := get(streams, "dc_stream_started", h)
	if rc != C.DC_OK {
		return rc
	}
	if err := e.Stream().Started(); err != nil {
		return planeError("dc_stream_started", err)
	}
	return C.DC_OK
}

// dc_stream_take: see dynamo_ctx.h, the reference.
//
//export dc_stream_take
func dc_stream_take(h C.uint64_t, buf *C.char, bufLen C.size_t, used *C.size_t, count *C.size_t) (rc C.int) {
	defer guard("dc_stream_take", &rc)
	if used == nil || count == nil || (buf == nil && bufLen > 0) {
		return fail(C.DC_EINVAL, "dc_stream_take: NULL pointer")
	}
	e, rc := get(streams, "dc_stream_take", h)
	if rc != C.DC_OK {
		return rc
	}
	var dst []byte
	if bufLen > 0 {
		dst = unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(bufLen))
	}
	u, k, err := e.TakeInto(dst)
	*used, *count = C.size_t(u), C.size_t(k)
	if errors.Is(err, plane.ErrShortBuffer) {
		return fail(C.DC_ERANGE, "dc_stream_take: the next item needs %d bytes", u)
	}
	if err != nil {
		return planeError("dc_stream_take", err)
	}
	return C.DC_OK
}

// dc_stream_context: see dynamo_ctx.h, the reference.
//
//export dc_stream_context
func dc_stream_context(h C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_stream_context", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_stream_context: out must not be NULL")
	}
	e, rc := get(streams, "dc_stream_context", h)
	if rc != C.DC_OK {
		return rc
	}
	putContext(e.Stream().Context(), out)
	return C.DC_OK
}

// dc_stream_kill: see dynamo_ctx.h, the reference.
//
//export dc_stream_kill
func dc_stream_kill(h C.uint64_t) (rc C.int) {
	defer guard("dc_stream_kill", &rc)
	e, rc := get(streams, "dc_stream_kill", h)
	if rc != C.DC_OK {
		return rc
	}
	e.Stream().Kill()
	return C.DC_OK
}

// dc_stream_killed: see dynamo_ctx.h, the reference.
//
//export dc_stream_killed
func dc_stream_killed(h C.uint64_t, out *C.int) (rc C.int) {
	defer guard("dc_stream_killed", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_stream_killed: out must not be NULL")
	}
	e, rc := get(streams, "dc_stream_killed", h)
	if rc != C.DC_OK {
		return rc
	}
	*out = 0
	if e.Stream().Killed() {
		*out = 1
	}
	return C.DC_OK
}

// dc_stream_free: see dynamo_ctx.h, the reference.
//
//export dc_stream_free
func dc_stream_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_stream_free", &rc)
	e, err := streams.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_stream_free: %v", err)
	}
	if s := e.Stream(); !s.Finished() {
		s.Kill()
	}
	return C.DC_OK
}
