package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
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

// TestControlWriteErrorKeepsWhatArrived: a control write that fails because
// the worker's socket is gone (EPIPE, ECONNRESET) says nothing about a worker
// that stopped reading, and must not cut the reader short: frames the worker
// sent before it went away (here its Final) are already in the caller's
// receive queue and must still be delivered. The reader is held on mu (as a
// busy reader goroutine would be) while the worker sends its Final, resets
// the connection and a control frame is written.
func TestControlWriteErrorKeepsWhatArrived(t *testing.T) {
	s := listen(t)
	in := expect(t, s, "tok")
	c, w, _ := attachedWorker(t, s, "tok")

	require.NoError(t, w.WriteData(item(0)))
	require.NoError(t, w.Flush())
	for queued(in) == 0 {
		time.Sleep(time.Millisecond)
	}
	in.mu.Lock() // the reader stops with the next frame it reads
	require.NoError(t, w.WriteData(item(1)))
	require.NoError(t, w.Flush())
	time.Sleep(50 * time.Millisecond) // the reader took item 1 and waits for mu
	require.NoError(t, w.WriteFinal())
	require.NoError(t, w.Flush())
	require.NoError(t, c.(*net.TCPConn).SetLinger(0))
	require.NoError(t, c.Close()) // a reset: the worker process went away
	time.Sleep(50 * time.Millisecond)
	// A credit (or a heartbeat) written now fails: the connection is reset.
	in.writeControl(func(w *frame.Writer) error { return w.WriteCredit(1) })
	in.writeControl(func(w *frame.Writer) error { return w.WriteCredit(1) })
	in.mu.Unlock()

	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 2), got)
	assert.ErrorIs(t, err, io.EOF, "the Final in the receive queue was dropped")
	assert.False(t, errors.Is(err, ErrPeerNotReading), "a reset worker is not a deaf one: %v", err)
}

// TestServerCloseWithControlBacklog: Close returns at once while a Kill
// waits in the backlog of a deaf worker (the drain and the half-close
// waiting for it end with the connection), whatever the idle timeout.
func TestServerCloseWithControlBacklog(t *testing.T) {
	in, _, _, _ := deafStream(t, time.Minute)
	in.Stop()
	in.Kill()
	select {
	case <-in.ctl.flushed():
		t.Fatal("the backlog drained: the test's buffers are too large")
	default:
	}
	t0 := time.Now()
	require.NoError(t, in.srv.Close())
	assert.Less(t, time.Since(t0), time.Second, "Close waited for a deaf worker")
	_, err := in.Recv(context.Background())
	assert.ErrorIs(t, err, ErrKilled)
}

// TestDrainDeadlineDoesNotLeak: the write deadline of a drained backlog is
// cleared, so a direct write long after it still goes out.
func TestDrainDeadlineDoesNotLeak(t *testing.T) {
	in, c, r, _ := deafStream(t, 500*time.Millisecond)
	// The worker reads again, at once.
	types := make(chan frame.Type, 1<<16)
	go func() {
		defer close(types)
		for {
			_ = c.SetReadDeadline(time.Now().Add(waitFor))
			f, err := r.ReadFrame()
			if err != nil {
				return
			}
			types <- f.Type
		}
	}()
	select {
	case <-in.ctl.flushed():
	case <-time.After(waitFor):
		t.Fatal("the backlog never drained")
	}
	time.Sleep(time.Second) // twice the drain's deadline
	in.Stop()
	deadline := time.After(waitFor)
	for {
		select {
		case ty, ok := <-types:
			require.True(t, ok, "the worker's connection ended before the Stop")
			if ty == frame.Stop {
				assert.False(t, in.deaf.Load())
				in.Kill()
				for range types {
				}
				return
			}
		case <-deadline:
			t.Fatal("the Stop never arrived")
		}
	}
}

// TestControlOrderWithBacklog: credits, heartbeats, a Stop and the Kill
// written concurrently while a backlog forms and drains reach the worker
// whole and in an order where the Kill is last and the FIN follows it.
func TestControlOrderWithBacklog(t *testing.T) {
	for i := 0; i < 20 && !t.Failed(); i++ {
		t.Run("", func(t *testing.T) {
			in, c, r, beat := deafStream(t, time.Minute)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := 0; g < 3; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for k := 0; k < 300; k++ {
						in.writeControl(func(w *frame.Writer) error { return w.WriteCredit(3) })
					}
				}()
			}
			wg.Add(2)
			go func() { defer wg.Done(); <-start; in.Stop() }()
			go func() { defer wg.Done(); <-start; time.Sleep(time.Millisecond); in.Kill() }()
			close(start)
			beat(false)
			wg.Wait()
			got := framesUntilEOF(t, c, r)
			require.NotEmpty(t, got)
			require.Equal(t, frame.Kill, got[len(got)-1], "iteration %d", i)
			var stops, kills int
			for _, ty := range got {
				switch ty {
				case frame.Stop:
					stops++
				case frame.Kill:
					kills++
				}
			}
			assert.LessOrEqual(t, stops, 1)
			assert.Equal(t, 1, kills)
		})
	}
}
