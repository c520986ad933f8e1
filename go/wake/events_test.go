//go:build linux

package wake

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// event is a stand-in for a context: callbacks registered on it run once
// when it happens, or at once if it already has.
type event struct {
	mu   sync.Mutex
	done bool
	next int
	fns  map[int]func()
}

func (ev *event) register(f func()) func() bool {
	ev.mu.Lock()
	if ev.done {
		ev.mu.Unlock()
		f()
		return func() bool { return false }
	}
	if ev.fns == nil {
		ev.fns = map[int]func(){}
	}
	id := ev.next
	ev.next++
	ev.fns[id] = f
	ev.mu.Unlock()
	return func() bool {
		ev.mu.Lock()
		defer ev.mu.Unlock()
		_, ok := ev.fns[id]
		delete(ev.fns, id)
		return ok
	}
}

func (ev *event) happen() {
	ev.mu.Lock()
	ev.done = true
	fns := ev.fns
	ev.fns = nil
	ev.mu.Unlock()
	for _, f := range fns {
		f()
	}
}

func (ev *event) registered() int {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return len(ev.fns)
}

func drainAll(t *testing.T, e *EventQueue) []uint64 {
	t.Helper()
	buf := make([]uint64, 16)
	n, _ := e.Drain(buf)
	return buf[:n]
}

func newEvents(t *testing.T) *EventQueue {
	t.Helper()
	e, err := NewEventQueue()
	require.NoError(t, err)
	t.Cleanup(e.Close)
	return e
}

func TestEventQueueFiresOnce(t *testing.T) {
	e := newEvents(t)
	ev := &event{}
	require.NoError(t, e.Watch(7, ev.register))
	assert.Empty(t, drainAll(t, e))
	ev.happen()
	assert.Equal(t, []uint64{7}, drainAll(t, e))
	ev.happen()
	assert.Empty(t, drainAll(t, e), "a fired watch fires no more")
	assert.ErrorIs(t, e.Unwatch(7), ErrNotPending)
}

func TestEventQueueAlreadyHappened(t *testing.T) {
	e := newEvents(t)
	ev := &event{}
	ev.happen()
	require.NoError(t, e.Watch(1, ev.register), "fire inside register")
	assert.Equal(t, []uint64{1}, drainAll(t, e))
	require.NoError(t, e.Watch(1, ev.register), "the token is free again once fired")
	assert.Equal(t, []uint64{1}, drainAll(t, e))
}

func TestEventQueueDuplicateAndUnwatch(t *testing.T) {
	e := newEvents(t)
	ev := &event{}
	require.NoError(t, e.Watch(3, ev.register))
	assert.ErrorIs(t, e.Watch(3, ev.register), ErrDuplicate)
	assert.Equal(t, 1, ev.registered(), "a rejected watch never registers")
	require.NoError(t, e.Unwatch(3))
	assert.Equal(t, 0, ev.registered(), "unwatch unregisters")
	ev.happen()
	assert.Empty(t, drainAll(t, e))
	assert.ErrorIs(t, e.Unwatch(3), ErrNotPending)
}

func TestEventQueueStaleRegistrationNeverDelivers(t *testing.T) {
	e := newEvents(t)
	ev := &event{}
	require.NoError(t, e.Watch(7, ev.register))
	e.fire(7, &watch{}) // a late callback of an earlier registration of 7
	assert.Empty(t, drainAll(t, e))
	ev.happen()
	assert.Equal(t, []uint64{7}, drainAll(t, e))
}

func TestEventQueueCloseUnregisters(t *testing.T) {
	e, err := NewEventQueue()
	require.NoError(t, err)
	ev := &event{}
	require.NoError(t, e.Watch(1, ev.register))
	require.NoError(t, e.Watch(2, ev.register))
	e.Close()
	e.Close()
	assert.Equal(t, 0, ev.registered())
	assert.ErrorIs(t, e.Watch(3, ev.register), ErrClosed)
	assert.ErrorIs(t, e.Push(4), ErrClosed)
	ev.happen()
}

func TestEventQueueConcurrentWatchFireUnwatch(t *testing.T) {
	e := newEvents(t)
	const n = 200
	evs := make([]*event, n)
	for i := range evs {
		evs[i] = &event{}
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			assert.NoError(t, e.Watch(uint64(i), evs[i].register))
		}()
		go func() {
			defer wg.Done()
			evs[i].happen()
			if i%2 == 0 {
				_ = e.Unwatch(uint64(i))
			}
		}()
	}
	wg.Wait()
	got := map[uint64]bool{}
	buf := make([]uint64, 64)
	for {
		k, _ := e.Drain(buf)
		for _, tok := range buf[:k] {
			assert.False(t, got[tok], "token %d delivered twice", tok)
			got[tok] = true
		}
		if k == 0 {
			break
		}
	}
	for i := 1; i < n; i += 2 {
		assert.True(t, got[uint64(i)], "odd token %d (never unwatched) delivered", i)
	}
	for i, ev := range evs {
		assert.Equal(t, 0, ev.registered(), "event %d left a callback", i)
	}
}

func BenchmarkEventQueueWatchFire(b *testing.B) {
	e, err := NewEventQueue()
	require.NoError(b, err)
	defer e.Close()
	buf := make([]uint64, 4)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		ev := &event{}
		if err := e.Watch(7, ev.register); err != nil {
			b.Fatal(err)
		}
		ev.happen()
		if n, _ := e.Drain(buf); n != 1 {
			b.Fatal(n)
		}
	}
}
