package plane_test

// Stop and kill across a request (docs/design.md, section 3): the caller's
// stop and kill, a parent's, a request cancelled before it is sent, and the
// handler that ends the request itself (stops it, fails), with the abort
// confirmed once the killed handler returns.

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// waitKilledHandler sends items, tells the test, waits until its request is
// killed and reports the context's state then.
func waitKilledHandler(items int, got chan<- *plane.Request, killed chan<- ctxState) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		for i := 0; i < items; i++ {
			if !w.Send(req, num(i)) {
				break
			}
		}
		got <- req
		<-req.Ctx.Killed()
		killed <- snapshot(req.Ctx)
	}
}

// killableStream serves path with a waitKilledHandler that sends n items,
// sends it a request as a child of parent and takes the n items, so that a
// kill then reaches an idle stream (a kill during a send is racy:
// TestKillDuringSendReachesHandler). It returns the worker,
// the caller's stream, the worker's request, and where the worker reports
// the state of the request's context once it is killed.
func killableStream(t *testing.T, path string, n int, parent *ctxtree.Context) (*planetest.Worker, *plane.Stream, *plane.Request, <-chan ctxState) {
	t.Helper()
	got, killed := make(chan *plane.Request, 1), make(chan ctxState, 1)
	_, w, c := planetest.ServeAndConnect(t, path, waitKilledHandler(n, got, killed))
	s := planetest.Generate(t, c, `{}`, parent)
	req := planetest.Recv(t, got, "the request")
	takeSeq(t, s, n)
	return w, s, req, killed
}

func TestParentKillKillsWorkerRequest(t *testing.T) {
	parent := ctxtree.New("frontend-1")
	_, s, req, killed := killableStream(t, "test.parentkill.generate", 3, parent)
	assert.Equal(t, "frontend-1", req.ID)
	assert.False(t, req.Ctx.IsStopped())

	parent.Kill()
	st := planetest.Recv(t, killed, "the worker's context to be killed")
	assert.Equal(t, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonKill}, st)
	assert.Equal(t, ctxtree.ReasonParent, s.Context().Reason())
	assert.True(t, s.Context().IsKilled())

	// A killed stream ends cleanly for the caller who killed it.
	_, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
}

// A kill of the parent right after Generate, before the worker even has the
// request, still reaches the worker's context: the child was linked before
// the request was sent.
func TestParentKillRightAfterGenerate(t *testing.T) {
	const path = "test.earlykill.generate"
	got, killed := make(chan *plane.Request, 8), make(chan ctxState, 8)
	_, _, c := planetest.ServeAndConnect(t, path, waitKilledHandler(0, got, killed))

	for i := range 5 {
		parent := ctxtree.New(fmt.Sprintf("early-%d", i))
		s := planetest.Generate(t, c, `{}`, parent)
		parent.Kill()
		req := planetest.Recv(t, got, "the request")
		assert.Equal(t, parent.ID(), req.ID)
		st := planetest.Recv(t, killed, "the worker's context to be killed")
		assert.True(t, st.killed)
		assert.Equal(t, ctxtree.ReasonKill, st.reason)
		_, _, err := planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}
}

func TestCallerStopGenerating(t *testing.T) {
	const path, n = "test.stop.generate", 100
	for _, via := range []string{"parent", "stream context"} {
		t.Run(via, func(t *testing.T) {
			sent := make(chan struct{}, 1)
			states := make(chan ctxState, 1)
			done := make(chan *plane.Request, 1)
			_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
				for i := 0; i < n; i++ {
					if !w.Send(req, num(i)) {
						return
					}
				}
				sent <- struct{}{}
				<-req.Ctx.Stopped()
				states <- snapshot(req.Ctx)
				// A producer may finish what it was doing: the tail still arrives.
				w.Send(req, num(n))
				req.Complete()
				done <- req
			})

			parent := ctxtree.New("stop-me")
			s := planetest.Generate(t, c, `{}`, parent)
			planetest.Recv(t, sent, "the handler to produce its items")
			// Nothing was taken yet: everything produced must still arrive.
			if via == "parent" {
				parent.StopGenerating()
			} else {
				s.Context().StopGenerating()
			}
			st := planetest.Recv(t, states, "the worker's context to be stopped")
			assert.Equal(t, ctxState{stopped: true, killed: false, reason: ctxtree.ReasonStopGenerating}, st)

			items, _, err := planetest.Drain(s, 0)
			assert.Equal(t, io.EOF, err, "a stopped stream ends without error")
			requireSeq(t, items, 0, n+1)
			req := planetest.Recv(t, done, "the handler to complete")
			assert.False(t, req.Ctx.IsKilled(), "a stop must never become a kill")
			assert.False(t, s.Context().IsKilled())
		})
	}
}

func TestCallerKill(t *testing.T) {
	_, s, _, killed := killableStream(t, "test.kill.generate", 50, ctxtree.New("kill-me"))
	s.Kill()
	s.Kill() // idempotent
	st := planetest.Recv(t, killed, "the worker's context to be killed")
	assert.Equal(t, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonKill}, st)
	assert.Equal(t, ctxtree.ReasonKill, s.Context().Reason())

	rest, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	assert.Empty(t, rest)
	assert.True(t, s.Finished())
}

func TestAlreadyCancelledBeforeGenerate(t *testing.T) {
	cases := []struct {
		name   string
		cancel func(*ctxtree.Context)
		want   ctxState
	}{
		{"stopped", (*ctxtree.Context).StopGenerating, ctxState{stopped: true, reason: ctxtree.ReasonStopGenerating}},
		{"killed", (*ctxtree.Context).Kill, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonKill}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const path = "test.precancelled.generate"
			seen := make(chan ctxState, 1)
			final := make(chan ctxState, 1)
			_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
				// The very first thing the handler sees.
				seen <- snapshot(req.Ctx)
				if !req.Ctx.IsStopped() {
					w.Send(req, []byte(`"should not be produced"`))
				}
				req.Complete()
				final <- snapshot(req.Ctx)
			})

			parent := ctxtree.New("pre-" + tc.name)
			tc.cancel(parent)
			s := planetest.Generate(t, c, `{}`, parent)
			assert.True(t, s.Context().IsStopped())

			assert.Equal(t, tc.want, planetest.Recv(t, seen, "the handler"))
			items, _, err := planetest.Drain(s, 0)
			assert.Equal(t, io.EOF, err)
			assert.Empty(t, items)
			assert.Equal(t, tc.want, planetest.Recv(t, final, "the handler to complete"))
		})
	}
}

func TestHandlerStopsItselfIsIncomplete(t *testing.T) {
	const path = "test.selfstop.generate"
	final := make(chan ctxState, 1)
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		for i := range 3 {
			w.Send(req, num(i))
		}
		req.Ctx.StopGenerating()
		req.Complete()
		final <- snapshot(req.Ctx)
	})

	s := planetest.Generate(t, c, `{}`, ctxtree.New("self-stop"))
	items, _, err := planetest.Drain(s, 0)
	requireSeq(t, items, 0, 3)
	require.ErrorIs(t, err, plane.ErrIncomplete)
	// Deliberate, so that migration can tell it from a crashed worker.
	assert.ErrorIs(t, err, transport.ErrStoppedByHandler)
	assert.True(t, strings.HasPrefix(err.Error(), "Stream ended before generation completed"), err.Error())
	assert.Equal(t, ctxState{stopped: true, reason: ctxtree.ReasonStopGenerating}, planetest.Recv(t, final, "the handler"))
	assert.False(t, s.Context().IsStopped(), "the caller's context is not cancelled by the worker's stop")
	// The end is sticky.
	_, err = s.Take(0)
	assert.ErrorIs(t, err, plane.ErrIncomplete)
}

func TestHandlerFail(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"RuntimeError: boom", "RuntimeError: boom"},
		{"", "unknown error"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			const path = "test.fail.generate"
			final := make(chan ctxState, 1)
			_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
				w.Send(req, num(0))
				w.Send(req, num(1))
				req.Fail(tc.msg)
				req.Complete() // after the end: ignored
				final <- snapshot(req.Ctx)
			})

			s := planetest.Generate(t, c, `{}`, ctxtree.New("fails"))
			items, _, err := planetest.Drain(s, 0)
			requireSeq(t, items, 0, 2)
			var he *transport.HandlerError
			require.ErrorAs(t, err, &he)
			assert.Equal(t, plane.HandlerErrorPrefix+tc.want, he.Message)
			assert.Equal(t, plane.HandlerErrorPrefix+tc.want, err.Error())
			assert.NotErrorIs(t, err, plane.ErrIncomplete)
			assert.Equal(t, ctxState{}, planetest.Recv(t, final, "the handler"), "a failure cancels nothing")
			assert.False(t, s.Context().IsStopped())
		})
	}
}

// A worker publishes an abort confirmation once the handler of a killed
// request has returned, and only then.
func TestAbortConfirmedAfterHandlerReturns(t *testing.T) {
	const path = "test.abort.generate"
	host := planetest.Embedded(t)
	confirmed := make(chan plane.AbortConfirmation, 4)
	unsubscribe, err := host.OnAbortConfirmed(func(a plane.AbortConfirmation) { confirmed <- a })
	require.NoError(t, err)
	t.Cleanup(unsubscribe)
	wrt := planetest.Join(t, host)
	got := make(chan *plane.Request, 1)
	release := make(chan struct{})
	w := planetest.Serve(t, wrt, path, func(w *planetest.Worker, req *plane.Request) {
		if string(req.Payload) != `"wait"` {
			req.Complete()
			return
		}
		got <- req
		<-req.Ctx.Killed()
		<-release // the engine takes a while to abort
	})
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)

	s := planetest.Generate(t, c, `"wait"`, ctxtree.New("abort-me"))
	req := planetest.Recv(t, got, "the request")
	s.Kill()
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	select {
	case a := <-confirmed:
		t.Fatalf("abort confirmed before the handler returned: %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	a := planetest.Recv(t, confirmed, "the abort confirmation")
	assert.Equal(t, plane.AbortConfirmation{ID: "abort-me", Key: s.Key(), Path: path, Instance: w.EP.InstanceID(), Reason: "kill"}, a)
	assert.Equal(t, s.Key(), req.Key, "the worker's request carries the caller's key")
	assert.Equal(t, w.EP.InstanceID(), s.Instance())
	_, _, err = planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)

	// A request that completes normally confirms nothing.
	s = planetest.Generate(t, c, `{}`, nil)
	_, _, err = planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	select {
	case a := <-confirmed:
		t.Fatalf("unexpected abort confirmation: %+v", a)
	case <-time.After(100 * time.Millisecond):
	}
}
