package plane_test

// Abort confirmations reach the caller that sent the request, and only it;
// callers and workers of an earlier version (one shared subject) lose none.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// confirmations subscribes f's channel to rt's abort confirmations.
func confirmations(t *testing.T, rt *plane.Runtime) <-chan plane.AbortConfirmation {
	t.Helper()
	ch := make(chan plane.AbortConfirmation, 8)
	unsubscribe, err := rt.OnAbortConfirmed(func(a plane.AbortConfirmation) { ch <- a })
	require.NoError(t, err)
	t.Cleanup(unsubscribe)
	return ch
}

// onBus counts the messages published on subject (wildcards allowed).
func onBus(t *testing.T, rt *plane.Runtime, subject string) <-chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 8)
	sub, err := rt.Bus().Conn().ChanSubscribe(subject, ch)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, rt.Bus().Conn().Flush())
	return ch
}

func none[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s: %+v", what, v)
	case <-time.After(100 * time.Millisecond):
	}
}

// killOne sends a request from caller to the worker of path and kills it
// once the handler runs; the handler returns at once.
func killOne(t *testing.T, host, caller *plane.Runtime, path, id string) *plane.Stream {
	t.Helper()
	got := make(chan *plane.Request, 1)
	planetest.Serve(t, planetest.Join(t, host), path, planetest.Hold(got))
	c := planetest.Client(t, caller, path)
	planetest.WaitInstances(t, c, 1)
	s := planetest.Generate(t, c, `{}`, ctxtree.New(id))
	req := planetest.Recv(t, got, "the request")
	s.Kill()
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	return s
}

func TestAbortConfirmationReachesOnlyItsCaller(t *testing.T) {
	const path = "test.aborts.generate"
	host := planetest.Embedded(t)
	caller, other := planetest.Join(t, host), planetest.Join(t, host)
	mine, theirs := confirmations(t, caller), confirmations(t, other)
	all, shared := onBus(t, host, plane.AbortedSubject+".>"), onBus(t, host, plane.AbortedSubject)

	s := killOne(t, host, caller, path, "mine")
	a := planetest.Recv(t, mine, "the confirmation at its caller")
	assert.Equal(t, s.Key(), a.Key)
	assert.Equal(t, s.Instance(), a.Instance)
	m := planetest.Recv(t, all, "the confirmation on the bus")
	var onWire plane.AbortConfirmation
	require.NoError(t, json.Unmarshal(m.Data, &onWire))
	assert.Equal(t, a, onWire)
	none(t, theirs, "a confirmation reached another caller")
	none(t, shared, "a confirmation on the shared subject")
	none(t, all, "a second confirmation")
	none(t, mine, "a second confirmation at its caller")
}

// A caller of an earlier version names no subject: the worker confirms on
// the shared one, where that caller (and every other) hears it.
func TestAbortConfirmationOfACallerOfAnEarlierVersion(t *testing.T) {
	const path = "test.abortsold.generate"
	host := planetest.Embedded(t)
	caller := planetest.Join(t, host)
	plane.SetAbortSubject(caller, "")
	heard := confirmations(t, planetest.Join(t, host))
	shared := onBus(t, host, plane.AbortedSubject)

	s := killOne(t, host, caller, path, "old-caller")
	planetest.Recv(t, shared, "the confirmation on the shared subject")
	assert.Equal(t, s.Key(), planetest.Recv(t, heard, "the confirmation").Key)
}

// A worker of an earlier version confirms every abort on the shared
// subject: a caller hears it there.
func TestAbortConfirmationOfAWorkerOfAnEarlierVersion(t *testing.T) {
	host := planetest.Embedded(t)
	heard := confirmations(t, planetest.Join(t, host))
	a := plane.AbortConfirmation{ID: "r", Key: plane.NewKey(), Path: "a.b.c", Instance: 7, Reason: "kill"}
	b, err := json.Marshal(a)
	require.NoError(t, err)
	require.NoError(t, host.Bus().Conn().Publish(plane.AbortedSubject, b))
	assert.Equal(t, a, planetest.Recv(t, heard, "the confirmation"))
}
