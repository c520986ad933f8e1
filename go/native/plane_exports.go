package main

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
	"io"
	"time"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/handle"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/stream"
)

const (
	kindRuntime  handle.Kind = 3
	kindEndpoint handle.Kind = 4
	kindRequest  handle.Kind = 5
	kindClient   handle.Kind = 6
	kindStream   handle.Kind = 7

	connectTimeout = 15 * time.Second
)

var (
	runtimes  = handle.NewTable[*plane.Runtime](kindRuntime)
	endpoints = handle.NewTable[*plane.Endpoint](kindEndpoint)
	requests  = handle.NewTable[*plane.Request](kindRequest)
	clients   = handle.NewTable[*plane.Client](kindClient)
	streams   = handle.NewTable[*plane.Batch](kindStream)
)

// The C route codes are plane's (compile-time check, as for the reasons).
var (
	_ = [1]int{}[plane.RoundRobin-C.DC_ROUTE_ROUND_ROBIN]
	_ = [1]int{}[plane.Random-C.DC_ROUTE_RANDOM]
	_ = [1]int{}[plane.Direct-C.DC_ROUTE_DIRECT]
	_ = [1]int{}[C.DC_ROUTE_DIRECT-plane.Direct]
)

func get[T any](t *handle.Table[T], name string, h C.uint64_t) (T, C.int) {
	v, err := t.Get(uint64(h))
	if err != nil {
		return v, fail(C.DC_EBADF, "%s: %v", name, err)
	}
	return v, C.DC_OK
}

func goBytes(p *C.char, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return C.GoBytes(unsafe.Pointer(p), C.int(n))
}

// planeError maps an error of the plane to a code and records its message.
func planeError(name string, err error) C.int {
	var he *stream.HandlerError
	switch {
	case errors.Is(err, io.EOF):
		return fail(C.DC_EOF, "%s: end of stream", name)
	case errors.Is(err, plane.ErrAgain), errors.Is(err, plane.ErrFull):
		return fail(C.DC_EAGAIN, "%s: %v", name, err)
	case errors.As(err, &he):
		return fail(C.DC_EHANDLER, "%s", he.Message)
	case errors.Is(err, plane.ErrIncomplete):
		return fail(C.DC_EINCOMPLETE, "%v", err)
	case errors.Is(err, plane.ErrNoResponders):
		return fail(C.DC_ENORESPONDERS, "%v", err)
	case errors.Is(err, plane.ErrClosed):
		return fail(C.DC_ECLOSED, "%s: %v", name, err)
	case errors.Is(err, plane.ErrNotJSON), errors.Is(err, plane.ErrBadMetadata), errors.Is(err, discovery.ErrBadPath):
		return fail(C.DC_EINVAL, "%s: %v", name, err)
	}
	return fail(C.DC_EIO, "%s: %v", name, err)
}

// Connects to the request plane and stores a runtime handle in *out. url
// (urlLen bytes; NULL or empty for the default) is a NATS address; by default
// the NATS_SERVER environment variable or nats://127.0.0.1:4222, where an
// in-process server is started if nothing answers. Blocks while connecting
// (at most about 15 s). Errors: DC_EINVAL, DC_ECONNECT.
//
//export dc_runtime_new
func dc_runtime_new(url *C.char, urlLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_new", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_runtime_new: out must not be NULL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	rt, err := plane.New(ctx, plane.Options{
		NATS:       natsbus.Options{URL: string(goBytes(url, urlLen))},
		NewContext: newContext,
	})
	if err != nil {
		return fail(C.DC_ECONNECT, "dc_runtime_new: %v", err)
	}
	*out = C.uint64_t(runtimes.Insert(rt))
	return C.DC_OK
}

// Shuts the runtime down: requests being served are killed (reason
// shutdown), instances leave discovery, streams end. The handle stays valid
// (calls on it fail with DC_ECLOSED) until dc_runtime_free. Idempotent.
//
//export dc_runtime_shutdown
func dc_runtime_shutdown(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_shutdown", &rc)
	rt, rc := get(runtimes, "dc_runtime_shutdown", h)
	if rc != C.DC_OK {
		return rc
	}
	rt.Close()
	return C.DC_OK
}

// Shuts the runtime down (as dc_runtime_shutdown) and frees its handle.
//
//export dc_runtime_free
func dc_runtime_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_free", &rc)
	rt, err := runtimes.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_runtime_free: %v", err)
	}
	rt.Close()
	return C.DC_OK
}

// Copies the runtime's NATS URL into buf, as dc_context_id does.
//
//export dc_runtime_nats_url
func dc_runtime_nats_url(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_runtime_nats_url", &rc)
	rt, rc := get(runtimes, "dc_runtime_nats_url", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_runtime_nats_url", rt.Bus().URL(), buf, bufLen, n)
}

// Checks an endpoint path (discovery.ValidatePath, the one rule).
// Errors: DC_EINVAL.
//
//export dc_endpoint_path_check
func dc_endpoint_path_check(path *C.char, pathLen C.size_t) (rc C.int) {
	defer guard("dc_endpoint_path_check", &rc)
	if err := discovery.ValidatePath(string(goBytes(path, pathLen))); err != nil {
		return fail(C.DC_EINVAL, "%v", err)
	}
	return C.DC_OK
}

// Checks one part of an endpoint path (discovery.ValidateName).
// Errors: DC_EINVAL.
//
//export dc_endpoint_name_check
func dc_endpoint_name_check(name *C.char, nameLen C.size_t) (rc C.int) {
	defer guard("dc_endpoint_name_check", &rc)
	if err := discovery.ValidateName(string(goBytes(name, nameLen))); err != nil {
		return fail(C.DC_EINVAL, "%v", err)
	}
	return C.DC_OK
}

// Serves a new instance of the endpoint path ("namespace.component.endpoint")
// and stores its handle in *out. meta (may be NULL) is published with the
// instance. Errors: DC_EBADF, DC_EINVAL (bad path), DC_ECLOSED.
//
//export dc_endpoint_serve
func dc_endpoint_serve(rtH C.uint64_t, path *C.char, pathLen C.size_t, meta *C.char, metaLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_serve", &rc)
	if out == nil || path == nil {
		return fail(C.DC_EINVAL, "dc_endpoint_serve: path and out must not be NULL")
	}
	rt, rc := get(runtimes, "dc_endpoint_serve", rtH)
	if rc != C.DC_OK {
		return rc
	}
	ep, err := rt.Serve(string(goBytes(path, pathLen)), goBytes(meta, metaLen))
	if err != nil {
		return planeError("dc_endpoint_serve", err)
	}
	*out = C.uint64_t(endpoints.Insert(ep))
	return C.DC_OK
}

// Stores the endpoint instance's id in *out.
//
//export dc_endpoint_instance_id
func dc_endpoint_instance_id(h C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_instance_id", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_endpoint_instance_id: out must not be NULL")
	}
	ep, rc := get(endpoints, "dc_endpoint_instance_id", h)
	if rc != C.DC_OK {
		return rc
	}
	*out = C.uint64_t(ep.InstanceID())
	return C.DC_OK
}

// Takes the oldest request waiting for a handler and stores its handle in
// *out. Errors: DC_EAGAIN (none waiting: dc_arm the endpoint), DC_ECLOSED
// (the endpoint was closed), DC_EBADF.
//
//export dc_endpoint_accept
func dc_endpoint_accept(h C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_accept", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_endpoint_accept: out must not be NULL")
	}
	ep, rc := get(endpoints, "dc_endpoint_accept", h)
	if rc != C.DC_OK {
		return rc
	}
	req, err := ep.Accept()
	if err != nil {
		return planeError("dc_endpoint_accept", err)
	}
	*out = C.uint64_t(requests.Insert(req))
	return C.DC_OK
}

// Stops serving: the instance leaves discovery and requests being served are
// killed (reason shutdown); frees the handle.
//
//export dc_endpoint_free
func dc_endpoint_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_free", &rc)
	ep, err := endpoints.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_endpoint_free: %v", err)
	}
	ep.Close()
	return C.DC_OK
}

// Copies the request's payload (a JSON value) into buf, as dc_context_id does.
//
//export dc_request_payload
func dc_request_payload(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_request_payload", &rc)
	req, rc := get(requests, "dc_request_payload", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_request_payload", string(req.Payload), buf, bufLen, n)
}

// Copies the request's metadata (a JSON object, or nothing: *n = 0 when the
// caller sent none) into buf, as dc_context_id does.
//
//export dc_request_metadata
func dc_request_metadata(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_request_metadata", &rc)
	req, rc := get(requests, "dc_request_metadata", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_request_metadata", string(req.Metadata), buf, bufLen, n)
}

// Stores in *out a new context handle for the request's context (the
// handler's context: it has the caller's id and follows the caller's stop and
// kill). Free it with dc_context_free.
//
//export dc_request_context
func dc_request_context(h C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_request_context", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_request_context: out must not be NULL")
	}
	req, rc := get(requests, "dc_request_context", h)
	if rc != C.DC_OK {
		return rc
	}
	putContext(req.Ctx, out)
	return C.DC_OK
}

// Queues one response item (len bytes of JSON) for the caller; never blocks.
// Errors: DC_EAGAIN when the buffer is full (dc_arm the request, then retry),
// DC_EINVAL when data is not JSON. After a kill, items are dropped silently.
//
//export dc_request_send
func dc_request_send(h C.uint64_t, data *C.char, dataLen C.size_t) (rc C.int) {
	defer guard("dc_request_send", &rc)
	req, rc := get(requests, "dc_request_send", h)
	if rc != C.DC_OK {
		return rc
	}
	if err := req.Send(goBytes(data, dataLen)); err != nil {
		return planeError("dc_request_send", err)
	}
	return C.DC_OK
}

// Ends the request normally: queued items, then the final marker (unless the
// handler stopped its own context: then the caller sees an incomplete
// stream).
//
//export dc_request_complete
func dc_request_complete(h C.uint64_t) (rc C.int) {
	defer guard("dc_request_complete", &rc)
	req, rc := get(requests, "dc_request_complete", h)
	if rc != C.DC_OK {
		return rc
	}
	req.Complete()
	return C.DC_OK
}

// Ends the request with a handler error; msg is "<Type>: <message>".
//
//export dc_request_fail
func dc_request_fail(h C.uint64_t, msg *C.char, msgLen C.size_t) (rc C.int) {
	defer guard("dc_request_fail", &rc)
	req, rc := get(requests, "dc_request_fail", h)
	if rc != C.DC_OK {
		return rc
	}
	req.Fail(string(goBytes(msg, msgLen)))
	return C.DC_OK
}

// Frees a request handle; a request neither completed nor failed is failed.
//
//export dc_request_free
func dc_request_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_request_free", &rc)
	req, err := requests.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_request_free: %v", err)
	}
	req.Fail("RuntimeError: the handler abandoned the request")
	return C.DC_OK
}

// Creates a client of the endpoint path and stores its handle in *out. Blocks
// briefly (about 100 ms) to learn the current instances.
//
//export dc_client_new
func dc_client_new(rtH C.uint64_t, path *C.char, pathLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_client_new", &rc)
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

// Copies the ids of the instances the client knows into buf (up to cap) and
// stores their number in *n. Errors: DC_ERANGE if cap < *n.
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

// Sends a request (payload: len bytes of JSON) and stores the response
// stream's handle in *out without waiting. ctx (0 for none) is the caller's
// context: the request gets a child of it (same id, linked before sending);
// route is 0 round robin, 1 random, 2 direct to instance. Errors: DC_EBADF,
// DC_EINVAL (not JSON, bad route), DC_ECLOSED; failures to reach a worker are
// reported by the stream.
//
//export dc_client_generate
func dc_client_generate(h C.uint64_t, payload *C.char, payloadLen C.size_t, ctxH C.uint64_t, route C.int, instance C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_client_generate", &rc)
	return clientGenerate("dc_client_generate", h, goBytes(payload, payloadLen), nil, ctxH, route, instance, out)
}

// dc_client_generate with request metadata: metaLen bytes at meta, a JSON
// object of at most 16 KiB (metaLen 0: none), which the handler's side reads
// with dc_request_metadata. Errors: those of dc_client_generate; DC_EINVAL
// for metadata that is not a JSON object or is too large.
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
		p, rc := getContext(name, ctxH)
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

// Sets how many times the client's requests are retried on another worker
// when their stream breaks (migration; 0, the default, means never).
// Errors: DC_EBADF, DC_EINVAL for a negative limit.
//
//export dc_client_set_migration_limit
func dc_client_set_migration_limit(h C.uint64_t, limit C.int) (rc C.int) {
	defer guard("dc_client_set_migration_limit", &rc)
	if limit < 0 {
		return fail(C.DC_EINVAL, "dc_client_set_migration_limit: limit must be >= 0, got %d", limit)
	}
	cl, rc := get(clients, "dc_client_set_migration_limit", h)
	if rc != C.DC_OK {
		return rc
	}
	cl.SetMigrationLimit(int(limit))
	return C.DC_OK
}

// Stops watching instances and frees the client handle.
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

// Reports whether the stream's request reached a worker: DC_OK once it did,
// DC_EAGAIN while in flight (dc_arm the stream), or the error that ended it
// (DC_ENORESPONDERS, ...).
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

// Moves as many whole items as fit into buf, each as a 4-byte little-endian
// length followed by that many bytes of JSON, and stores the bytes used in
// *used and the item count in *count. With no item ready it returns
// DC_EAGAIN (dc_arm the stream), DC_EOF at the normal end, or the stream's
// error (DC_EHANDLER, DC_EINCOMPLETE, DC_ENORESPONDERS, ...). If the first
// item does not fit: DC_ERANGE with the size needed in *used. Once the
// request's context or the caller's context it was made for is killed, no
// item is returned (DC_EOF, or the error that had ended the stream): a kill
// is a hard abort, whatever was buffered is dropped.
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

// Stores in *out a new context handle for the stream's request context (a
// child of the caller's context, with the same id).
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

// Kills the stream's request (the worker's handler context is killed) and
// ends the stream. Idempotent.
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

// Frees a stream handle, killing the request if the stream has not ended.
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

// Pushes token onto queue q once the object h may have progressed: an
// endpoint has a request to accept (or closed), a request's send buffer has
// room, a client knows an instance, a stream has items, started or ended.
// At once if that is already so. One pending arm per object: a second
// replaces the first. Errors: DC_EBADF for either handle or a handle of
// another kind.
//
//export dc_arm
func dc_arm(h C.uint64_t, q C.uint64_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_arm", &rc)
	eq, rc := getQueue("dc_arm", q)
	if rc != C.DC_OK {
		return rc
	}
	tok := uint64(token)
	push := func() { _ = eq.Push(tok) }
	switch handle.KindOf(uint64(h)) {
	case kindEndpoint:
		ep, rc := get(endpoints, "dc_arm", h)
		if rc != C.DC_OK {
			return rc
		}
		ep.Arm(push)
	case kindRequest:
		req, rc := get(requests, "dc_arm", h)
		if rc != C.DC_OK {
			return rc
		}
		req.Arm(push)
	case kindClient:
		cl, rc := get(clients, "dc_arm", h)
		if rc != C.DC_OK {
			return rc
		}
		cl.ArmInstances(push)
	case kindStream:
		st, rc := get(streams, "dc_arm", h)
		if rc != C.DC_OK {
			return rc
		}
		st.Arm(push)
	default:
		return fail(C.DC_EBADF, "dc_arm: handle %#x is not an endpoint, request, client or stream", uint64(h))
	}
	return C.DC_OK
}
