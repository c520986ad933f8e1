package plane_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// An in-process caller's kill reaches the handler's context as a kill: the
// context never shows Stopped with stop_generating on the way (a handler
// polling its state word could take it for a clean stop).
func TestLocalKillDoesNotPassThroughStop(t *testing.T) {
	reqs := make(chan *plane.Request, 1)
	_, _, c := planetest.ServeOnHost(t, "review.localkill.generate", planetest.Hold(reqs))
	for range 20 {
		s, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
		require.NoError(t, err)
		require.NoError(t, planetest.WaitStarted(s))
		req := planetest.Recv(t, reqs, "the request")
		var mu sync.Mutex
		var seen []ctxtree.Reason
		req.Ctx.Notify(ctxtree.Stopped, func() {
			mu.Lock()
			defer mu.Unlock()
			_, r := req.Ctx.State()
			seen = append(seen, r)
		})
		s.Kill()
		<-req.Ctx.Killed()
		mu.Lock()
		assert.Equal(t, []ctxtree.Reason{ctxtree.ReasonKill}, seen)
		mu.Unlock()
		_, _, _ = planetest.Drain(s, 0)
	}
}
