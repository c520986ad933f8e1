package frontend_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

const heldCompletion = `{"model":"m","prompt":"hi","max_tokens":1000}`

func timeoutHeader(s string) map[string]string {
	return map[string]string{frontend.RequestTimeoutHeader: s}
}

// A bad x-request-timeout is a 400 that names the header; no worker hears
// of the request.
func TestRequestTimeoutHeaderRefused(t *testing.T) {
	e, got := holding(t, 8)
	for _, bad := range []string{"-1", "NaN", "soon", "1e12", "Inf", "", " "} {
		if bad == "" || bad == " " {
			continue // an empty header is no header
		}
		r := e.post("/v1/completions", heldCompletion, timeoutHeader(bad))
		assert.Equal(t, http.StatusBadRequest, r.status, "%q: %s", bad, r.body)
		assert.Contains(t, string(r.body), frontend.RequestTimeoutHeader, bad)
		assert.Contains(t, string(r.body), "invalid_request_timeout", bad)
	}
	assert.Empty(t, got)
}

// Before the response starts (non-streaming): 504 deadline_exceeded, and
// the worker's context is killed with reason deadline.
func TestDeadlineBeforeTheResponseIs504(t *testing.T) {
	e, got := holding(t, 1)
	start := time.Now()
	r := e.post("/v1/completions", heldCompletion, timeoutHeader("0.3"))
	took := time.Since(start)
	assert.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"deadline_exceeded"`)
	assert.GreaterOrEqual(t, took, 300*time.Millisecond)
	req := planetest.Recv(t, got, "the request")
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	assert.Equal(t, ctxtree.ReasonDeadline, req.Ctx.Reason())
}

// After the response started (a stream): a final SSE error event with code
// deadline_exceeded, then the end; no [DONE].
func TestDeadlineInAStreamIsAFinalErrorEvent(t *testing.T) {
	e := newEnv(t)
	got := make(chan *plane.Request, 1)
	e.worker("w", "dynamo", "m", 0, func(w *planetest.Worker, req *plane.Request) {
		w.SendTokens(req, 0, 3, "")
		got <- req
		<-req.Ctx.Killed()
	})
	e.start()
	e.waitModels("m")
	resp := e.open("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1000,"stream":true}`, timeoutHeader("0.4"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	for range 3 {
		ev.chunk(t)
	}
	data, err := ev.next()
	require.NoError(t, err)
	assert.Contains(t, data, `"code":"deadline_exceeded"`)
	assert.Contains(t, data, `"error"`)
	_, err = ev.next()
	assert.Error(t, err, "the stream ends after the error event")
	req := planetest.Recv(t, got, "the request")
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	assert.Equal(t, ctxtree.ReasonDeadline, req.Ctx.Reason())
}

// The frontend's default and the header: the smaller wins, and the worker's
// context carries it as its own deadline.
func TestRequestTimeoutTheSmallerWins(t *testing.T) {
	e := newEnv(t)
	got := make(chan *plane.Request, 4)
	e.worker("w", "dynamo", "m", 0, planetest.Hold(got))
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, RequestTimeout: 30 * time.Second})
	e.waitModels("m")
	for _, c := range []struct {
		header string
		max    time.Duration
	}{{"", 30 * time.Second}, {"5", 5 * time.Second}, {"3600", 30 * time.Second}} {
		ctx, cancel := context.WithCancel(context.Background())
		hdr := map[string]string{}
		if c.header != "" {
			hdr = timeoutHeader(c.header)
		}
		errc := e.doAsync(e.request(http.MethodPost, "/v1/completions", heldCompletion, hdr).WithContext(ctx))
		req := planetest.Recv(t, got, "the request")
		left, ok := req.Ctx.Remaining()
		assert.True(t, ok)
		assert.LessOrEqual(t, left, c.max, c.header)
		assert.Greater(t, left, c.max-5*time.Second, c.header)
		cancel()
		<-errc
	}
}

// ParseTimeout: the one parser of the header and the environment variable.
func TestParseTimeout(t *testing.T) {
	d, err := frontend.ParseTimeout(" 2.5 ")
	require.NoError(t, err)
	assert.Equal(t, 2500*time.Millisecond, d)
	for _, bad := range []string{"-0.5", "nan", "x", "1e9", "inf", ""} {
		_, err := frontend.ParseTimeout(bad)
		assert.Error(t, err, bad)
	}
}
