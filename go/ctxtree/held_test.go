package ctxtree

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// CancelHolding moves every word and runs every Notify function at once; the
// channel closes and what NotifyHeld functions wake wait for Held.Run.
func TestCancelHoldingHoldsOnlyTheWakeUps(t *testing.T) {
	parent := New("x")
	child := parent.Child()
	chans := []<-chan struct{}{parent.Stopped(), parent.Killed(), child.Stopped(), child.Killed()}
	var order []string
	parent.Notify(Killed, func() { order = append(order, "notify") })
	parent.NotifyHeld(Killed, func(h *Held) {
		order = append(order, "held hook")
		h.Wake(func() { order = append(order, "woken") })
	})
	var h Held
	require.True(t, parent.CancelHolding(Killed, ReasonKill, &h))
	assert.True(t, parent.IsKilled())
	assert.True(t, child.IsKilled(), "propagation is not held")
	assert.Equal(t, ReasonParent, child.Reason())
	assert.Equal(t, []string{"notify", "held hook"}, order)
	for i, ch := range chans {
		assert.False(t, isClosed(ch), "channel %d closed before Run", i)
	}
	assert.True(t, isClosed(child.Killed()), "a channel asked for from now on is closed")
	assert.Positive(t, h.Len())

	h.Run()
	assert.Equal(t, []string{"notify", "held hook", "woken"}, order)
	for i, ch := range chans {
		assert.True(t, isClosed(ch), "channel %d", i)
	}
	assert.Zero(t, h.Len(), "Run empties it")
	h.Run() // nothing left: closes nothing twice
}

// A context that a NotifyHeld function cancels with the same Held is held
// too: the in-process handler that follows its caller.
func TestHeldReachesWhatAHookCancels(t *testing.T) {
	caller, handler := New("x"), New("x")
	killed := handler.Killed()
	caller.NotifyHeld(Killed, func(h *Held) { handler.CancelHolding(Killed, ReasonKill, h) })
	var h Held
	caller.CancelHolding(Killed, ReasonKill, &h)
	assert.True(t, handler.IsKilled())
	assert.False(t, isClosed(killed))
	h.Run()
	assert.True(t, isClosed(killed))
}

// Cancel is CancelHolding with nothing held: a NotifyHeld function gets nil,
// and what it wakes runs at once, as does a late registration's.
func TestNilHeldRunsAtOnce(t *testing.T) {
	c := New("x")
	var woken int
	var got []*Held
	hook := func(h *Held) {
		got = append(got, h)
		h.Wake(func() { woken++ })
	}
	c.NotifyHeld(Stopped, hook)
	stopped := c.Stopped()
	c.StopGenerating()
	assert.Equal(t, 1, woken)
	assert.True(t, isClosed(stopped), "closed when Cancel returns")
	c.NotifyHeld(Stopped, hook)
	assert.Equal(t, 2, woken, "already there: runs at once")
	assert.Equal(t, []*Held{nil, nil}, got)
}

// A held stop's close of the Stopped channel and a later kill's: whichever
// runs first closes it, the other does nothing (no double close).
func TestHeldStopThenKill(t *testing.T) {
	c := New("x")
	stopped, killed := c.Stopped(), c.Killed()
	var h Held
	c.CancelHolding(Stopped, ReasonStopGenerating, &h)
	assert.False(t, isClosed(stopped))
	c.Kill()
	assert.True(t, isClosed(stopped), "the kill closes what the held stop had not")
	assert.True(t, isClosed(killed))
	h.Run()

	c2 := New("y")
	stopped = c2.Stopped()
	var h2 Held
	c2.CancelHolding(Stopped, ReasonStopGenerating, &h2)
	h2.Run()
	assert.True(t, isClosed(stopped))
	c2.Kill()
}

// Held cancels racing plain ones on one graph: each channel closes once,
// every word ends Killed, nothing panics (run with -race).
func TestRaceHeldAgainstPlainCancels(t *testing.T) {
	for range 200 {
		root := New("x")
		mid := root.Child()
		leaf := mid.Child()
		all := []*Context{root, mid, leaf}
		chans := make([]<-chan struct{}, 0, 6)
		for _, c := range all {
			chans = append(chans, c.Stopped(), c.Killed())
		}
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := all[i%len(all)]
				if i%2 == 0 {
					var h Held
					c.CancelHolding(Stopped, ReasonStopGenerating, &h)
					c.CancelHolding(Killed, ReasonKill, &h)
					h.Run()
				} else {
					c.Cancel(Stopped, ReasonStopGenerating)
					c.Kill()
				}
			}()
		}
		wg.Wait()
		root.Kill()
		for _, c := range all {
			require.True(t, c.IsKilled())
		}
		for i, ch := range chans {
			require.True(t, isClosed(ch), "channel %d", i)
		}
	}
}
