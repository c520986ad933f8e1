package main

// Held wake-ups: a cancel from the host that holds back the goroutine
// wake-ups of its cancellation (ctxtree.CancelHolding) until the host has
// run what the cancel woke on its own side, and the exports that run them.
//
// Why: a cancel that a host's event loop makes (Context.kill in Python) may
// reach a handler on that same loop (an in-process request). The handler
// runs only once the cancelling call has returned and the loop turns, and a
// goroutine woken meanwhile (the Kill frame's, the request's writer) costs
// the loop's thread a futex call, and often its CPU, first. Held, those
// wake-ups run when the host says: dc_run_held with the cancel's ticket,
// which Python calls on the loop's next turn, right after the handler's
// task. No call that can wait on a goroutine (the calls docs/c-abi.md lists
// under "Blocking") starts before every held wake-up has run (runAllHeld);
// the others never wait for one.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"math"
	"sync"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

// held is what cancels hold, in ticket order.
var held struct {
	mu   sync.Mutex
	list []heldCancel
	last uint64 // the last ticket given
}

type heldCancel struct {
	ticket uint64
	wakes  *ctxtree.Held
}

// holdWakes keeps h's wake-ups until runHeld, and returns their ticket
// (never 0).
func holdWakes(h *ctxtree.Held) uint64 {
	held.mu.Lock()
	defer held.mu.Unlock()
	held.last++
	held.list = append(held.list, heldCancel{held.last, h})
	return held.last
}

// runHeld runs the held wake-ups whose ticket is at most upto, oldest
// first, and returns how many cancels' wake-ups it ran.
func runHeld(upto uint64) int {
	held.mu.Lock()
	n := 0
	for n < len(held.list) && held.list[n].ticket <= upto {
		n++
	}
	run := held.list[:n:n]
	held.list = held.list[n:]
	held.mu.Unlock()
	for _, c := range run {
		c.wakes.Run()
	}
	return n
}

// runAllHeld runs every held wake-up: first thing in a call that waits.
func runAllHeld() { runHeld(math.MaxUint64) }

// dc_context_cancel_held: see dynamo_ctx.h, the reference.
//
//export dc_context_cancel_held
func dc_context_cancel_held(h C.uint64_t, state C.uint32_t, reason C.uint32_t, ticket *C.uint64_t) (rc C.int) {
	const name = "dc_context_cancel_held"
	defer guard(name, &rc)
	if ticket == nil {
		return fail(C.DC_EINVAL, "%s: ticket must not be NULL", name)
	}
	t, rc := cancelAndHold(name, h, state, reason)
	*ticket = C.uint64_t(t)
	return rc
}

// cancelAndHold is cancelHolding with the wake-ups kept until runHeld: their
// ticket, 0 when the cancel held none (or failed).
func cancelAndHold(name string, h C.uint64_t, state C.uint32_t, reason C.uint32_t) (uint64, C.int) {
	var wakes ctxtree.Held
	if rc := cancelHolding(name, h, state, reason, &wakes); rc != C.DC_OK {
		return 0, rc
	}
	if wakes.Len() == 0 {
		return 0, C.DC_OK
	}
	return holdWakes(&wakes), C.DC_OK
}

// dc_run_held: see dynamo_ctx.h, the reference.
//
//export dc_run_held
func dc_run_held(upto C.uint64_t, ran *C.size_t) (rc C.int) {
	defer guard("dc_run_held", &rc)
	n := runHeld(uint64(upto))
	if ran != nil {
		*ran = C.size_t(n)
	}
	return C.DC_OK
}

// dc_context_cancel_local: see dynamo_ctx.h, the reference.
//
//export dc_context_cancel_local
func dc_context_cancel_local(h C.uint64_t, state C.uint32_t, reason C.uint32_t, q C.uint64_t, toks *C.uint64_t, capacity C.size_t, ntoks *C.size_t, ticket *C.uint64_t) (rc C.int) {
	const name = "dc_context_cancel_local"
	defer guard(name, &rc)
	if ntoks != nil {
		*ntoks = 0
	}
	if ticket != nil {
		*ticket = 0
	}
	if ticket == nil || ntoks == nil || (toks == nil && capacity > 0) {
		return fail(C.DC_EINVAL, "%s: ticket and ntoks must not be NULL, nor toks with a capacity", name)
	}
	e, rc := get(queues, name, q)
	if rc != C.DC_OK {
		return rc
	}
	end := e.Capture()
	t, rc := cancelAndHold(name, h, state, reason) // cancelHolding recovers its own panics
	caught := end()
	n := 0
	// What toks cannot hold, and on an error whatever other goroutines
	// pushed meanwhile: the fd delivers it (deferred: whatever happens below).
	defer func() {
		for _, tok := range caught[n:] {
			_ = e.Push(tok) // only fails once the queue is freed
		}
	}()
	if rc == C.DC_OK {
		n = len(caught)
		if uint64(capacity) < uint64(n) {
			n = int(capacity)
		}
		copy(unsafe.Slice((*uint64)(unsafe.Pointer(toks)), n), caught)
		*ntoks = C.size_t(n)
		*ticket = C.uint64_t(t)
	}
	return rc
}
