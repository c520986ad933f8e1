package frontend_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
)

// Drain: the request in flight outlives the drain timeout, is killed with
// reason shutdown (the worker's context says so) and answered 503 shutdown;
// a second Drain during the first ends its wait at once.
func TestDrainKillsWhatOutlivesItWithReasonShutdown(t *testing.T) {
	e, got := holding(t, 1)
	done := make(chan response, 1)
	go func() { done <- e.post("/v1/completions", heldCompletion, nil) }()
	req := planetest.Recv(t, got, "the request")

	drained := make(chan error, 1)
	start := time.Now()
	go func() { drained <- e.fe.Drain(time.Hour) }()
	time.Sleep(100 * time.Millisecond) // the first drain is waiting
	require.NoError(t, func() error { _ = e.fe.Drain(0); return nil }())
	select {
	case <-drained:
	case <-time.After(planetest.WaitLimit):
		t.Fatal("the first drain did not end")
	}
	assert.Less(t, time.Since(start), 30*time.Second, "not the hour")
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	assert.Equal(t, ctxtree.ReasonShutdown, req.Ctx.Reason())
	r := <-done
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"shutdown"`)
}
