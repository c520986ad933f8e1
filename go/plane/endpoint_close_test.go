package plane_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// No goroutine reading an envelope outlives Endpoint.Close (envelopes are
// read on several goroutines, not on the subscription's).
func TestEndpointCloseWaitsForEnvelopeReaders(t *testing.T) {
	const path = "review.closereaders.generate"
	host, w, _ := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {})
	opts, err := natsbus.ClientAuth(host.Bus().URL())
	require.NoError(t, err)
	nc, err := nats.Connect(host.Bus().URL(), opts...)
	require.NoError(t, err)
	defer nc.Close()
	subject := discovery.RequestSubject(path, w.EP.InstanceID())
	big := strings.Repeat("x", 1<<20)
	env, _ := json.Marshal(map[string]any{"id": "r", "key": plane.NewKey(), "addr": "127.0.0.1:1", "token": plane.NewKey(), "request": big})
	for range 32 {
		require.NoError(t, nc.PublishRequest(subject, nats.NewInbox(), env))
	}
	require.NoError(t, nc.Flush())
	w.EP.Close()
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	require.NotContains(t, stacks, "(*Endpoint).receive")
}
