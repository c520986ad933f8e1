package plane_test

// Deadlines across the plane: a request carries the time left to its
// deadline, the worker's handler context dies then by its own timer, and
// migration never retries a request past its deadline.

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// The handler's context has the caller's deadline (as time left when it was
// sent) and is killed with reason deadline at it.
func TestDeadlineTravelsAsTimeLeft(t *testing.T) {
	const path = "test.deadline.generate"
	got, killed := make(chan *plane.Request, 1), make(chan ctxState, 1)
	_, _, c := planetest.ServeAndConnect(t, path, waitKilledHandler(2, got, killed))
	parent := ctxtree.New("with-deadline")
	parent.SetDeadline(time.Now().Add(300 * time.Millisecond))
	s := planetest.Generate(t, c, `{}`, parent)
	req := planetest.Recv(t, got, "the request")
	left, ok := req.Ctx.Remaining()
	require.True(t, ok, "the handler's context has a deadline")
	assert.LessOrEqual(t, left, 300*time.Millisecond)
	assert.Greater(t, left, 100*time.Millisecond)
	st := planetest.Recv(t, killed, "the handler's context to be killed")
	assert.Equal(t, ctxState{stopped: true, killed: true, reason: ctxtree.ReasonDeadline}, st)
	_, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err, "a request that reached its deadline ends as a kill ends it")
	assert.True(t, planetest.ClosedWithin(parent.Killed()), "the caller's own timer")
	assert.Equal(t, ctxtree.ReasonDeadline, parent.Reason())
}

// The worker's timer fires also when the caller's kill never comes: here
// the caller's own context has no timer (its deadline is given to the
// request by hand), as a frozen caller's would not fire.
func TestWorkerTimerFiresWithoutTheCaller(t *testing.T) {
	const path = "test.deadlineown.generate"
	got, killed := make(chan *plane.Request, 1), make(chan ctxState, 1)
	_, _, c := planetest.ServeAndConnect(t, path, waitKilledHandler(0, got, killed))
	caller := ctxtree.New("frozen-caller")
	attempt := ctxtree.New("frozen-caller")
	attempt.SetDeadline(time.Now().Add(200 * time.Millisecond))
	caller.LinkChild(attempt) // the attempt carries the deadline; the caller's context has none
	s, err := c.Generate([]byte(`{}`), attempt, plane.RoundRobin, 0)
	require.NoError(t, err)
	planetest.Recv(t, got, "the request")
	attempt.Finish() // stops the attempt's own timer: nothing on the caller's side will fire
	st := planetest.Recv(t, killed, "the handler's context to be killed by its own timer")
	assert.Equal(t, ctxtree.ReasonDeadline, st.reason)
	_, _, _ = planetest.Drain(s, 0)
}

// A deadline already passed when the request is sent kills the handler's
// context before the handler sees it.
func TestPassedDeadlineReachesTheHandlerKilled(t *testing.T) {
	const path = "test.deadlinepassed.generate"
	got, killed := make(chan *plane.Request, 1), make(chan ctxState, 1)
	_, _, c := planetest.ServeAndConnect(t, path, waitKilledHandler(0, got, killed))
	late := ctxtree.New("late")
	late.SetDeadline(time.Now().Add(-time.Millisecond))
	s2, err := c.Generate([]byte(`{}`), late, plane.RoundRobin, 0)
	require.NoError(t, err)
	req := planetest.Recv(t, got, "the late request")
	assert.True(t, req.Ctx.IsKilled(), "killed before the handler had it")
	assert.Equal(t, ctxtree.ReasonKill, req.Ctx.Reason(), "sent killed (its state travels as it was)")
	planetest.Recv(t, killed, "killed")
	_, _, err = planetest.Drain(s2, 0)
	assert.Equal(t, io.EOF, err)
}

// A stream that breaks after its deadline passed is not migrated: the
// deadline is not a fault.
func TestMigrationNeverRetriesPastTheDeadline(t *testing.T) {
	const path = "test.deadlinemigrate.generate"
	host := planetest.Embedded(t)
	got := make(chan *plane.Request, 8)
	// Workers that send an item, then hold the request until its deadline
	// passes and break the stream without the final marker (as a crash).
	breaker := func(w *planetest.Worker, req *plane.Request) {
		w.Send(req, num(0))
		got <- req
		select {
		case <-req.Ctx.Killed():
		case <-w.Quit:
		}
	}
	for range 2 {
		planetest.Serve(t, planetest.Join(t, host), path, breaker)
	}
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)
	parent := ctxtree.New("no-retry")
	parent.SetDeadline(time.Now().Add(200 * time.Millisecond))
	s, err := c.GenerateMigrating([]byte(`{}`), parent, plane.RoundRobin, 0, 3)
	require.NoError(t, err)
	planetest.Recv(t, got, "the first attempt")
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	assert.Len(t, items, 1)
	assert.True(t, planetest.ClosedWithin(parent.Killed()))
	assert.Equal(t, ctxtree.ReasonDeadline, parent.Reason())
	select {
	case <-got:
		t.Fatal("a second attempt started past the deadline")
	case <-time.After(300 * time.Millisecond):
	}
}
