package frontend_test

// A client that goes away: its requests are killed at the worker, and the
// disconnect and its confirmed abort are counted.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// disconnectEnv is a frontend with one worker that holds every request until
// it is killed and then until the test releases it.
type disconnectEnv struct {
	*env
	w       *planetest.Worker
	got     chan *plane.Request
	killed  chan held
	release chan struct{}
}

func newDisconnectEnv(t *testing.T, tokens int) *disconnectEnv {
	t.Helper()
	d := &disconnectEnv{
		env: newEnv(t), got: make(chan *plane.Request, 4), killed: make(chan held, 4),
		release: make(chan struct{}),
	}
	d.w = d.worker("w", "dynamo", "m", 0, hold(tokens, d.got, d.killed, d.release))
	d.start()
	d.waitModels("m")
	return d
}

// checkAbort checks what follows a client's disconnect from request id: the
// worker's request is killed with the cause the frontend gave (the Kill frame
// carries it: client_disconnected), the frontend counts the cancellation at once, and counts the abort
// as confirmed, with its latency, only once the worker's handler returned.
func (d *disconnectEnv) checkAbort(t *testing.T, id string) {
	t.Helper()
	h := planetest.Recv(t, d.killed, "the worker's request to be killed")
	assert.Equal(t, id, h.req.ID)
	assert.Equal(t, ctxtree.ReasonClientDisconnected, h.reason, "the Kill frame carries the cause")

	d.waitMetric(key(mCancellations, "m"), 1)
	m := d.metrics()
	assert.Equal(t, 1.0, m[key(mRequests, "m")])
	assert.Zero(t, m[key(mConfirmed, "m")], "confirmed before the worker's handler returned")
	assert.NotContains(t, m, key(mLatency+"_count", "m"))

	close(d.release) // the handler returns: the worker confirms the abort
	d.waitMetric(key(mConfirmed, "m"), 1)
	m = d.metrics()
	assert.Equal(t, 1.0, m[key(mLatency+"_count", "m")])
	assert.Equal(t, 1.0, m[mLatency+`_bucket{model="m",le="+Inf"}`])
	assert.Greater(t, m[key(mLatency+"_sum", "m")], 0.0)
	assert.Less(t, m[key(mLatency+"_sum", "m")], planetest.WaitLimit.Seconds())
	assert.Equal(t, 1.0, m[key(mCancellations, "m")], "one disconnect, one cancellation")
}

// lateRegistration: the disconnect's AfterFunc (on its own goroutine) may
// have started but not yet registered the pending abort when the response
// loop ends and kills the request's attempt (Frontend.respond). A worker
// whose handler returns at once when killed (as engines do) confirms the
// abort, and the confirmation may reach onAbortConfirmed before the request
// is in f.pending; it would be dropped, the cancellation counted but never
// confirmed. So respond waits for a running AfterFunc to finish (it runs
// under a sync.Once, called again after stopWatching whenever the client is
// gone) before it kills the streams. TestEveryDisconnectCounted repeats the
// race.

func TestClientDisconnectNonStreaming(t *testing.T) {
	t.Run("cancelled request context", func(t *testing.T) {
		d := newDisconnectEnv(t, 0) // killed before its first token, as in prefill
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req := d.request(http.MethodPost, "/v1/completions", completion("m", "hello", 50, false),
			map[string]string{"x-request-id": "dc-unary-1"}).WithContext(ctx)
		errc := d.doAsync(req)
		planetest.Recv(t, d.got, "the request at the worker")
		cancel()
		err := planetest.Recv(t, errc, "the client's request to end")
		require.ErrorIs(t, err, context.Canceled)
		d.checkAbort(t, "dc-unary-1")
	})
	t.Run("client timeout", func(t *testing.T) {
		d := newDisconnectEnv(t, 2)
		hc := &http.Client{Transport: d.hc.Transport, Timeout: 300 * time.Millisecond}
		req := d.request(http.MethodPost, "/v1/chat/completions", chat("m", "hello", 50, false),
			map[string]string{"x-dynamo-request-id": "dc-unary-2"})
		// The worker holds the request until it is killed, so the client's
		// timeout is what ends it, whenever it fires.
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		require.Error(t, err)
		var ne interface{ Timeout() bool }
		require.True(t, errors.As(err, &ne) && ne.Timeout(), "a client timeout: %v", err)
		planetest.Recv(t, d.got, "the request at the worker")
		d.checkAbort(t, "dc-unary-2")
	})
}

func TestClientDisconnectStreaming(t *testing.T) {
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			d := newDisconnectEnv(t, 3)
			body := completion("m", "hello", 50, true)
			if strings.Contains(path, "chat") {
				body = chat("m", "hello", 50, true)
			}
			resp := d.open(path, body, map[string]string{"x-request-id": "dc-stream"})
			require.Equal(t, http.StatusOK, resp.StatusCode)
			ev := newEvents(resp)
			for range 3 {
				ev.chunk(t)
			}
			planetest.Recv(t, d.got, "the request at the worker")
			require.NoError(t, resp.Body.Close()) // the client goes away mid-stream
			d.checkAbort(t, "dc-stream")
		})
	}
}

// Every disconnect is counted, whichever of the response loop and the
// disconnect's AfterFunc sees it first, and every abort is confirmed, also by
// a handler that returns at once when killed (see lateRegistration).
func TestEveryDisconnectCounted(t *testing.T) {
	e, got := holding(t, 1)
	const n = 20
	for i := 1; i <= n; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		req := e.request(http.MethodPost, "/v1/completions", completion("m", "hi", 5, false), nil).WithContext(ctx)
		errc := e.doAsync(req)
		planetest.Recv(t, got, "the request at the worker")
		cancel()
		require.ErrorIs(t, planetest.Recv(t, errc, "the client's request to end"), context.Canceled)
		e.waitMetric(key(mCancellations, "m"), float64(i))
		e.waitMetric(key(mConfirmed, "m"), float64(i))
	}
	assert.Equal(t, float64(n), e.metrics()[key(mLatency+"_count", "m")])
}
