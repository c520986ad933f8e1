package transport

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// outcomeOf registers KillOutcome and returns the channel its value arrives on.
func outcomeOf(in *Incoming) <-chan bool {
	ch := make(chan bool, 2) // 2: a second call would show as a test failure
	in.KillOutcome(func(aborted bool) { ch <- aborted })
	return ch
}

func wantOutcome(t *testing.T, ch <-chan bool, want bool) {
	t.Helper()
	select {
	case got := <-ch:
		assert.Equal(t, want, got)
	case <-time.After(waitFor):
		t.Fatalf("no kill outcome within %v", waitFor)
	}
	select {
	case <-ch:
		t.Fatal("the outcome was reported twice")
	case <-time.After(10 * time.Millisecond):
	}
}

// A Kill the worker reads before it ends the stream aborted it; one that
// crossed the worker's end frame, or came after the end, aborted nothing.
func TestKillOutcome(t *testing.T) {
	ctx := context.Background()
	t.Run("aborted", func(t *testing.T) {
		_, in, o := connect(t)
		attach(t, in, o)
		ch := outcomeOf(in) // registered before the kill: called at the worker's close
		in.Kill()
		waitClosed(t, o.Killed(), "Killed")
		assert.ErrorIs(t, o.Finish(), ErrKilled, "the worker sends no end frame after a Kill")
		wantOutcome(t, ch, true)
	})
	for _, end := range []string{"final", "error", "incomplete"} {
		t.Run("crossed "+end, func(t *testing.T) {
			_, in, o := connect(t)
			require.NoError(t, o.Send(ctx, item(0)))
			// The worker ends the stream; the caller kills before its reader
			// has seen the end frame (it is not consumed yet: the item
			// before it is still queued, so Recv has not returned the end).
			switch end {
			case "final":
				require.NoError(t, o.Finish())
			case "error":
				require.NoError(t, o.Fail("boom"))
			default:
				require.NoError(t, o.Incomplete("stopped"))
			}
			in.Kill()
			wantOutcome(t, outcomeOf(in), false)
			waitClosed(t, o.Done(), "Done")
		})
	}
	t.Run("after the end", func(t *testing.T) {
		_, in, o := connect(t)
		require.NoError(t, o.Finish())
		_, err := recvAll(t, in)
		require.Equal(t, io.EOF, err)
		ch := outcomeOf(in)
		in.Kill()
		wantOutcome(t, ch, false)
	})
	t.Run("no worker ever connected", func(t *testing.T) {
		s := listen(t)
		in := s.Expect("tok", WithConnectTimeout(50*time.Millisecond))
		defer in.Close()
		in.Kill()
		wantOutcome(t, outcomeOf(in), false) // at the connect timeout: no worker had it
	})
	t.Run("closed before the worker connected", func(t *testing.T) {
		s := listen(t)
		in := s.Expect("tok")
		ch := outcomeOf(in)
		require.NoError(t, in.Close())
		select {
		case <-ch:
			t.Fatal("the outcome waits for the worker's connection")
		case <-time.After(20 * time.Millisecond):
		}
		o := dial(t, s, "tok") // the worker still reads the Kill
		waitClosed(t, o.Killed(), "Killed")
		wantOutcome(t, ch, true)
	})
	t.Run("worker connects after the kill", func(t *testing.T) {
		s := listen(t)
		in := expect(t, s, "tok")
		in.Kill()
		ch := outcomeOf(in)
		o := dial(t, s, "tok")
		waitClosed(t, o.Killed(), "Killed")
		wantOutcome(t, ch, true)
	})
	t.Run("worker crashed", func(t *testing.T) {
		s := listen(t)
		in := expect(t, s, "tok")
		c, _, _ := rawWorker(t, s, "tok")
		time.Sleep(10 * time.Millisecond)
		in.Kill()
		ch := outcomeOf(in)
		_ = c.Close() // gone without an end frame
		wantOutcome(t, ch, true)
	})
}

// On a session, the worker's reader closes the stream (its Fin) when it
// reads the caller's Kill and Fin, which can happen while the worker's end
// frame is on its way into the stream, between Write's check of the
// stream and its queueing. The end frame must then fail with ErrKilled, as
// the caller sees a Fin without it: the Kill aborted the request on both
// sides. (Queued behind the Fin, the frame was dropped by the caller while
// Finish reported it sent: the caller said aborted, the worker did not.)
func TestKillOutcomeStreamClosedDuringEnd(t *testing.T) {
	if *ownConnections {
		t.Skip("a stream of a session only")
	}
	_, in, o := connect(t)
	attach(t, in, o)
	ch := outcomeOf(in)
	inWrite, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	stream := o.conn.(*vstream) // attached: no redial from here on
	hook := func(v *vstream) {
		if v != stream {
			return // the caller's writes (its Kill), and any other stream's
		}
		once.Do(func() {
			close(inWrite)
			<-release
		})
	}
	testHookWriteChecked.Store(&hook)
	defer testHookWriteChecked.Store(nil)
	endErr := make(chan error, 1)
	go func() { endErr <- o.Finish() }()
	waitClosed(t, inWrite, "the end frame's write")
	in.Kill()
	waitClosed(t, o.Done(), "Done") // the worker read the Kill and the caller's Fin, and closed the stream
	close(release)
	select {
	case err := <-endErr:
		assert.ErrorIs(t, err, ErrKilled, "the end frame went nowhere: the Kill aborted the request")
	case <-time.After(waitFor):
		t.Fatal("Finish did not return")
	}
	wantOutcome(t, ch, true)
}

// Both sides agree, however the Kill and the worker's end cross: the caller's
// outcome is true exactly when the worker's end failed with ErrKilled.
func TestKillOutcomeRace(t *testing.T) {
	s := listen(t)
	mismatch, aborted := 0, 0
	const runs = 500
	for i := 0; i < runs; i++ {
		in := s.Expect("tok")
		o := dial(t, s, "tok")
		attach(t, in, o)
		ch := outcomeOf(in)
		endErr := make(chan error, 1)
		go func() {
			if i%3 == 0 {
				time.Sleep(time.Duration(i%7) * 10 * time.Microsecond)
			}
			endErr <- o.Finish()
		}()
		if i%2 == 0 {
			time.Sleep(time.Duration(i%11) * 10 * time.Microsecond)
		}
		in.Kill()
		var got bool
		select {
		case got = <-ch:
		case <-time.After(waitFor):
			t.Fatalf("run %d: no kill outcome", i)
		}
		err := <-endErr
		if err != nil {
			// Whatever made the end frame fail, it was the Kill.
			require.ErrorIs(t, err, ErrKilled, "run %d", i)
		}
		workerAborted := err != nil
		if got != workerAborted {
			mismatch++
		}
		if got {
			aborted++
		}
		<-o.Done()
		in.Close()
	}
	assert.Zero(t, mismatch, "outcomes that disagree with the worker (of %d; %d aborted)", runs, aborted)
	t.Logf("%d of %d kills aborted the request", aborted, runs)
}
