package frontend_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func outcomeKey(model, outcome string) string {
	return `dynamo_ctx_frontend_outcomes_total{model="` + model + `",outcome="` + outcome + `"}`
}

// Every worker request ends in exactly one outcome, and the outcomes add up
// to the requests sent.
func TestEveryRequestHasOneOutcome(t *testing.T) {
	e := newEnv(t)
	got := make(chan *plane.Request, 16)
	e.worker("w", "dynamo", "m", 0, func(w *planetest.Worker, req *plane.Request) {
		p := parse(req)
		switch len(p.TokenIDs) { // the stand-in's prompt: one token per byte
		case 2: // "ok"
			planetest.Tokens(w, req)
		case 4: // "fail"
			req.Fail("ValueError: no")
		default: // "hold..."
			got <- req
			<-req.Ctx.Killed()
		}
	})
	e.start()
	e.waitModels("m")

	ok := e.post("/v1/completions", `{"model":"m","prompt":"ok","max_tokens":3}`, nil)
	require.Equal(t, http.StatusOK, ok.status)
	stopped := e.post("/v1/completions", `{"model":"m","prompt":"ok","max_tokens":3,"stop":" of"}`, nil)
	require.Equal(t, http.StatusOK, stopped.status)
	failed := e.post("/v1/completions", `{"model":"m","prompt":"fail","max_tokens":3}`, nil)
	require.Equal(t, http.StatusInternalServerError, failed.status)
	late := e.post("/v1/completions", `{"model":"m","prompt":"hold-1","max_tokens":3}`, timeoutHeader("0.2"))
	require.Equal(t, http.StatusGatewayTimeout, late.status)
	<-got
	ctx, cancel := context.WithCancel(context.Background())
	errc := e.doAsync(e.request(http.MethodPost, "/v1/completions", `{"model":"m","prompt":"hold-22","max_tokens":3,"n":2}`, nil).WithContext(ctx))
	<-got
	<-got
	cancel()
	<-errc

	want := map[string]float64{"completed": 2, "failed": 1, "deadline": 1, "cancelled": 2}
	require.Eventually(t, func() bool {
		m := e.metrics()
		for o, n := range want {
			if m[outcomeKey("m", o)] != n {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond)
	m := e.metrics()
	sum := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, "dynamo_ctx_frontend_outcomes_total{") {
			sum += v
		}
	}
	assert.Equal(t, m[key(mRequests, "m")], sum, "outcomes add up to the requests")
	assert.Equal(t, 6.0, sum)
}
