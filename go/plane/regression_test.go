package plane_test

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// Regression tests of bugs found and fixed: kills racing sends, streams
// held by full buffers, errors of a closed runtime.

const (
	streamRun  = "plane.(*Stream).run"
	requestRun = "plane.(*Request).run"
)

// drainAll takes whatever is left so that a failed test releases what the
// bug held, and returns the terminal error.
func drainAll(s *plane.Stream) error {
	_, _, err := planetest.Drain(s, 0)
	return err
}

// killedOrKill waits a moment for req's context to be killed, and kills it
// when it is not (TestBugKillDuringSendMayNotReachHandler), so that a flood
// handler returns either way.
func killedOrKill(req *plane.Request) {
	select {
	case <-req.Ctx.Killed():
	case <-time.After(time.Second):
		req.Ctx.Kill()
	}
}

// A caller that shuts its runtime down while its stream's buffer is full
// (the consumer stopped taking) leaves the stream's goroutine blocked
// forever: Stream.run waits on s.wake, which only Take and Stream.Kill poke.
func TestRegressionCallerCloseWithFullBufferLeaksStreamGoroutine(t *testing.T) {
	const path = "test.bugclose.generate"
	host := planetest.Embedded(t)
	f := newFlood(100000)
	planetest.Serve(t, host, path, f.handle)
	crt := planetest.Join(t, host)
	c := planetest.Client(t, crt, path)
	planetest.WaitInstances(t, c, 1)

	s, req, _ := f.start(t, c, nil)

	crt.Close()
	killedOrKill(req)
	assert.True(t, planetest.GoroutineGone(streamRun, 2*time.Second),
		"Stream.run still running after its runtime was closed")
	assert.Error(t, drainAll(s))
}

// Same, through a kill of the caller's parent context: the worker is killed,
// but the stream's goroutine stays blocked until someone Takes.
func TestRegressionParentKillWithFullBufferLeaksStreamGoroutine(t *testing.T) {
	const path = "test.bugparent.generate"
	f := newFlood(100000)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	parent := ctxtree.New("frontend")
	s, req, _ := f.start(t, c, parent)

	parent.Kill()
	killedOrKill(req)
	assert.True(t, planetest.GoroutineGone(streamRun, 2*time.Second),
		"Stream.run still running after its request was killed")
	assert.Equal(t, io.EOF, drainAll(s))
}

// A caller's kill (or loss) that arrives while Request.run is in
// Outgoing.SendBatch makes SendBatch fail; run then returns and cancels the
// context of its control goroutine, which selects at random between that
// cancellation and out.Killed()/out.Lost(). When it picks the former, the
// request's context is never killed: the handler's Sends become silent
// no-ops and it keeps generating to its natural end ("requests that keep
// generating after the client left").
func TestRegressionKillDuringSendMayNotReachHandler(t *testing.T) {
	for _, how := range []string{"kill", "caller lost"} {
		t.Run(how, func(t *testing.T) {
			const path, tries = "test.bugkillsend.generate", 100
			host := planetest.Embedded(t)
			f := newFlood(1 << 30)
			planetest.Serve(t, host, path, f.handle)
			missed := 0
			for range tries {
				crt := planetest.Join(t, host)
				c := planetest.Client(t, crt, path)
				planetest.WaitInstances(t, c, 1)
				s := planetest.Generate(t, c, `{}`, nil)
				req := planetest.Recv(t, f.reqs, "the request")
				// The caller consumes as fast as it can: the handler streams
				// at full speed and Request.run is in SendBatch most of the time.
				drained := make(chan struct{})
				go func() { defer close(drained); _ = drainAll(s) }()
				for base := f.sent.Load(); f.sent.Load() < base+2000; {
					time.Sleep(time.Millisecond)
				}
				want := ctxtree.ReasonKill
				if how == "kill" {
					s.Kill()
				} else {
					want = ctxtree.ReasonConnectionLost
					crt.Close()
				}
				select {
				case <-req.Ctx.Killed():
					assert.Equal(t, want, req.Ctx.Reason())
				case <-time.After(time.Second):
					missed++
					// The handler runs on with Sends that drop everything.
					req.Ctx.Kill()
				}
				<-drained
				crt.Close()
			}
			assert.Zero(t, missed, "the worker's context was not killed in %d of %d tries", missed, tries)
		})
	}
}

// A worker runtime shut down while its handler's stream is blocked on the
// caller's flow control (the caller does not read) kills the request's
// context, but Request.run stays blocked in Outgoing.SendBatch: nothing
// makes the send give up on a kill that comes from the worker's side, so the
// stream is not ended and the goroutines of the request outlive
// Runtime.Close until the caller reads or goes away.
func TestRegressionWorkerCloseWithSlowCallerLeavesRequestRunning(t *testing.T) {
	const path = "test.bugshutdown.generate"
	f := newFlood(100000)
	_, w, c := planetest.ServeAndConnect(t, path, f.handle)

	s, req, sent := f.start(t, c, nil)

	w.RT.Close()
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	assert.Equal(t, ctxtree.ReasonShutdown, req.Ctx.Reason())
	assert.True(t, planetest.GoroutineGone(requestRun, 2*time.Second),
		"Request.run still running after the worker's runtime was closed")

	items, _, err := planetest.Drain(s, 0)
	assert.ErrorIs(t, err, plane.ErrIncomplete)
	assert.LessOrEqual(t, int64(len(items)), sent)
	assert.False(t, errors.Is(err, io.EOF))
}
