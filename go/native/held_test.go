package main

import (
	"testing"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/stretchr/testify/assert"
)

// Held wake-ups run at dc_run_held, or at the next export that takes a
// handle (whatever handle: a bad one too), before it looks the handle up.
func TestHeldWakeUpsRunAtTheNextCallThatTakesAHandle(t *testing.T) {
	var ran []int
	hold := func(i int) {
		var h ctxtree.Held
		h.Wake(func() { ran = append(ran, i) })
		holdWakes(&h)
	}
	hold(1)
	hold(2)
	assert.Empty(t, ran)
	assert.EqualValues(t, 0, dc_run_held())
	assert.Equal(t, []int{1, 2}, ran, "in order")
	assert.EqualValues(t, 0, dc_run_held(), "nothing held: nothing to do")

	hold(3)
	assert.EqualValues(t, 9, call1(dc_context_kill, 0xdeadbeef))
	assert.Equal(t, []int{1, 2, 3}, ran)
	assert.False(t, held.pending.Load())
}

// A cancel that holds nothing says so; bad arguments are refused, as by
// dc_context_cancel.
func TestCancelHeldArguments(t *testing.T) {
	assert.EqualValues(t, 22, dc_context_cancel_held(1, 2, 1, nil), "NULL held")
}
