package main

// The exports of event queues: making, draining and freeing them, and the
// watches that push a token onto one when a context reaches a state.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/wake"
)

// dc_queue_new: see dynamo_ctx.h, the reference.
//
//export dc_queue_new
func dc_queue_new(out *C.uint64_t, fd *C.int) (rc C.int) {
	defer guard("dc_queue_new", &rc)
	if out == nil || fd == nil {
		return fail(C.DC_EINVAL, "dc_queue_new: out and fd must not be NULL")
	}
	e, err := wake.NewEventQueue()
	if err != nil {
		return fail(C.DC_EIO, "dc_queue_new: %v", err)
	}
	*out = C.uint64_t(queues.Insert(e))
	*fd = C.int(e.Fd())
	return C.DC_OK
}

// dc_queue_drain_after: see dynamo_ctx.h, the reference.
//
//export dc_queue_drain_after
func dc_queue_drain_after(h C.uint64_t, bytes *C.size_t) (rc C.int) {
	defer guard("dc_queue_drain_after", &rc)
	if bytes == nil {
		return fail(C.DC_EINVAL, "dc_queue_drain_after: bytes must not be NULL")
	}
	e, rc := get(queues, "dc_queue_drain_after", h)
	if rc != C.DC_OK {
		return rc
	}
	*bytes = C.size_t(max(e.DrainAfter(), 0))
	return C.DC_OK
}

// dc_queue_free: see dynamo_ctx.h, the reference.
//
//export dc_queue_free
func dc_queue_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_queue_free", &rc)
	e, err := queues.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_queue_free: %v", err)
	}
	e.Close()
	return C.DC_OK
}

// dc_queue_drain: see dynamo_ctx.h, the reference.
//
//export dc_queue_drain
func dc_queue_drain(h C.uint64_t, buf *C.uint64_t, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_queue_drain", &rc)
	if n == nil || (buf == nil && bufLen > 0) {
		return fail(C.DC_EINVAL, "dc_queue_drain: buf and n must not be NULL")
	}
	e, rc := get(queues, "dc_queue_drain", h)
	if rc != C.DC_OK {
		return rc
	}
	var dst []uint64
	if bufLen > 0 {
		dst = unsafe.Slice((*uint64)(unsafe.Pointer(buf)), int(bufLen))
	}
	got, _ := e.Drain(dst)
	*n = C.size_t(got)
	return C.DC_OK
}

// dc_queue_push: see dynamo_ctx.h, the reference.
//
//export dc_queue_push
func dc_queue_push(h C.uint64_t, toks *C.uint64_t, n C.size_t) (rc C.int) {
	defer guard("dc_queue_push", &rc)
	if toks == nil && n > 0 {
		return fail(C.DC_EINVAL, "dc_queue_push: toks must not be NULL")
	}
	e, rc := get(queues, "dc_queue_push", h)
	if rc != C.DC_OK {
		return rc
	}
	if n == 0 {
		return C.DC_OK
	}
	for _, tok := range unsafe.Slice((*uint64)(unsafe.Pointer(toks)), int(n)) {
		if e.Push(tok) != nil {
			return fail(C.DC_EBADF, "dc_queue_push: queue is being freed")
		}
	}
	return C.DC_OK
}

// dc_context_watch: see dynamo_ctx.h, the reference.
//
//export dc_context_watch
func dc_context_watch(h C.uint64_t, q C.uint64_t, state C.uint32_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_context_watch", &rc)
	st := ctxtree.State(state)
	if st != ctxtree.Stopped && st != ctxtree.Killed {
		return fail(C.DC_EINVAL, "dc_context_watch: state must be DC_STOPPED or DC_KILLED, got %d", state)
	}
	c, rc := get(contexts, "dc_context_watch", h)
	if rc != C.DC_OK {
		return rc
	}
	e, rc := get(queues, "dc_context_watch", q)
	if rc != C.DC_OK {
		return rc
	}
	tok := uint64(token)
	switch err := e.Watch(tok, func(fire func()) func() bool { return c.Notify(st, handOff(c, fire)) }); {
	case errors.Is(err, wake.ErrDuplicate):
		return fail(C.DC_EEXIST, "dc_context_watch: token %d is already pending on this queue", tok)
	case err != nil:
		return fail(C.DC_EBADF, "dc_context_watch: queue is being freed")
	}
	return C.DC_OK
}

// dc_queue_unwatch: see dynamo_ctx.h, the reference.
//
//export dc_queue_unwatch
func dc_queue_unwatch(q C.uint64_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_queue_unwatch", &rc)
	e, rc := get(queues, "dc_queue_unwatch", q)
	if rc != C.DC_OK {
		return rc
	}
	if err := e.Unwatch(uint64(token)); err != nil {
		return fail(C.DC_ENOENT, "dc_queue_unwatch: token %d is not pending", uint64(token))
	}
	return C.DC_OK
}
