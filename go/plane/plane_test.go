package plane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ctxState is a snapshot of a request context, taken by a handler.
type ctxState struct {
	stopped, killed bool
	reason          ctxtree.Reason
}

func snapshot(c *ctxtree.Context) ctxState {
	return ctxState{stopped: c.IsStopped(), killed: c.IsKilled(), reason: c.Reason()}
}

// countHandler sends the number of items asked for in {"n": N}, 0..N-1,
// then completes.
func countHandler(w *planetest.Worker, req *plane.Request) {
	var p struct {
		N int `json:"n"`
	}
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		req.Fail(fmt.Sprintf("ValueError: %v", err))
		return
	}
	for i := 0; i < p.N; i++ {
		if !w.Send(req, num(i)) {
			return
		}
	}
	req.Complete()
}

func TestRoundTripManyItemsInOrder(t *testing.T) {
	const path, n, maxTake = "test.roundtrip.generate", 12000, 100
	_, _, c := planetest.ServeAndConnect(t, path, countHandler)

	s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
	items, batches, err := planetest.Drain(s, maxTake)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, n)

	largest := 0
	for _, b := range batches {
		require.LessOrEqual(t, b, maxTake, "Take returned more than asked for")
		require.Positive(t, b)
		largest = max(largest, b)
	}
	assert.Greater(t, largest, 1, "Take never batched (%d Takes for %d items)", len(batches), n)
	assert.Less(t, len(batches), n, "one Take per item: no batching")

	// The end is sticky and the stream reports itself finished.
	assert.True(t, s.Finished())
	_, err = s.Take(10)
	assert.Equal(t, io.EOF, err)
	assert.NoError(t, s.Started())
	// The request's context was neither stopped nor killed by a normal end.
	assert.False(t, s.Context().IsStopped())
}

func TestTakeHonoursMax(t *testing.T) {
	const path, n = "test.take.generate", 300
	_, _, c := planetest.ServeOnHost(t, path, countHandler)

	for _, max := range []int{1, 7} {
		s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
		items, batches, err := planetest.Drain(s, max)
		require.Equal(t, io.EOF, err)
		requireSeq(t, items, 0, n)
		for _, b := range batches {
			require.LessOrEqual(t, b, max)
		}
	}
	// max <= 0 means "as many as allowed".
	s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, n)
}

// idHandler hands its request to the test and completes.
func idHandler(got chan<- *plane.Request) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		got <- req
		req.Complete()
	}
}

func TestRequestIDRelayedFromParent(t *testing.T) {
	const path = "test.id.generate"
	got := make(chan *plane.Request, 1)
	release := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		got <- req
		<-release // the request stays in flight until the link is checked
		req.Complete()
	})

	parent := ctxtree.New("req-42")
	s := planetest.Generate(t, c, `{"prompt":"hi"}`, parent)
	// The request's context is a new child of the parent, with its id,
	// linked before Generate returned.
	assert.NotSame(t, parent, s.Context())
	assert.Equal(t, "req-42", s.Context().ID())
	assert.Equal(t, 1, parent.NumChildren())

	req := planetest.Recv(t, got, "the request")
	assert.Equal(t, "req-42", req.ID)
	assert.Equal(t, "req-42", req.Ctx.ID())
	assert.JSONEq(t, `{"prompt":"hi"}`, string(req.Payload))

	close(release)
	_, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	// A finished request is unlinked, so a long-lived parent does not grow.
	assert.Equal(t, 0, parent.NumChildren())
	assert.False(t, parent.IsStopped())
}

func TestFreshIDWithoutParent(t *testing.T) {
	const path = "test.freshid.generate"
	got := make(chan *plane.Request, 2)
	_, _, c := planetest.ServeOnHost(t, path, idHandler(got))

	var ids []string
	for range 2 {
		s := planetest.Generate(t, c, `{}`, nil)
		id := s.Context().ID()
		assert.Regexp(t, planetest.UUID, id)
		req := planetest.Recv(t, got, "the request")
		assert.Equal(t, id, req.ID)
		assert.Equal(t, id, req.Ctx.ID())
		_, _, err := planetest.Drain(s, 0)
		require.Equal(t, io.EOF, err)
		ids = append(ids, id)
	}
	assert.NotEqual(t, ids[0], ids[1])
}

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
// TestRegressionKillDuringSendMayNotReachHandler). It returns the worker,
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

// Shutting the worker's runtime down kills the requests it serves with
// ReasonShutdown; the caller, who cancelled nothing, sees an incomplete
// stream (which migration retries).
func TestWorkerRuntimeCloseMidStream(t *testing.T) {
	w, s, _, killed := killableStream(t, "test.workerclose.generate", 10, ctxtree.New("shutdown"))

	w.RT.Close()
	assert.True(t, planetest.ClosedWithin(w.RT.Done()))
	assert.True(t, planetest.ClosedWithin(w.EP.Done()))
	st := planetest.Recv(t, killed, "the worker's context to be killed")
	assert.Equal(t, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonShutdown}, st)

	rest, _, err := planetest.Drain(s, 0)
	assert.Empty(t, rest)
	assert.ErrorIs(t, err, plane.ErrIncomplete)
	assert.False(t, s.Context().IsStopped())

	// The instance left discovery with the endpoint.
	_, err = w.EP.Accept()
	assert.ErrorIs(t, err, plane.ErrClosed)
}

// Closing the caller's runtime (its stream server goes away, as when its
// process dies) kills the worker's request with ReasonConnectionLost.
func TestCallerRuntimeCloseIsConnectionLost(t *testing.T) {
	const path = "test.callerclose.generate"
	host := planetest.Embedded(t)
	got, killed := make(chan *plane.Request, 1), make(chan ctxState, 1)
	planetest.Serve(t, host, path, waitKilledHandler(5, got, killed))
	crt := planetest.Join(t, host)
	c := planetest.Client(t, crt, path)
	planetest.WaitInstances(t, c, 1)

	s := planetest.Generate(t, c, `{}`, ctxtree.New("caller-dies"))
	planetest.Recv(t, got, "the request")
	takeSeq(t, s, 5)

	crt.Close()
	st := planetest.Recv(t, killed, "the worker's context to be killed")
	assert.Equal(t, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonConnectionLost}, st)

	// The caller's own stream ends with the stream server's closing error.
	_, _, err := planetest.Drain(s, 0)
	assert.ErrorIs(t, err, transport.ErrServerClosed)
	assert.NotErrorIs(t, err, plane.ErrIncomplete)

	_, err = c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrClosed)
}

func TestDirectToUnknownInstanceIsNoResponders(t *testing.T) {
	const path = "test.direct.generate"
	_, w, c := planetest.ServeOnHost(t, path, countHandler)
	require.Equal(t, []uint64{w.EP.InstanceID()}, c.InstanceIDs())

	// Direct to the live instance works.
	s := planetest.GenerateRoute(t, c, `{"n":3}`, nil, plane.Direct, w.EP.InstanceID())
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, 3)

	// Direct to an instance that never existed fails at once, well before
	// any acknowledgement timeout.
	parent := ctxtree.New("lost")
	begin := time.Now()
	s = planetest.GenerateRoute(t, c, `{}`, parent, plane.Direct, w.EP.InstanceID()+1)
	err = planetest.WaitStarted(s)
	assert.ErrorIs(t, err, plane.ErrNoResponders)
	assert.Less(t, time.Since(begin), 3*time.Second)
	_, err = s.Take(0)
	assert.ErrorIs(t, err, plane.ErrNoResponders)
	assert.True(t, s.Finished())
	assert.Equal(t, 0, parent.NumChildren(), "a failed request is unlinked from its parent")

	// So does Direct to an instance that closed.
	id := w.EP.InstanceID()
	w.EP.Close()
	s = planetest.GenerateRoute(t, c, `{}`, nil, plane.Direct, id)
	assert.ErrorIs(t, planetest.WaitStarted(s), plane.ErrNoResponders)
}

func TestNoInstances(t *testing.T) {
	const path = "test.none.generate"
	host := planetest.Embedded(t)
	c := planetest.Client(t, host, path)
	assert.Empty(t, c.InstanceIDs())
	for _, route := range []plane.Route{plane.RoundRobin, plane.Random} {
		s := planetest.GenerateRoute(t, c, `{}`, nil, route, 0)
		err := planetest.WaitStarted(s)
		assert.ErrorIs(t, err, plane.ErrNoInstances)
		assert.ErrorIs(t, err, plane.ErrNoResponders, "migration must see it as no responders")
		_, err = s.Take(0)
		assert.ErrorIs(t, err, plane.ErrNoInstances)
	}
}

// A worker whose process dies (here: its NATS connection drops without the
// lease's "down") disappears from discovery once its lease expires, and
// requests to it fail at once with no responders.
func TestDeadWorkerLeaseExpires(t *testing.T) {
	const path = "test.expiry.generate"
	_, w, c := planetest.ServeAndConnect(t, path, countHandler, planetest.ShortLeases)
	require.Equal(t, []uint64{w.EP.InstanceID()}, c.InstanceIDs())

	// Heartbeats keep a live instance well past its TTL.
	time.Sleep(3 * 300 * time.Millisecond)
	require.Equal(t, []uint64{w.EP.InstanceID()}, c.InstanceIDs())

	w.RT.Bus().Conn().Close() // a crash: no "down" is ever sent
	begin := time.Now()
	for len(c.InstanceIDs()) > 0 {
		require.Less(t, time.Since(begin), planetest.WaitLimit, "dead instance never expired")
		time.Sleep(10 * time.Millisecond)
	}
	// TTL 300 ms, checked every TTL/4: well under a second.
	assert.Less(t, time.Since(begin), 2*time.Second)

	s := planetest.GenerateRoute(t, c, `{}`, nil, plane.Direct, w.EP.InstanceID())
	assert.ErrorIs(t, planetest.WaitStarted(s), plane.ErrNoResponders)
	s = planetest.Generate(t, c, `{}`, nil)
	assert.ErrorIs(t, planetest.WaitStarted(s), plane.ErrNoInstances)
}

// A handler that produces far more than the buffers hold while the caller
// takes nothing: Send reports ErrFull, the number of items in flight stays
// bounded, and once the caller takes, everything arrives in order.
func TestFlowControlBoundsMemory(t *testing.T) {
	const path, total = "test.flow.generate", 20000
	// Send buffer, the batch the worker is writing, the caller's stream
	// window and the client stream's buffer: 256 items each.
	const bound = 4 * 256
	f := newFlood(total)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	s, _, queued := f.start(t, c, nil)
	assert.Positive(t, f.full.Load(), "Send never reported ErrFull")
	assert.LessOrEqual(t, queued, int64(bound), "items queued while the caller does not read")
	assert.GreaterOrEqual(t, queued, int64(256), "the pipeline should hold at least one buffer")

	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, total)
	assert.Equal(t, int64(total), f.sent.Load())
}

// Killing a stream whose buffer is full (the consumer stopped taking, as
// when Python drops an unfinished stream) releases everything: the worker's
// request is killed and the stream's goroutine ends without another Take.
func TestKillWithFullBufferReleasesStream(t *testing.T) {
	const path, tries = "test.killfull.generate", 3
	f := newFlood(100000)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	for range tries {
		f.sent.Store(0)
		f.full.Store(0)
		s, _, _ := f.start(t, c, nil)
		s.Kill()
		// Whether the worker's context is killed here is racy (see
		// TestBugKillDuringSendMayNotReachHandler); this test is about the
		// caller's side.
		assert.True(t, planetest.GoroutineGone("plane.(*Stream).run", 2*time.Second),
			"the stream's goroutine outlived its Kill")
		_, _, err := planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}
}

func TestArmEndpoint(t *testing.T) {
	const path = "test.armep.generate"
	host := planetest.Embedded(t)
	ep, err := host.Serve(path, nil)
	require.NoError(t, err)
	t.Cleanup(ep.Close)
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)

	_, err = ep.Accept()
	require.ErrorIs(t, err, plane.ErrAgain)

	// Nothing pending: the function waits.
	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	ep.Arm(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())

	// It fires once when a request arrives...
	s1 := planetest.Generate(t, c, `{}`, nil)
	planetest.Recv(t, ch, "the endpoint's Arm")
	r1, err := ep.Accept()
	require.NoError(t, err)
	// ...and not again for the next one (it is one-shot).
	s2 := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitArm(ep.Arm))
	r2, err := ep.Accept()
	require.NoError(t, err)
	assert.Equal(t, int32(1), fired.Load())
	assert.NotEqual(t, r1.ID, r2.ID)

	// With a request pending it fires at once, on the calling goroutine.
	s3 := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitArm(ep.Arm))
	now := false
	ep.Arm(func() { now = true })
	assert.True(t, now)
	r3, err := ep.Accept()
	require.NoError(t, err)

	for _, r := range []*plane.Request{r1, r2, r3} {
		r.Complete()
	}
	for _, s := range []*plane.Stream{s1, s2, s3} {
		_, _, err := planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}

	// An Arm pending at Close fires; after Close it fires at once and
	// Accept reports ErrClosed.
	closedFired := make(chan struct{}, 1)
	ep.Arm(func() { closedFired <- struct{}{} })
	ep.Close()
	planetest.Recv(t, closedFired, "the Arm pending at Close")
	now = false
	ep.Arm(func() { now = true })
	assert.True(t, now)
	_, err = ep.Accept()
	assert.ErrorIs(t, err, plane.ErrClosed)
}

func TestArmStreamAndRequest(t *testing.T) {
	const path = "test.armstream.generate"
	reqs := make(chan *plane.Request, 1)
	goOn := make(chan int)
	finished := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		// Room in the buffer: Request.Arm fires at once.
		now := false
		req.Arm(func() { now = true })
		if !now {
			req.Fail("AssertionError: Request.Arm did not fire at once with room in the buffer")
			return
		}
		reqs <- req
		for i := range goOn {
			w.Send(req, num(i))
		}
		req.Complete()
		// After the end: at once as well.
		now = false
		req.Arm(func() { now = true })
		if now {
			close(finished)
		}
	})

	s := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitStarted(s))
	planetest.Recv(t, reqs, "the request")

	// Started was seen and nothing is buffered: Arm waits.
	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	s.Arm(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())
	_, err := s.Take(0)
	assert.ErrorIs(t, err, plane.ErrAgain)

	goOn <- 0
	planetest.Recv(t, ch, "the stream's Arm")
	items, err := s.Take(0)
	require.NoError(t, err)
	requireSeq(t, items, 0, 1)

	// One-shot: the next item does not fire it again.
	goOn <- 1
	require.NoError(t, planetest.WaitArm(s.Arm))
	// With an item buffered, Arm fires at once on the calling goroutine.
	now := false
	s.Arm(func() { now = true })
	assert.True(t, now)
	items, err = s.Take(0)
	require.NoError(t, err)
	requireSeq(t, items, 1, 1)
	assert.Equal(t, int32(1), fired.Load())

	close(goOn)
	_, _, err = planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	// After the end, Arm fires at once.
	now = false
	s.Arm(func() { now = true })
	assert.True(t, now)
	assert.True(t, planetest.ClosedWithin(finished), "Request.Arm did not fire at once after Complete")
}

func TestArmInstances(t *testing.T) {
	const path = "test.arminst.generate"
	host := planetest.Embedded(t)
	c := planetest.Client(t, host, path)

	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	c.ArmInstances(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())

	w := planetest.Serve(t, host, path, countHandler)
	planetest.Recv(t, ch, "ArmInstances")
	assert.Equal(t, []uint64{w.EP.InstanceID()}, c.InstanceIDs())

	now := false
	c.ArmInstances(func() { now = true })
	assert.True(t, now)

	// A client that closes releases its waiters.
	other := planetest.Client(t, host, "test.arminst.nobody")
	closed := make(chan struct{}, 1)
	other.ArmInstances(func() { closed <- struct{}{} })
	other.Close()
	planetest.Recv(t, closed, "ArmInstances at Close")
	_, err := other.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrClosed)
	assert.Equal(t, int32(1), fired.Load())
}

// Fifty streams at once on one client: every handler waits until all fifty
// requests are being served before it produces anything.
func TestConcurrentStreams(t *testing.T) {
	const path, streams, n = "test.concurrent.generate", 50, 300
	var arrived atomic.Int32
	all := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		if arrived.Add(1) == streams {
			close(all)
		}
		select {
		case <-all:
		case <-req.Ctx.Killed():
			return
		}
		for i := 0; i < n; i++ {
			if !w.Send(req, []byte(fmt.Sprintf(`{"id":%q,"i":%d}`, req.ID, i))) {
				return
			}
		}
		req.Complete()
	})

	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for k := range streams {
		id := fmt.Sprintf("req-%d", k)
		s := planetest.Generate(t, c, `{}`, ctxtree.New(id))
		wg.Add(1)
		go func() {
			defer wg.Done()
			items, _, err := planetest.Drain(s, 64)
			if err != io.EOF {
				errs <- fmt.Errorf("%s: ended with %v", id, err)
				return
			}
			if len(items) != n {
				errs <- fmt.Errorf("%s: %d items, want %d", id, len(items), n)
				return
			}
			for i, it := range items {
				var v struct {
					ID string `json:"id"`
					I  int    `json:"i"`
				}
				if err := json.Unmarshal(it, &v); err != nil || v.ID != id || v.I != i {
					errs <- fmt.Errorf("%s: item %d is %s", id, i, it)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, int32(streams), arrived.Load())
}

// nameHandler is a worker that answers every request with its name, a JSON string.
func nameHandler(name string) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		w.Send(req, []byte(fmt.Sprintf("%q", name)))
		req.Complete()
	}
}

func TestRoundRobinAndDirectAcrossInstances(t *testing.T) {
	const path, rounds = "test.rr.generate", 10
	host := planetest.Embedded(t)
	wrt := planetest.Join(t, host)
	a := planetest.Serve(t, wrt, path, nameHandler("a"))
	b := planetest.Serve(t, wrt, path, nameHandler("b"))
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)
	byID := map[uint64]string{a.EP.InstanceID(): "a", b.EP.InstanceID(): "b"}

	one := func(route plane.Route, id uint64) string {
		s := planetest.GenerateRoute(t, c, `{}`, nil, route, id)
		items, _, err := planetest.Drain(s, 0)
		require.Equal(t, io.EOF, err)
		require.Len(t, items, 1)
		var tag string
		require.NoError(t, json.Unmarshal(items[0], &tag))
		return tag
	}
	counts := map[string]int{}
	for range rounds {
		counts[one(plane.RoundRobin, 0)]++
	}
	assert.Equal(t, map[string]int{"a": rounds / 2, "b": rounds / 2}, counts)
	for id, tag := range byID {
		assert.Equal(t, tag, one(plane.Direct, id))
	}
	tag := one(plane.Random, 0)
	assert.Contains(t, []string{"a", "b"}, tag)
}

func TestValidation(t *testing.T) {
	const path = "test.valid.generate"
	for _, p := range []string{"a.b", "a.b.c.d", "a..c", "a.b.c d", "a.*.c", "a.b.>", ""} {
		assert.Error(t, plane.ValidatePath(p), p)
	}
	assert.NoError(t, plane.ValidatePath("ns.comp.ep"))

	host := planetest.Embedded(t)
	_, err := host.Serve("not-a-path", nil)
	assert.Error(t, err)
	_, err = host.Client(context.Background(), "not.a-path")
	assert.Error(t, err)

	sendErr := make(chan error, 1)
	w := planetest.Serve(t, host, path, func(w *planetest.Worker, req *plane.Request) {
		sendErr <- req.Send([]byte("{not json"))
		req.Complete()
	})
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)
	_, err = c.Generate([]byte("{not json"), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrNotJSON)

	s := planetest.Generate(t, c, `"a JSON string is a request too"`, nil)
	assert.ErrorIs(t, planetest.Recv(t, sendErr, "the handler's Send"), plane.ErrNotJSON)
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	assert.Empty(t, items)

	// A malformed envelope is refused, not crashed on.
	msg, err := host.Bus().Conn().Request(discovery.RequestSubject(path, w.EP.InstanceID()), []byte("garbage"), planetest.WaitLimit)
	require.NoError(t, err)
	assert.Contains(t, string(msg.Data), "malformed request envelope")
	assert.Equal(t, path, w.EP.Path())
}

func TestClosedRuntime(t *testing.T) {
	const path = "test.closed.generate"
	host := planetest.Embedded(t)
	rt := planetest.Join(t, host)
	c := planetest.Client(t, rt, path)
	rt.Close()
	rt.Close() // idempotent
	assert.True(t, planetest.ClosedWithin(rt.Done()))

	_, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrClosed)
	_, err = rt.Serve(path, nil)
	assert.Error(t, err)
	_, err = rt.Client(context.Background(), path)
	assert.Error(t, err)
}

// Serve and Client on a shut-down runtime return ErrClosed, as documented.
func TestClosedRuntimeReturnsErrClosed(t *testing.T) {
	const path = "test.closederr.generate"
	host := planetest.Embedded(t)
	rt := planetest.Join(t, host)
	rt.Close()
	_, err := rt.Serve(path, nil)
	assert.ErrorIs(t, err, plane.ErrClosed)
	_, err = rt.Client(context.Background(), path)
	assert.ErrorIs(t, err, plane.ErrClosed)
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

func TestInstanceFilter(t *testing.T) {
	const path = "test.filter.generate"
	host := planetest.Embedded(t)
	wrt := planetest.Join(t, host)
	planetest.Serve(t, wrt, path, nameHandler("a"), planetest.WithMetadata([]byte(`{"model":"a"}`)))
	epB := planetest.Serve(t, wrt, path, nameHandler("b"), planetest.WithMetadata([]byte(`{"model":"b"}`))).EP
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)

	c.SetInstanceFilter(func(meta []byte) bool { return strings.Contains(string(meta), `"b"`) })
	assert.Equal(t, []uint64{epB.InstanceID()}, c.InstanceIDs())
	for range 4 {
		s := planetest.Generate(t, c, `{}`, nil)
		items, _, err := planetest.Drain(s, 0)
		require.Equal(t, io.EOF, err)
		require.Len(t, items, 1)
		assert.Equal(t, `"b"`, string(items[0]))
	}
	c.SetInstanceFilter(func([]byte) bool { return false })
	assert.Empty(t, c.InstanceIDs())
	assert.ErrorIs(t, planetest.WaitStarted(planetest.Generate(t, c, `{}`, nil)), plane.ErrNoInstances)
	c.SetInstanceFilter(nil)
	assert.Len(t, c.InstanceIDs(), 2)
}

func TestNextForGoConsumers(t *testing.T) {
	const path = "test.next.generate"
	host, _, c := planetest.ServeOnHost(t, path, countHandler)

	s := planetest.Generate(t, c, `{"n":500}`, nil)
	var items [][]byte
	for {
		it, err := s.Next(context.Background())
		if err != nil {
			require.Equal(t, io.EOF, err)
			break
		}
		items = append(items, it)
	}
	requireSeq(t, items, 0, 500)

	// A done ctx returns its error and leaves the stream alone.
	hold := make(chan struct{})
	planetest.Serve(t, host, "test.next.hold", func(w *planetest.Worker, req *plane.Request) {
		select {
		case <-hold:
		case <-req.Ctx.Killed():
		}
	})
	c2 := planetest.Client(t, host, "test.next.hold")
	planetest.WaitInstances(t, c2, 1)
	s = planetest.Generate(t, c2, `{}`, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.Next(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	close(hold)
	_, err = s.Next(context.Background())
	assert.Equal(t, io.EOF, err)
}

// Endpoint.Next is the blocking Accept for Go consumers: it returns ctx's
// error when ctx ends first, and ErrClosed once the endpoint is closed.
func TestEndpointNext(t *testing.T) {
	host := planetest.Embedded(t)
	ep, err := host.Serve("test.next.generate", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ep.Next(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	ep.Close()
	_, err = ep.Next(context.Background())
	assert.ErrorIs(t, err, plane.ErrClosed)
}

// A client made by Filtered lists, from the moment it exists, the instances
// its parent knows that the filter accepts: it asks discovery nothing (no
// query whose replies could come late), routes only to them, and closes with
// its parent; closing it leaves the parent working.
func TestFilteredSharesParentsView(t *testing.T) {
	const path = "test.filtered.generate"
	host := planetest.Embedded(t)
	a := planetest.Serve(t, planetest.Join(t, host), path, countHandler, planetest.WithMetadata([]byte(`{"model":"a"}`)))
	b := planetest.Serve(t, planetest.Join(t, host), path, countHandler, planetest.WithMetadata([]byte(`{"model":"b"}`)))
	parent := planetest.Client(t, host, path)
	planetest.WaitWorkers(t, parent, a, b)

	var queries atomic.Int64
	sub, err := host.Bus().Conn().Subscribe("dc.query.>", func(*nats.Msg) { queries.Add(1) })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	require.NoError(t, host.Bus().Conn().Flush())

	isB := func(meta []byte) bool { return string(meta) == `{"model":"b"}` }
	onlyB, err := parent.Filtered(isB)
	require.NoError(t, err)
	assert.Equal(t, []uint64{b.EP.InstanceID()}, onlyB.InstanceIDs(), "the parent's instances, filtered, at once")
	for range 4 {
		s := planetest.Generate(t, onlyB, `{"n":1}`, nil)
		require.NoError(t, planetest.WaitStarted(s))
		assert.Equal(t, b.EP.InstanceID(), s.Instance())
		s.Kill()
	}
	require.NoError(t, host.Bus().Conn().Flush())
	assert.Zero(t, queries.Load(), "a filtered client must not query discovery")

	// Closing the filtered client leaves its parent routing.
	onlyB.Close()
	onlyB.Close() // idempotent
	assert.Len(t, parent.InstanceIDs(), 2)
	s := planetest.Generate(t, parent, `{"n":1}`, nil)
	require.NoError(t, planetest.WaitStarted(s))
	s.Kill()

	// Closing the parent closes what was made from it (goleak checks its
	// goroutine is gone); a filtered client cannot be made from a closed one.
	again, err := parent.Filtered(isB)
	require.NoError(t, err)
	armed, fired := planetest.Armed()
	parent.Close()
	again.ArmInstances(armed) // runs at once on a closed client
	<-fired
	_, err = parent.Filtered(isB)
	assert.ErrorIs(t, err, plane.ErrClosed)
	_, err = parent.Filtered(nil)
	assert.Error(t, err)
}

// Streams come back whichever way the worker's runtime sends them: on its
// session to the caller (the default) or on a connection each
// (Options.ConnectionPerStream), many in a row and a kill among them.
func TestStreamConnectionsEitherWay(t *testing.T) {
	for _, perStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-stream=%v", perStream), func(t *testing.T) {
			_, _, c := planetest.ServeAndConnect(t, "test.connections.generate", countHandler,
				func(o *plane.Options) { o.ConnectionPerStream = perStream })
			for i := 0; i < 20; i++ {
				s := planetest.Generate(t, c, `{"n":50}`, nil)
				items, _, err := planetest.Drain(s, 0)
				require.Equal(t, io.EOF, err)
				requireSeq(t, items, 0, 50)
			}
			s := planetest.Generate(t, c, `{"n":1000000}`, nil)
			require.NoError(t, planetest.WaitStarted(s))
			s.Context().Cancel(ctxtree.Killed, ctxtree.ReasonKill)
			_, _, err := planetest.Drain(s, 0)
			require.Error(t, err)
		})
	}
}

// DYNAMO_CTX_STREAM_CONNECTIONS takes "shared" or "per-stream", nothing else.
func TestStreamConnectionsEnv(t *testing.T) {
	t.Setenv(plane.EnvStreamConnections, "sometimes")
	_, err := plane.New(context.Background(), plane.Options{NATS: plane.NATSOptions{URL: "nats://127.0.0.1:1"}})
	require.ErrorContains(t, err, plane.EnvStreamConnections)
}
