//go:build linux

package frontend

import (
	"net"
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
	before = h.looks.Load()
	time.Sleep(20 * hangupPoll)
	looks := h.looks.Load() - before
	require.Greater(t, looks, int64(5), "the writers did not read the set")
	require.LessOrEqual(t, looks, int64(25), "the writers read the set more often than every hangupPoll")
	require.NoError(t, c2.Close())
	seenGone(t, gone2, "the writers")
	close(stop)
	<-done
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
