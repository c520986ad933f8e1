package transport

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deafWorker connects to s for token with a tiny receive buffer, reads the
// initial credit (the stream is attached) and then reads nothing more. It
// keeps sending heartbeats, so the caller never finds it silent; beat stops
// them.
func deafWorker(t *testing.T, s *Server, token string) (c net.Conn, r *frame.Reader, beat func(bool)) {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	w := frame.NewWriter(c)
	require.NoError(t, w.WriteHello([]byte(token)))
	require.NoError(t, w.Flush())
	r = frame.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	f, err := r.ReadFrame()
	require.NoError(t, err)
	require.Equal(t, frame.Credit, f.Type, "the initial credit")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if w.WriteHeartbeat() != nil || w.Flush() != nil {
					return
				}
			}
		}
	}()
	var stopped bool
	beat = func(bool) {
		if !stopped {
			stopped = true
			close(stop)
			<-done
		}
	}
	t.Cleanup(func() { beat(false) })
	return c, r, beat
}

// fillControl writes heartbeats until the caller holds some back for the
// deaf worker (its socket buffers are full), on another goroutine: with
// writes that wait for the worker, it would never return.
func fillControl(t *testing.T, in *Incoming) {
	t.Helper()
	in.mu.Lock() // set at attach, under mu
	conn, ctl := in.conn, in.ctl
	in.mu.Unlock()
	require.NoError(t, conn.(*net.TCPConn).SetWriteBuffer(4096))
	done := make(chan bool, 1)
	go func() {
		for i := 0; i < 20000; i++ {
			in.writeControl(func(w *frame.Writer) error { return w.WriteHeartbeat() })
			select {
			case <-ctl.flushed():
			default: // a backlog
				done <- true
				return
			}
		}
		done <- false
	}()
	select {
	case backlog := <-done:
		require.True(t, backlog, "the socket took 100 KB: the test's buffers are too large")
	case <-time.After(waitFor):
		t.Fatal("a control write waited for a worker that reads nothing")
	}
}

// TestKillNeverWaitsForADeafWorker: Stop and Kill are written on the
// cancelling goroutine, which is often a host's event loop. A worker that
// keeps the stream alive but stops reading it must not block them: they
// queue behind what the socket could not take.
func TestKillNeverWaitsForADeafWorker(t *testing.T) {
	in, c, r, beat := deafStream(t, time.Minute)

	t0 := time.Now()
	in.Stop()
	in.Kill()
	assert.Less(t, time.Since(t0), time.Second, "Stop and Kill waited for the worker")

	// The worker reads at last: the frames come in order, the Kill last,
	// then the caller's FIN (the half-close waited for the backlog).
	beat(false)
	types := framesUntilEOF(t, c, r)
	require.GreaterOrEqual(t, len(types), 2)
	for _, ty := range types[:len(types)-2] {
		require.Equal(t, frame.Heartbeat, ty)
	}
	assert.Equal(t, []frame.Type{frame.Stop, frame.Kill}, types[len(types)-2:])
}

// TestDeafWorkerIsGone: control frames left unread for the idle timeout
// end the stream (ErrPeerNotReading, an ErrIncomplete, so migration retries
// it), although the worker keeps sending heartbeats.
func TestDeafWorkerIsGone(t *testing.T) {
	in, _, _, _ := deafStream(t, 300*time.Millisecond)
	for i := 0; i < 2000; i++ { // 10 kB more than the socket took
		in.writeControl(func(w *frame.Writer) error { return w.WriteHeartbeat() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := in.Recv(ctx)
	require.ErrorIs(t, err, ErrPeerNotReading)
	require.ErrorIs(t, err, ErrIncomplete)
}

// TestControlBacklogIsBounded: a deaf worker cannot make the caller hold
// more than twice maxCtlBacklog bytes for it; past that the stream ends at
// once.
func TestControlBacklogIsBounded(t *testing.T) {
	in, _, _, _ := deafStream(t, time.Minute)
	// The backlog counts what waits behind the write in progress, which
	// holds at most as much again; the sockets' buffers may take a little
	// more meanwhile.
	written := 0
	for ; written <= 4*maxCtlBacklog && !in.deaf.Load(); written += frame.HeaderSize {
		in.writeControl(func(w *frame.Writer) error { return w.WriteHeartbeat() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := in.Recv(ctx)
	in.ctl.mu.Lock()
	werr, backlog := in.ctl.err, len(in.ctl.backlog)
	in.ctl.mu.Unlock()
	require.ErrorIs(t, err, ErrPeerNotReading, "after %d bytes; the writer's error %v, backlog %d", written, werr, backlog)
}

// attachedWorker is rawWorker after the caller's initial credit: the stream
// is attached. Its reads have a deadline of waitFor.
func attachedWorker(t *testing.T, s *Server, token string) (net.Conn, *frame.Writer, *frame.Reader) {
	t.Helper()
	c, w, r := rawWorker(t, s, token)
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	f, err := r.ReadFrame()
	require.NoError(t, err)
	require.Equal(t, frame.Credit, f.Type, "the initial credit")
	return c, w, r
}

// framesUntilEOF reads the types of the frames the caller sends until its
// FIN (waitFor at most).
func framesUntilEOF(t *testing.T, c net.Conn, r *frame.Reader) []frame.Type {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	var types []frame.Type
	for {
		f, err := r.ReadFrame()
		if err == io.EOF {
			return types
		}
		require.NoError(t, err, "after %d frames", len(types))
		types = append(types, f.Type)
	}
}

// deafStream is a stream whose worker stopped reading (deafWorker) after the
// caller's control frames filled the sockets' buffers (fillControl), with
// the given idle timeout; it is closed at the end of the test.
func deafStream(t *testing.T, idle time.Duration) (*Incoming, net.Conn, *frame.Reader, func(bool)) {
	t.Helper()
	s := listen(t)
	in := s.Expect("tok", WithIdleTimeout(idle))
	t.Cleanup(func() { in.Close() })
	c, r, beat := deafWorker(t, s, "tok")
	fillControl(t, in)
	return in, c, r, beat
}
