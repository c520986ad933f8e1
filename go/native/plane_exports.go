package main

// The exports of the request plane's serving side: runtimes, endpoints and
// the requests a handler serves, with what every plane export shares
// (planeError, connectTimeout) and dc_arm, the readiness of any plane
// object. client_exports.go has the caller's side.

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

	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/handle"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

const connectTimeout = 15 * time.Second

// planeError maps an error of the plane to a code and records its message.
func planeError(name string, err error) C.int {
	var he *plane.HandlerError
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
	case errors.Is(err, plane.ErrNotJSON), errors.Is(err, plane.ErrBadMetadata), errors.Is(err, discovery.ErrBadPath),
		errors.Is(err, plane.ErrInvalidID), errors.Is(err, plane.ErrBadMigrationLimit):
		return fail(C.DC_EINVAL, "%s: %v", name, err)
	}
	return fail(C.DC_EIO, "%s: %v", name, err)
}

// dc_runtime_new: see dynamo_ctx.h, the reference.
//
//export dc_runtime_new
func dc_runtime_new(url *C.char, urlLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_new", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	if out == nil {
		return fail(C.DC_EINVAL, "dc_runtime_new: out must not be NULL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	rt, err := plane.New(ctx, plane.Options{
		NATS:         plane.NATSOptions{URL: string(goBytes(url, urlLen))},
		NewContext:   newContext,
		Continuation: func() plane.Continuation { return tokens.New() },
	})
	if err != nil {
		return fail(C.DC_ECONNECT, "dc_runtime_new: %v", err)
	}
	traceRuntime(rt) // trace_exports.go
	*out = C.uint64_t(runtimes.Insert(rt))
	return C.DC_OK
}

// dc_runtime_shutdown: see dynamo_ctx.h, the reference.
//
//export dc_runtime_shutdown
func dc_runtime_shutdown(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_shutdown", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	rt, rc := get(runtimes, "dc_runtime_shutdown", h)
	if rc != C.DC_OK {
		return rc
	}
	closeRuntime(rt) // trace_exports.go
	return C.DC_OK
}

// dc_runtime_drain: see dynamo_ctx.h, the reference.
//
//export dc_runtime_drain
func dc_runtime_drain(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_drain", &rc)
	rt, rc := get(runtimes, "dc_runtime_drain", h)
	if rc != C.DC_OK {
		return rc
	}
	if rt.IsClosed() {
		return fail(C.DC_ECLOSED, "dc_runtime_drain: the runtime is shut down")
	}
	rt.Drain()
	return C.DC_OK
}

// dc_runtime_host_tick: see dynamo_ctx.h, the reference.
//
//export dc_runtime_host_tick
func dc_runtime_host_tick(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_host_tick", &rc)
	drainPosted() // in order with the posted ticks (posted.go)
	rt, rc := get(runtimes, "dc_runtime_host_tick", h)
	if rc != C.DC_OK {
		return rc
	}
	rt.HostTick()
	flushEngineReaders()
	return C.DC_OK
}

// dc_runtime_active: see dynamo_ctx.h, the reference.
//
//export dc_runtime_active
func dc_runtime_active(h C.uint64_t, n *C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_active", &rc)
	if n == nil {
		return fail(C.DC_EINVAL, "dc_runtime_active: n must not be NULL")
	}
	rt, rc := get(runtimes, "dc_runtime_active", h)
	if rc != C.DC_OK {
		return rc
	}
	*n = C.uint64_t(rt.Active())
	return C.DC_OK
}

// dc_runtime_free: see dynamo_ctx.h, the reference.
//
//export dc_runtime_free
func dc_runtime_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_free", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	rt, err := runtimes.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_runtime_free: %v", err)
	}
	closeRuntime(rt) // trace_exports.go
	return C.DC_OK
}

// dc_runtime_nats_url: see dynamo_ctx.h, the reference.
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

// dc_endpoint_path_check: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_path_check
func dc_endpoint_path_check(path *C.char, pathLen C.size_t) (rc C.int) {
	defer guard("dc_endpoint_path_check", &rc)
	if err := discovery.ValidatePath(string(goBytes(path, pathLen))); err != nil {
		return fail(C.DC_EINVAL, "%v", err)
	}
	return C.DC_OK
}

// dc_endpoint_name_check: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_name_check
func dc_endpoint_name_check(name *C.char, nameLen C.size_t) (rc C.int) {
	defer guard("dc_endpoint_name_check", &rc)
	if err := discovery.ValidateName(string(goBytes(name, nameLen))); err != nil {
		return fail(C.DC_EINVAL, "%v", err)
	}
	return C.DC_OK
}

// dc_endpoint_serve: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_serve
func dc_endpoint_serve(rtH C.uint64_t, path *C.char, pathLen C.size_t, meta *C.char, metaLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_serve", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	if out == nil || path == nil {
		return fail(C.DC_EINVAL, "dc_endpoint_serve: path and out must not be NULL")
	}
	rt, rc := get(runtimes, "dc_endpoint_serve", rtH)
	if rc != C.DC_OK {
		return rc
	}
	ep, err := rt.Serve(string(goBytes(path, pathLen)), goBytes(meta, metaLen), plane.WithCapacity(capacityOf(goBytes(meta, metaLen))))
	if err != nil {
		return planeError("dc_endpoint_serve", err)
	}
	*out = C.uint64_t(endpoints.Insert(ep))
	return C.DC_OK
}

// capacityOf is the capacity of an endpoint served with metadata meta: a
// model card's max_num_seqs (the figure frontends admit requests by), past
// which the endpoint refuses requests as busy; none for other metadata, nor
// for a prefill worker, whose callers (decode workers) do not queue for a
// place: its engine queues what is past it.
func capacityOf(meta []byte) int {
	card, _ := modelcard.Parse(meta)
	if card.Mode == modelcard.Prefill {
		return 0
	}
	return card.MaxNumSeqs
}

// dc_endpoint_instance_id: see dynamo_ctx.h, the reference.
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

// dc_endpoint_accept: see dynamo_ctx.h, the reference.
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

// dc_endpoint_free: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_free
func dc_endpoint_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_free", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	ep, err := endpoints.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_endpoint_free: %v", err)
	}
	ep.Close()
	return C.DC_OK
}

// dc_request_payload: see dynamo_ctx.h, the reference.
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

// dc_request_metadata: see dynamo_ctx.h, the reference.
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

// dc_request_context: see dynamo_ctx.h, the reference.
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

// dc_request_send: see dynamo_ctx.h, the reference.
//
//export dc_request_send
func dc_request_send(h C.uint64_t, data *C.char, dataLen C.size_t) (rc C.int) {
	defer guard("dc_request_send", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	req, rc := get(requests, "dc_request_send", h)
	if rc != C.DC_OK {
		return rc
	}
	if err := req.Send(goBytes(data, dataLen)); err != nil {
		return planeError("dc_request_send", err)
	}
	return C.DC_OK
}

// dc_request_send_many: see dynamo_ctx.h, the reference.
//
//export dc_request_send_many
func dc_request_send_many(h C.uint64_t, items **C.char, lens *C.size_t, count C.size_t, sent *C.size_t) (rc C.int) {
	defer guard("dc_request_send_many", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	if sent == nil || (count > 0 && (items == nil || lens == nil)) {
		return fail(C.DC_EINVAL, "dc_request_send_many: items, lens and sent must not be NULL")
	}
	*sent = 0
	n, rc := sendMany("dc_request_send_many", h, items, lens, 0, count, nil)
	*sent = C.size_t(n)
	return rc
}

// sendMany queues the count items of the C arrays items and lens from
// element off on (item i is lens[i] bytes at items[i]) for request h: how
// many were taken, and the code (DC_EAGAIN when fewer than all; DC_EINVAL
// for more than DC_SEND_MANY_MAX items, the bound of one request's items in
// one call).
func sendMany(name string, h C.uint64_t, items **C.char, lens *C.size_t, off uintptr, count C.size_t, b *transport.Batch) (int, C.int) {
	if count > maxSendMany {
		return 0, fail(C.DC_EINVAL, "%s: %d items for request %#x, at most %d", name, count, uint64(h), maxSendMany)
	}
	ptrs, ns := cArray(items, off, count), cArray(lens, off, count)
	req, rc := get(requests, name, h)
	if rc != C.DC_OK {
		return 0, rc
	}
	batch := make([][]byte, len(ptrs))
	for i := range batch {
		if ptrs[i] == nil && ns[i] > 0 {
			return 0, fail(C.DC_EINVAL, "%s: item %d is NULL", name, i)
		}
		batch[i] = goBytes(ptrs[i], ns[i])
	}
	n, err := req.SendManyIn(batch, b)
	if err != nil {
		return n, planeError(name, err)
	}
	return n, C.DC_OK
}

// The bounds of one call (dynamo_ctx.h: DC_SEND_MANY_MAX and the two
// DC_SEND_MULTI_MAX_*): far above what a turn of a worker's loop hands over
// (the send buffer holds fewer items; the rest is refused with DC_EAGAIN
// anyway), so that they only refuse counts that cannot be real.
const (
	maxSendMany       = C.DC_SEND_MANY_MAX
	maxSendMulti      = C.DC_SEND_MULTI_MAX_REQUESTS
	maxSendMultiItems = C.DC_SEND_MULTI_MAX_ITEMS
)

// dc_request_send_multi: see dynamo_ctx.h, the reference.
//
//export dc_request_send_multi
func dc_request_send_multi(hs *C.uint64_t, counts *C.size_t, n C.size_t, items **C.char, lens *C.size_t, sent *C.size_t, rcs *C.int) (rc C.int) {
	defer guard("dc_request_send_multi", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	if n == 0 {
		return C.DC_OK
	}
	if hs == nil || counts == nil || sent == nil || rcs == nil {
		return fail(C.DC_EINVAL, "dc_request_send_multi: hs, counts, sent and rcs must not be NULL")
	}
	if n > maxSendMulti {
		return fail(C.DC_EINVAL, "dc_request_send_multi: %d requests, at most %d per call", n, maxSendMulti)
	}
	handles, cs := unsafe.Slice(hs, int(n)), unsafe.Slice(counts, int(n))
	// A request of more items than dc_request_send_many takes is refused on
	// its own, below; the call's bound counts the items of the others.
	var all, total uint64
	for _, c := range cs {
		if all += uint64(c); all < uint64(c) {
			return fail(C.DC_EINVAL, "dc_request_send_multi: the counts overflow")
		}
		if c > maxSendMany {
			continue
		}
		if total += uint64(c); total > maxSendMultiItems {
			return fail(C.DC_EINVAL, "dc_request_send_multi: more than %d items in one call", maxSendMultiItems)
		}
	}
	if all > 0 && (items == nil || lens == nil) {
		return fail(C.DC_EINVAL, "dc_request_send_multi: items and lens must not be NULL")
	}
	outN, outRC := unsafe.Slice(sent, int(n)), unsafe.Slice(rcs, int(n))
	var off uintptr
	// The requests' items are written once per caller's session, after
	// the last request's: one write for a whole engine step's items.
	var b transport.Batch
	defer b.Flush() // what was queued before a panic
	for i, h := range handles {
		taken, code := sendMany("dc_request_send_multi", h, items, lens, off, cs[i], &b)
		outN[i], outRC[i] = C.size_t(taken), code
		off += uintptr(cs[i])
	}
	b.Flush()
	renewHostTick(hostNow()) // the items are out: see hostyield.go
	return C.DC_OK
}

// cArray is the n elements of the C array p from its element off on (nil
// for none).
func cArray[T any](p *T, off uintptr, n C.size_t) []T {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Add(unsafe.Pointer(p), off*unsafe.Sizeof(*p))), int(n))
}

// dc_request_complete: see dynamo_ctx.h, the reference.
//
//export dc_request_complete
func dc_request_complete(h C.uint64_t) (rc C.int) {
	defer guard("dc_request_complete", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	req, rc := get(requests, "dc_request_complete", h)
	if rc != C.DC_OK {
		return rc
	}
	req.Complete()
	return C.DC_OK
}

// dc_request_fail: see dynamo_ctx.h, the reference.
//
//export dc_request_fail
func dc_request_fail(h C.uint64_t, msg *C.char, msgLen C.size_t) (rc C.int) {
	defer guard("dc_request_fail", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	req, rc := get(requests, "dc_request_fail", h)
	if rc != C.DC_OK {
		return rc
	}
	req.Fail(string(goBytes(msg, msgLen)))
	return C.DC_OK
}

// dc_request_free: see dynamo_ctx.h, the reference.
//
//export dc_request_free
func dc_request_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_request_free", &rc)
	drainPosted() // what the host posted before this call comes first (posted.go)
	req, err := requests.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_request_free: %v", err)
	}
	req.Fail("RuntimeError: the handler abandoned the request")
	return C.DC_OK
}

// dc_arm: see dynamo_ctx.h, the reference.
//
//export dc_arm
func dc_arm(h C.uint64_t, q C.uint64_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_arm", &rc)
	eq, rc := get(queues, "dc_arm", q)
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
	case kindStatus:
		sl, rc := get(statuses, "dc_arm", h)
		if rc != C.DC_OK {
			return rc
		}
		sl.Arm(push)
	default:
		return fail(C.DC_EBADF, "dc_arm: handle %#x is not an endpoint, request, client, stream or status listener", uint64(h))
	}
	return C.DC_OK
}
