package plane_test

import (
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// sendTwoAfter is a handler that sends item 0, hands its request to got,
// and sends item 1 and completes once release is closed.
func sendTwoAfter(got chan<- *plane.Request, release <-chan struct{}) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		w.Send(req, num(0))
		got <- req
		select {
		case <-release:
		case <-w.Quit:
			return
		}
		w.Send(req, num(1))
		req.Complete()
	}
}

// Drain: the instance leaves discovery at once, new requests go to the
// other instance, and the request in flight finishes on the draining one.
func TestDrainLetsRequestsFinishAndTakesNoNewOnes(t *testing.T) {
	const path = "test.drain.generate"
	host := planetest.Embedded(t)
	release := make(chan struct{})
	got := make(chan *plane.Request, 8)
	draining := planetest.Serve(t, planetest.Join(t, host), path, sendTwoAfter(got, release))
	other := planetest.Serve(t, planetest.Join(t, host), path, planetest.Tokens)
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)

	s, err := c.Generate([]byte(`{}`), ctxtree.New("in-flight"), plane.Direct, draining.EP.InstanceID())
	require.NoError(t, err)
	planetest.Recv(t, got, "the request in flight")
	assert.Equal(t, 1, draining.RT.Active())

	start := time.Now()
	draining.RT.Drain()
	require.Eventually(t, func() bool {
		ids := c.InstanceIDs()
		return len(ids) == 1 && ids[0] == other.EP.InstanceID()
	}, 5*time.Second, 2*time.Millisecond, "the draining instance left discovery")
	t.Logf("left discovery after %v", time.Since(start))

	// Sent to the draining instance anyway: refused, never served there.
	late, err := c.Generate([]byte(`{}`), ctxtree.New("late"), plane.Direct, draining.EP.InstanceID())
	require.NoError(t, err)
	_, _, err = planetest.Drain(late, 0)
	assert.ErrorIs(t, err, plane.ErrNoResponders, "refused: safe to send to another instance")
	assert.Empty(t, got, "a request sent after the drain was served by the draining instance")

	close(release)
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err, "the request in flight finished normally")
	requireSeq(t, items, 0, 2)
	require.Eventually(t, func() bool { return draining.RT.Active() == 0 }, 5*time.Second, 2*time.Millisecond)
}

// A request that finishes while its worker drains keeps its end frame, even
// when the worker shuts down the moment nothing is active (as the library's
// drain does): Active counts a request until its end frame is queued, and
// Close writes what its sessions queued before it closes them.
func TestDrainShutdownKeepsEndFramesOfFinishedRequests(t *testing.T) {
	const path = "test.drain.endframes"
	const streams = 24
	host := planetest.Embedded(t)
	c := planetest.Client(t, host, path)
	for round := 0; round < 10; round++ {
		release := make(chan struct{})
		started := make(chan *plane.Request, streams)
		w := planetest.Serve(t, planetest.Join(t, host), path, sendTwoAfter(started, release))
		planetest.WaitInstances(t, c, 1)
		ss := make([]*plane.Stream, streams)
		for i := range ss {
			var err error
			ss[i], err = c.Generate([]byte(`{}`), ctxtree.New(fmt.Sprintf("r%d-%d", round, i)), plane.Direct, w.EP.InstanceID())
			require.NoError(t, err)
		}
		for range ss {
			planetest.Recv(t, started, "a request in flight")
		}
		w.RT.Drain()
		close(release)
		for w.RT.Active() > 0 {
			runtime.Gosched()
		}
		w.RT.Close()
		for i, s := range ss {
			items, _, err := planetest.Drain(s, 0)
			require.Equal(t, io.EOF, err, "round %d stream %d lost its end frame (%d items)", round, i, len(items))
			requireSeq(t, items, 0, 2)
		}
		require.Eventually(t, func() bool { return len(c.InstanceIDs()) == 0 }, 5*time.Second, 2*time.Millisecond)
	}
}
