//go:build linux

package frontend

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair is a connected (server side, client side) pair on loopback.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return s, c
}

// The watcher calls a connection's onGone when its peer closes (a FIN or a
// reset), not for its bytes, and not after the watch stopped.
func TestHangupWatcher(t *testing.T) {
	h := newHangups()
	require.NotNil(t, h)
	defer h.close()

	// Bytes are no hang-up; the FIN is.
	s1, c1 := tcpPair(t)
	gone1 := make(chan struct{})
	stop1 := h.watch(s1, func() { close(gone1) })
	defer stop1()
	_, err := c1.Write([]byte("more"))
	require.NoError(t, err)
	select {
	case <-gone1:
		t.Fatal("bytes from the peer taken for a hang-up")
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, c1.(*net.TCPConn).CloseWrite())
	select {
	case <-gone1:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's FIN not seen")
	}

	// A reset.
	s2, c2 := tcpPair(t)
	gone2 := make(chan struct{})
	stop2 := h.watch(s2, func() { close(gone2) })
	defer stop2()
	require.NoError(t, c2.(*net.TCPConn).SetLinger(0))
	require.NoError(t, c2.Close())
	select {
	case <-gone2:
	case <-time.After(5 * time.Second):
		t.Fatal("the peer's reset not seen")
	}

	// Stopped first: never called.
	s3, c3 := tcpPair(t)
	stop3 := h.watch(s3, func() { t.Error("called after its watch stopped") })
	stop3()
	require.NoError(t, c3.Close())
	time.Sleep(20 * hangupPoll)

	// Many at once, on one watcher goroutine.
	const n = 200
	gone := make(chan int, n)
	var clients []net.Conn
	for i := range n {
		s, c := tcpPair(t)
		defer h.watch(s, func() { gone <- i })()
		clients = append(clients, c)
	}
	for _, c := range clients {
		require.NoError(t, c.Close())
	}
	seen := map[int]bool{}
	for len(seen) < n {
		select {
		case i := <-gone:
			require.False(t, seen[i], "onGone twice")
			seen[i] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d hang-ups seen", len(seen), n)
		}
	}
}

// The watcher's goroutine ends after its linger without watches, and with
// the set's close.
func TestHangupWatcherStops(t *testing.T) {
	h := newHangups()
	s, c := tcpPair(t)
	stop := h.watch(s, func() {})
	_ = c
	stop()
	require.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return !h.running
	}, 5*time.Second, hangupPoll)
	h.close()
	h.close() // twice is nothing
	stop = h.watch(s, func() { t.Error("watched after close") })
	stop()
}

// Quiet (no response writes), the watcher waits in Go's network poller:
// it sees a hang-up at once, without reading its set on a timer meanwhile.
// Busy (writes: touch), the writers read the set every hangupPoll, and see
// a hang-up as well.
func TestHangupWatcherQuietAndBusy(t *testing.T) {
	h := newHangups()
	require.NotNil(t, h)
	defer h.close()
	require.NotNil(t, h.rc, "the epoll set is not in Go's poller")

	c1, gone1 := watched(t, h)
	time.Sleep(10 * hangupPoll) // the watcher settles into its quiet wait
	before := h.looks.Load()
	time.Sleep(20 * hangupPoll)
	// A timer every hangupPoll would have read it 20 times; the quiet
	// wait reads it once per hangupLinger at most.
	require.LessOrEqual(t, h.looks.Load()-before, int64(2), "the quiet watcher polled")
	require.NoError(t, c1.Close())
	seenGone(t, gone1, "the quiet watcher")

	// Busy: the touches read the set, at most every hangupPoll.
	c2, gone2 := watched(t, h)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(hangupPoll / 4):
				h.touch()
			}
		}
	}()
	start, before := time.Now(), h.looks.Load()
	require.Eventually(t, func() bool { return h.looks.Load()-before > 5 }, 5*time.Second, hangupPoll,
		"the writers did not read the set")
	looks, elapsed := h.looks.Load()-before, time.Since(start)
	// At most one read per hangupPoll, and the watcher's own (two at most here).
	require.LessOrEqual(t, looks, int64(elapsed/hangupPoll)+3, "the writers read the set more often than every hangupPoll")
	require.NoError(t, c2.Close())
	seenGone(t, gone2, "the writers")
	close(stop)
	<-done
}

// A hang-up that comes while the watcher runs the onGone of another (so
// after its read of the set, before it waits again) is seen at once, not
// at its linger's deadline: the poller's record of the set's readiness is
// cleared as the watcher waits again, and the set is looked at first.
func TestHangupDuringAnotherOnGoneIsSeen(t *testing.T) {
	h := newHangups()
	require.NotNil(t, h)
	defer h.close()
	h.linger = time.Minute // a hang-up missed is then seen a minute late
	s1, c1 := tcpPair(t)
	s2, c2 := tcpPair(t)
	running, release := make(chan struct{}), make(chan struct{})
	defer h.watch(s1, func() { close(running); <-release })()
	gone2 := make(chan struct{})
	defer h.watch(s2, func() { close(gone2) })()
	require.NoError(t, c1.Close())
	seenGone(t, running, "the watcher")
	require.NoError(t, c2.Close())
	time.Sleep(20 * time.Millisecond) // the FIN is in the set while the watcher is busy
	close(release)
	seenGone(t, gone2, "the watcher, after the other's onGone")
}

// A watch's stop waits for its onGone that started, and no onGone starts
// after it returned.
func TestHangupStopWaitsForARunningOnGone(t *testing.T) {
	h := newHangups()
	require.NotNil(t, h)
	defer h.close()
	s, c := tcpPair(t)
	running, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	stop := h.watch(s, func() { calls.Add(1); close(running); <-release })
	require.NoError(t, c.Close())
	seenGone(t, running, "the watcher")
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while its onGone ran")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	seenGone(t, stopped, "stop")
	require.Equal(t, int32(1), calls.Load())
}

// watched is the client side of a connection that h watches, and the
// channel its onGone closes.
func watched(t *testing.T, h *hangups) (net.Conn, chan struct{}) {
	s, c := tcpPair(t)
	gone := make(chan struct{})
	t.Cleanup(h.watch(s, func() { close(gone) }))
	return c, gone
}

// seenGone waits for a watched connection's onGone.
func seenGone(t *testing.T, gone chan struct{}, who string) {
	t.Helper()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatalf("a hang-up not seen by %s", who)
	}
}
