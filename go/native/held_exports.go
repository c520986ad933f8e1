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
// wake-ups run when the host says (dc_run_held, which Python calls on the
// loop's next turn) or, at the latest, at the host's next call into the
// library that takes or frees a handle (get, remove): no call can wait on a
// goroutine that a held wake-up would have woken.

/*
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

// held is what cancels hold: each cancel's Held, in order.
var held struct {
	mu      sync.Mutex
	list    []*ctxtree.Held
	pending atomic.Bool // list is not empty: one load on every get
}

// holdWakes keeps h's wake-ups until runHeld.
func holdWakes(h *ctxtree.Held) {
	held.mu.Lock()
	held.list = append(held.list, h)
	held.pending.Store(true)
	held.mu.Unlock()
}

// runHeld runs every held wake-up, oldest first.
func runHeld() {
	if !held.pending.Load() {
		return
	}
	held.mu.Lock()
	list := held.list
	held.list = nil
	held.pending.Store(false)
	held.mu.Unlock()
	for _, h := range list {
		h.Run()
	}
}

// dc_context_cancel_held: see dynamo_ctx.h, the reference.
//
//export dc_context_cancel_held
func dc_context_cancel_held(h C.uint64_t, state C.uint32_t, reason C.uint32_t, held *C.int) (rc C.int) {
	const name = "dc_context_cancel_held"
	defer guard(name, &rc)
	if held == nil {
		return fail(C.DC_EINVAL, "%s: held must not be NULL", name)
	}
	*held = 0
	st, r, rc := cancelArgs(name, state, reason)
	if rc != C.DC_OK {
		return rc
	}
	c, rc := get(contexts, name, h)
	if rc != C.DC_OK {
		return rc
	}
	var wakes ctxtree.Held
	c.CancelHolding(st, r, &wakes)
	if wakes.Len() > 0 {
		holdWakes(&wakes)
		*held = 1
	}
	return C.DC_OK
}

// dc_run_held: see dynamo_ctx.h, the reference.
//
//export dc_run_held
func dc_run_held() (rc C.int) {
	defer guard("dc_run_held", &rc)
	runHeld()
	return C.DC_OK
}
