package main

// The exports of contexts: making them (their state word outside the Go
// heap), ids, states and their one transition rule, cancelling, children,
// deadlines, and the reasons' names; and the kill count C reads.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
#include <stdlib.h>

// Defined in kill_epoch.c.
extern uint64_t dc_kill_epoch;
*/
import "C"

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

func init() {
	// Kills are counted where C reads the count without calling into Go
	// (py_client.c's kill_epoch).
	ctxtree.CountKills((*atomic.Uint64)(unsafe.Pointer(&C.dc_kill_epoch)))
}

// newContext gives the context a state word outside the Go heap, so C code
// may keep a pointer to it and poll it without calling into Go. The word goes
// back to stateWords by the garbage collector's cleanup once the Go context is
// unreachable: its handle is gone and no parent or propagation holds it any
// more.
func newContext(id string) *ctxtree.Context {
	word := stateWords.get()
	c := ctxtree.New(id, ctxtree.WithStateWord((*atomic.Uint32)(word)))
	runtime.AddCleanup(c, stateWords.put, word)
	return c
}

// wordsPerSlab is how many state words one C allocation holds.
const wordsPerSlab = 1024

// stateWords hands out the contexts' state words: 4 bytes of C memory each,
// allocated a slab of wordsPerSlab at a time and reused once their context
// is gone. A call into C per context (calloc, then free in the cleanup)
// enters the system-call state, which wakes Go's monitor thread (sysmon)
// from its deep sleep; it then polls every 20 us for a millisecond or more.
// Once per request, that was most of sysmon's wake-ups in a worker and a
// frontend between engine steps (docs/benchmarks.md, "Where the serving
// processes' CPU goes"). Slabs are never freed: the memory kept is 4 bytes
// (and a free list's 8) per context at the most ever alive at once.
var stateWords wordPool

type wordPool struct {
	mu   sync.Mutex
	free []unsafe.Pointer
}

// get returns a zeroed word.
func (w *wordPool) get() unsafe.Pointer {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.free); n > 0 {
		p := w.free[n-1]
		w.free = w.free[:n-1]
		return p
	}
	slab := C.calloc(wordsPerSlab, 4)
	if slab == nil {
		panic("out of memory")
	}
	for i := wordsPerSlab - 1; i > 0; i-- {
		w.free = append(w.free, unsafe.Add(slab, 4*i))
	}
	return slab
}

// put takes back a word whose context is gone (nothing reads it any more:
// see dc_context_state_word), zeroed for its next context.
func (w *wordPool) put(p unsafe.Pointer) {
	(*atomic.Uint32)(p).Store(0)
	w.mu.Lock()
	w.free = append(w.free, p)
	w.mu.Unlock()
}

func putContext(c *ctxtree.Context, out *C.uint64_t) {
	*out = C.uint64_t(contexts.Insert(c))
}

// dc_context_new: see dynamo_ctx.h, the reference.
//
//export dc_context_new
func dc_context_new(id *C.char, idLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_new", &rc)
	if id == nil || out == nil {
		return fail(C.DC_EINVAL, "dc_context_new: id and out must not be NULL")
	}
	if err := ctxtree.ValidateID(cString(id, idLen)); err != nil {
		return fail(C.DC_EINVAL, "dc_context_new: %v", err)
	}
	putContext(newContext(C.GoStringN(id, C.int(idLen))), out)
	return C.DC_OK
}

// dc_id_check: see dynamo_ctx.h, the reference.
//
//export dc_id_check
func dc_id_check(id *C.char, idLen C.size_t) (rc C.int) {
	defer guard("dc_id_check", &rc)
	if id == nil && idLen > 0 {
		return fail(C.DC_EINVAL, "dc_id_check: id must not be NULL")
	}
	if err := ctxtree.ValidateID(cString(id, idLen)); err != nil {
		return fail(C.DC_EINVAL, "dc_id_check: %v", err)
	}
	return C.DC_OK
}

// dc_context_new_uuid: see dynamo_ctx.h, the reference.
//
//export dc_context_new_uuid
func dc_context_new_uuid(out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_new_uuid", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_new_uuid: out must not be NULL")
	}
	putContext(newContext(ctxtree.NewID()), out)
	return C.DC_OK
}

// dc_context_free: see dynamo_ctx.h, the reference.
//
//export dc_context_free
func dc_context_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_context_free", &rc)
	if _, err := contexts.Remove(uint64(h)); err != nil {
		return fail(C.DC_EBADF, "dc_context_free: %v", err)
	}
	return C.DC_OK
}

// dc_context_id: see dynamo_ctx.h, the reference.
//
//export dc_context_id
func dc_context_id(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_context_id", &rc)
	c, rc := get(contexts, "dc_context_id", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_context_id", c.ID(), buf, bufLen, n)
}

// dc_context_state: see dynamo_ctx.h, the reference.
//
//export dc_context_state
func dc_context_state(h C.uint64_t, word *C.uint32_t) (rc C.int) {
	defer guard("dc_context_state", &rc)
	if word == nil {
		return fail(C.DC_EINVAL, "dc_context_state: word must not be NULL")
	}
	c, rc := get(contexts, "dc_context_state", h)
	if rc != C.DC_OK {
		return rc
	}
	*word = C.uint32_t(c.StateWord().Load())
	return C.DC_OK
}

// dc_context_state_word: see dynamo_ctx.h, the reference.
//
//export dc_context_state_word
func dc_context_state_word(h C.uint64_t, out **C.uint32_t) (rc C.int) {
	defer guard("dc_context_state_word", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_state_word: out must not be NULL")
	}
	c, rc := get(contexts, "dc_context_state_word", h)
	if rc != C.DC_OK {
		return rc
	}
	*out = (*C.uint32_t)(unsafe.Pointer(c.StateWord()))
	return C.DC_OK
}

// dc_context_cancel: see dynamo_ctx.h, the reference.
//
//export dc_context_cancel
func dc_context_cancel(h C.uint64_t, state C.uint32_t, reason C.uint32_t) C.int {
	return cancelContext("dc_context_cancel", h, state, reason)
}

func cancelContext(name string, h C.uint64_t, state C.uint32_t, reason C.uint32_t) (rc C.int) {
	return cancelHolding(name, h, state, reason, nil)
}

// cancelHolding is the export of a cancel whose wake-ups go to held (nil:
// none are held; see held_exports.go).
func cancelHolding(name string, h C.uint64_t, state C.uint32_t, reason C.uint32_t, held *ctxtree.Held) (rc C.int) {
	defer guard(name, &rc)
	st, r, rc := cancelArgs(name, state, reason)
	if rc != C.DC_OK {
		return rc
	}
	c, rc := get(contexts, name, h)
	if rc != C.DC_OK {
		return rc
	}
	c.CancelHolding(st, r, held)
	return C.DC_OK
}

// cancelArgs checks the state and reason of a cancel: DC_STOPPED or
// DC_KILLED, and a defined reason other than DC_REASON_NONE.
func cancelArgs(name string, state, reason C.uint32_t) (ctxtree.State, ctxtree.Reason, C.int) {
	st, r := ctxtree.State(state), ctxtree.Reason(reason)
	if st != ctxtree.Stopped && st != ctxtree.Killed {
		return st, r, fail(C.DC_EINVAL, "%s: state must be DC_STOPPED or DC_KILLED, got %d", name, state)
	}
	if !r.Valid() {
		return st, r, fail(C.DC_EINVAL, "%s: unknown reason %d", name, reason)
	}
	return st, r, C.DC_OK
}

// dc_state_word_next: see dynamo_ctx.h, the reference.
//
//export dc_state_word_next
func dc_state_word_next(word C.uint32_t, state C.uint32_t, reason C.uint32_t, out *C.uint32_t) (rc C.int) {
	defer guard("dc_state_word_next", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_state_word_next: out must not be NULL")
	}
	st, r, rc := cancelArgs("dc_state_word_next", state, reason)
	if rc != C.DC_OK {
		return rc
	}
	next, _ := ctxtree.Next(uint32(word), st, r, r) // a direct cancel: its cause is its reason
	*out = C.uint32_t(next)
	return C.DC_OK
}

// dc_context_stop_generating: see dynamo_ctx.h, the reference.
//
//export dc_context_stop_generating
func dc_context_stop_generating(h C.uint64_t) C.int {
	return cancelContext("dc_context_stop_generating", h, C.DC_STOPPED, C.DC_REASON_STOP_GENERATING)
}

// dc_context_kill: see dynamo_ctx.h, the reference.
//
//export dc_context_kill
func dc_context_kill(h C.uint64_t) C.int {
	return cancelContext("dc_context_kill", h, C.DC_KILLED, C.DC_REASON_KILL)
}

// dc_context_link_child: see dynamo_ctx.h, the reference.
//
//export dc_context_link_child
func dc_context_link_child(parent, child C.uint64_t) (rc C.int) {
	defer guard("dc_context_link_child", &rc)
	p, rc := get(contexts, "dc_context_link_child (parent)", parent)
	if rc != C.DC_OK {
		return rc
	}
	c, rc := get(contexts, "dc_context_link_child (child)", child)
	if rc != C.DC_OK {
		return rc
	}
	p.LinkChild(c)
	return C.DC_OK
}

// dc_context_child: see dynamo_ctx.h, the reference.
//
//export dc_context_child
func dc_context_child(parent C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_child", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_child: out must not be NULL")
	}
	p, rc := get(contexts, "dc_context_child", parent)
	if rc != C.DC_OK {
		return rc
	}
	c := newContext(p.ID())
	p.LinkChild(c)
	putContext(c, out)
	return C.DC_OK
}

// dc_context_set_timeout: see dynamo_ctx.h, the reference.
//
//export dc_context_set_timeout
func dc_context_set_timeout(h C.uint64_t, seconds C.double) (rc C.int) {
	defer guard("dc_context_set_timeout", &rc)
	d, err := ctxtree.Timeout(float64(seconds))
	if err != nil {
		return fail(C.DC_EINVAL, "dc_context_set_timeout: %v", err)
	}
	c, rc := get(contexts, "dc_context_set_timeout", h)
	if rc != C.DC_OK {
		return rc
	}
	c.SetDeadline(time.Now().Add(d))
	return C.DC_OK
}

// dc_timeout_check: see dynamo_ctx.h, the reference.
//
//export dc_timeout_check
func dc_timeout_check(seconds C.double) (rc C.int) {
	defer guard("dc_timeout_check", &rc)
	if err := ctxtree.TimeoutError(float64(seconds)); err != nil {
		return fail(C.DC_EINVAL, "dc_timeout_check: %v", err)
	}
	return C.DC_OK
}

// dc_context_remaining: see dynamo_ctx.h, the reference.
//
//export dc_context_remaining
func dc_context_remaining(h C.uint64_t, seconds *C.double) (rc C.int) {
	defer guard("dc_context_remaining", &rc)
	if seconds == nil {
		return fail(C.DC_EINVAL, "dc_context_remaining: seconds must not be NULL")
	}
	c, rc := get(contexts, "dc_context_remaining", h)
	if rc != C.DC_OK {
		return rc
	}
	left, ok := c.Remaining()
	if !ok {
		*seconds = -1
		return C.DC_OK
	}
	*seconds = C.double(left.Seconds())
	return C.DC_OK
}

// dc_context_finish: see dynamo_ctx.h, the reference.
//
//export dc_context_finish
func dc_context_finish(h C.uint64_t) (rc C.int) {
	defer guard("dc_context_finish", &rc)
	c, rc := get(contexts, "dc_context_finish", h)
	if rc != C.DC_OK {
		return rc
	}
	c.Finish()
	return C.DC_OK
}

// dc_reason_name: see dynamo_ctx.h, the reference.
//
//export dc_reason_name
func dc_reason_name(reason C.uint32_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_reason_name", &rc)
	r := ctxtree.Reason(reason)
	if !r.Valid() {
		return fail(C.DC_EINVAL, "dc_reason_name: unknown reason %d", reason)
	}
	return writeString("dc_reason_name", r.String(), buf, bufLen, n)
}
