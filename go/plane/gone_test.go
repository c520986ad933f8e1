package plane_test

// A side that is gone: a worker's or a caller's runtime shut down mid-stream,
// a worker that dies (its lease expires), and requests to instances that
// are not there.

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

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
