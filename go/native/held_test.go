package main

import (
	"math"
	"testing"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hold holds one wake-up that appends i to *ran, and returns its ticket.
func hold(ran *[]int, i int) uint64 {
	var h ctxtree.Held
	h.Wake(func() { *ran = append(*ran, i) })
	return holdWakes(&h)
}

// dc_run_held runs what was held up to a ticket, oldest first, and says how
// many cancels' wake-ups it ran.
func TestRunHeldUpToATicket(t *testing.T) {
	var ran []int
	t1, t2 := hold(&ran, 1), hold(&ran, 2)
	require.Less(t, t1, t2)
	assert.Equal(t, 1, runHeld(t1))
	assert.Equal(t, []int{1}, ran)
	assert.Equal(t, 0, runHeld(t1), "nothing older is left")
	assert.EqualValues(t, 0, dc_run_held(math.MaxUint64, nil), "ran may be NULL")
	assert.Equal(t, []int{1, 2}, ran)
	assert.Zero(t, runHeld(math.MaxUint64), "nothing is left")
}

// Every call that waits (docs/c-abi.md, "Blocking") runs every held
// wake-up first, whatever its arguments: none can wait on a goroutine a held
// wake-up would have woken.
func TestCallsThatWaitRunHeldWakeUpsFirst(t *testing.T) {
	const bad = 0xdeadbeef
	calls := map[string]func() int{
		"dc_runtime_new":      func() int { return int(dc_runtime_new(nil, 0, nil)) },
		"dc_endpoint_serve":   func() int { return int(dc_endpoint_serve(bad, nil, 0, nil, 0, nil)) },
		"dc_client_new":       func() int { return int(dc_client_new(bad, nil, 0, nil)) },
		"dc_frontend_start":   func() int { return int(dc_frontend_start(bad, nil, 0, nil)) },
		"dc_runtime_shutdown": func() int { return int(dc_runtime_shutdown(bad)) },
		"dc_runtime_free":     func() int { return int(dc_runtime_free(bad)) },
		"dc_endpoint_free":    func() int { return int(dc_endpoint_free(bad)) },
		"dc_frontend_free":    func() int { return int(dc_frontend_free(bad)) },
	}
	for name, call := range calls {
		var ran []int
		hold(&ran, 1)
		assert.NotZero(t, call(), name)
		assert.Equal(t, []int{1}, ran, name)
	}
	var ran []int
	hold(&ran, 1)
	assert.EqualValues(t, 9, call1(dc_context_kill, bad))
	assert.Empty(t, ran, "a call that does not wait leaves them to the host")
	runAllHeld()
}

func TestCancelHeldArguments(t *testing.T) {
	assert.EqualValues(t, 22, dc_context_cancel_held(1, 2, 1, nil), "NULL ticket")
}
