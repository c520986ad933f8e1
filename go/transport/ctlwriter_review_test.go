package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
