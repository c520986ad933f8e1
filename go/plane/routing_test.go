package plane_test

// Routing: round robin and direct across instances, and the instances a
// client lists through filters (Filtered).

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

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
