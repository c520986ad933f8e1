package plane_test

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

// A worker whose host stops ticking (a stalled event loop) refuses new
// requests unstarted and lets its streams go silent, so that a caller
// migrates them; once the host ticks again it serves again. A host that
// never ticked is never taken for stalled.
func TestStalledHostRefusesAndGoesSilent(t *testing.T) {
	const path = "test.host.generate"
	host := planetest.Embedded(t, shortIdle)
	got := make(chan *plane.Request, 8)
	stalled := planetest.Serve(t, planetest.Join(t, host, shortIdle), path, func(w *planetest.Worker, req *plane.Request) {
		got <- req
		w.SendTokens(req, len(planetest.Seq(0, 0)), 1, "")
		select {
		case <-req.Ctx.Killed():
		case <-w.Quit:
		}
	})
	healthy := planetest.Serve(t, planetest.Join(t, host, shortIdle), path, planetest.Tokens)
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 2)
	require.True(t, stalled.RT.HostAwake(), "never ticked: awake")

	stalled.RT.HostTick()
	s, err := c.Generate([]byte(`{"token_ids":[1],"stop_conditions":{"max_tokens":5}}`), ctxtree.New("held"), plane.Direct, stalled.EP.InstanceID())
	require.NoError(t, err)
	planetest.Recv(t, got, "the held request")
	// The host stops ticking: after the host bound (0.5 s) its heartbeats
	// stop and the caller hears nothing for the idle timeout.
	start := time.Now()
	_, _, err = planetest.Drain(s, 0)
	require.ErrorIs(t, err, transport.ErrPeerSilent)
	t.Logf("silent after %v", time.Since(start))
	assert.False(t, stalled.RT.HostAwake())

	late, err := c.Generate([]byte(`{}`), ctxtree.New("late"), plane.Direct, stalled.EP.InstanceID())
	require.NoError(t, err)
	_, _, err = planetest.Drain(late, 0)
	require.ErrorIs(t, err, plane.ErrNoResponders, "refused unstarted")
	assert.Contains(t, err.Error(), "not responding")
	select {
	case req := <-got:
		t.Fatalf("request %q reached the stalled host", req.ID)
	default:
	}

	stalled.RT.HostTick() // awake again
	again, err := c.Generate([]byte(`{"token_ids":[1],"stop_conditions":{"max_tokens":2}}`), ctxtree.New("again"), plane.Direct, stalled.EP.InstanceID())
	require.NoError(t, err)
	planetest.Recv(t, got, "a request once awake")
	again.Kill()

	ok, err := c.Generate([]byte(`{"token_ids":[1],"stop_conditions":{"max_tokens":2}}`), ctxtree.New("ok"), plane.Direct, healthy.EP.InstanceID())
	require.NoError(t, err)
	_, _, err = planetest.Drain(ok, 0)
	assert.Equal(t, io.EOF, err)
}
