package transport

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundState is the number of r's members and whether its timer will fire.
func roundState(r *watchRound) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.members), r.armed
}

// roundOfIdle is the round of the watchdogs of streams with idle timeout
// idle (each test uses an idle timeout no other test uses).
func roundOfIdle(idle time.Duration) *watchRound { return roundOf(checkEvery(idle)) }

// roundEmpties waits until r has no member and no timer to fire.
func roundEmpties(t *testing.T, r *watchRound) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, armed := roundState(r)
		return n == 0 && !armed
	}, waitFor, time.Millisecond, "the round empties and its timer stops")
}

// Watchdogs of one period share one timer, armed while any of them runs,
// and each is still checked: a silent peer is declared gone once, and
// every quiet side writes its heartbeats.
func TestWatchdogsShareOneTimer(t *testing.T) {
	const idle = 997 * time.Millisecond
	r := roundOfIdle(idle)
	n, armed := roundState(r)
	require.Zero(t, n)
	require.False(t, armed)

	const count = 200
	var deads atomic.Int64
	beats := make([]atomic.Int64, count)
	dogs := make([]*liveness, count)
	for i := range dogs {
		dogs[i] = startLiveness(idle, func(*liveness) bool { beats[i].Add(1); return true }, func() { deads.Add(1) })
	}
	t.Cleanup(func() {
		for _, l := range dogs {
			l.stop()
		}
	})
	n, armed = roundState(r)
	assert.Equal(t, count, n)
	assert.True(t, armed)

	// The first half hear from their peer all along; the others never do.
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(idle / 10)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, l := range dogs[:count/2] {
				l.sawFrame()
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
	require.Eventually(t, func() bool { return deads.Load() == count/2 }, waitFor, time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), idle-5*time.Millisecond)
	time.Sleep(2 * idle)
	assert.Equal(t, int64(count/2), deads.Load(), "each silent peer is declared gone once, the others not")
	for _, l := range dogs[:count/2] {
		assert.False(t, l.isStopped())
	}
	// Each quiet side wrote a heartbeat about every interval: at least
	// half of those due.
	due := int64(time.Since(start) / heartbeatFor(idle))
	for i := range dogs[:count/2] {
		assert.GreaterOrEqual(t, beats[i].Load(), due/2, "heartbeats of watchdog %d", i)
	}
	n, _ = roundState(r)
	assert.Equal(t, count/2, n, "the watchdogs of the peers declared gone left the round")

	for _, l := range dogs {
		l.stop()
	}
	roundEmpties(t, r)
}

// A heartbeat whose write blocks (a peer that stopped reading) delays
// neither its own silence check nor the other watchdogs' checks, and no
// second write starts while it blocks.
func TestBlockedHeartbeatDelaysNoCheck(t *testing.T) {
	const idle = 101 * time.Millisecond
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var writes atomic.Int64
	blocked := startLiveness(idle, func(*liveness) bool {
		writes.Add(1)
		<-release
		return true
	}, func() {})
	t.Cleanup(blocked.stop)
	require.Eventually(t, func() bool { return writes.Load() == 1 }, waitFor, time.Millisecond, "the first heartbeat is under way")

	gone := make(chan struct{})
	start := time.Now()
	other := startLiveness(idle, func(*liveness) bool { return true }, func() { close(gone) })
	t.Cleanup(other.stop)
	select {
	case <-gone:
	case <-time.After(waitFor):
		t.Fatal("a silent peer was not declared gone while another watchdog's heartbeat blocked")
	}
	assert.GreaterOrEqual(t, time.Since(start), idle-5*time.Millisecond)
	require.Eventually(t, blocked.isStopped, waitFor, time.Millisecond, "the blocked side's own peer is declared gone too")
	assert.Equal(t, int64(1), writes.Load(), "one heartbeat's write at a time")
}

// Watchdogs that start and stop from many goroutines at once, while the
// round runs, never keep it from checking the others: a silent peer among
// them is declared gone within its idle timeout and a few periods. The
// round then empties and its timer stops (go test -race).
func TestWatchRoundChurn(t *testing.T) {
	const idle = 103 * time.Millisecond
	r := roundOfIdle(idle)
	gone := make(chan time.Time, 1)
	start := time.Now()
	silent := startLiveness(idle, func(*liveness) bool { return true }, func() { gone <- time.Now() })
	t.Cleanup(silent.stop)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				l := startLiveness(idle, func(*liveness) bool { return true }, func() {})
				if i%3 == 0 {
					time.Sleep(time.Duration(i%7) * time.Millisecond)
				}
				l.stop()
			}
		}()
	}
	select {
	case at := <-gone:
		assert.GreaterOrEqual(t, at.Sub(start), idle-5*time.Millisecond)
	case <-time.After(waitFor):
		t.Fatal("a silent peer was not declared gone while other watchdogs came and went")
	}
	wg.Wait()
	roundEmpties(t, r)
}
