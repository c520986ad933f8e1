package rawio_test

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// unixPair is a connected Unix stream pair: the writing end's descriptor
// (from the unwrapped connection) and both ends, the writer's wrapped.
func unixPair(t *testing.T) (w net.Conn, raw syscall.RawConn, r net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	conn := func(fd int) net.Conn {
		f := osFile(fd)
		c, err := net.FileConn(f)
		require.NoError(t, err)
		_ = f.Close()
		return c
	}
	wc, rc := conn(fds[0]), conn(fds[1])
	raw, err = wc.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	t.Cleanup(func() { _ = wc.Close(); _ = rc.Close() })
	return rawio.Wrap(wc), raw, rc
}

// A reader that reads nothing: Write still returns at once, and once it
// reads, every byte comes in order; Close ends the writer and the
// failure hook does not run for it.
func TestQueueNeverWaitsAndKeepsTheOrder(t *testing.T) {
	for _, withRaw := range []bool{true, false} {
		w, raw, r := unixPair(t)
		if !withRaw {
			raw = nil
		}
		var failed atomic.Int32
		q := rawio.NewQueue(w, raw, func() { failed.Add(1) })
		writesInOrder(t, q, r, 300) // 300 x 64 KiB: far beyond the socket's buffer
		q.Close()
		q.Close() // idempotent
		_, err := q.Write([]byte("late"))
		assert.ErrorIs(t, err, net.ErrClosed)
		assert.Zero(t, failed.Load(), "Close is not a failure")
	}
}

// writesInOrder writes n chunks of 64 KiB through q, none of the writes
// waiting, then reads them from r: every byte, in order.
func writesInOrder(t *testing.T, q *rawio.Queue, r io.Reader, n int) {
	t.Helper()
	var want bytes.Buffer
	start := time.Now()
	for i := range n {
		b := bytes.Repeat([]byte{byte(i)}, 64<<10)
		want.Write(b)
		m, err := q.Write(b)
		require.NoError(t, err)
		require.Equal(t, len(b), m)
	}
	assert.Less(t, time.Since(start), 5*time.Second, "no Write waited for the reader")
	got := make([]byte, want.Len())
	_, err := io.ReadFull(r, got)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want.Bytes(), got), "in order, whole")
}

// A peer that is gone fails the Queue: the hook runs once, and later
// writes report it.
func TestQueueFailsOnceWhenThePeerIsGone(t *testing.T) {
	w, raw, r := unixPair(t)
	failsOnceWhenThePeerIsGone(t, w, raw, r)
}

// failsOnceWhenThePeerIsGone closes r, the reading end of w, and checks
// that a Queue on w fails once: its hook runs once, later writes report
// it.
func failsOnceWhenThePeerIsGone(t *testing.T, w io.WriteCloser, raw syscall.RawConn, r io.Closer) {
	t.Helper()
	var failed atomic.Int32
	q := rawio.NewQueue(w, raw, func() { failed.Add(1) })
	defer q.Close()
	require.NoError(t, r.Close())
	require.Eventually(t, func() bool {
		_, err := q.Write(bytes.Repeat([]byte("x"), 1<<16))
		return err != nil
	}, 10*time.Second, time.Millisecond)
	_, err := q.Write([]byte("again"))
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.EqualValues(t, 1, failed.Load())
}

func osFile(fd int) *os.File { return os.NewFile(uintptr(fd), "socketpair") }

// A pipe's write end in the poller (as the library's end of the host's
// messages): Write never waits, every byte comes in order once the reader
// reads, a reader that is gone fails the Queue once, and Close ends a
// writer that waits for room.
func TestQueueOnAPipe(t *testing.T) {
	pipe := func() (*os.File, syscall.RawConn, *os.File) {
		var p [2]int
		require.NoError(t, syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC))
		w := os.NewFile(uintptr(p[1]), "pipe-w")
		raw, err := w.SyscallConn()
		require.NoError(t, err)
		r := os.NewFile(uintptr(p[0]), "pipe-r")
		t.Cleanup(func() { _ = w.Close(); _ = r.Close() })
		return w, raw, r
	}
	w, raw, r := pipe()
	var failed atomic.Int32
	q := rawio.NewQueue(w, raw, func() { failed.Add(1) })
	writesInOrder(t, q, r, 64) // 64 x 64 KiB: far beyond the pipe's capacity

	// Full again, the writer waiting for room: Close ends it.
	for range 8 {
		_, err := q.Write(make([]byte, 64<<10))
		require.NoError(t, err)
	}
	closed := make(chan struct{})
	go func() { q.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a reader that never reads")
	}
	assert.Zero(t, failed.Load(), "Close is not a failure")

	// A reader that is gone: the hook runs once, later writes report it.
	w2, raw2, r2 := pipe()
	failsOnceWhenThePeerIsGone(t, w2, raw2, r2)
}
