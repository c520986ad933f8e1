package frontend_test

// Migration through the frontend: a worker that crashes mid-stream, the
// request continued on another, streaming and not.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// migrationEnv has two workers of model "m" declaring migration_limit 1. The
// first request whose prompt is "hello" (whichever worker gets it) sends
// three tokens (the last with finish reason lastReason, if any), reports its
// worker on crashed and waits; every other request is served normally.
type migrationEnv struct {
	*env
	ws      [2]*planetest.Worker
	crashed chan *planetest.Worker
	served  [2]atomic.Int64
}

func newMigrationEnv(t *testing.T) *migrationEnv {
	t.Helper()
	return newMigrationEnvEnding(t, "")
}

func newMigrationEnvEnding(t *testing.T, lastReason string) *migrationEnv {
	t.Helper()
	m := &migrationEnv{env: newEnv(t), crashed: make(chan *planetest.Worker, 1)}
	var first atomic.Bool
	for i := range m.ws {
		m.ws[i] = m.worker(fmt.Sprintf("w%d", i), "dynamo", "m", 1, func(w *planetest.Worker, req *plane.Request) {
			m.served[i].Add(1)
			p := parse(req)
			if slices.Equal(p.TokenIDs, bytesOf("hello")) && first.CompareAndSwap(false, true) {
				if !w.SendTokens(req, len(p.TokenIDs), 3, lastReason) {
					return
				}
				m.crashed <- w
				select { // the test closes this worker's runtime
				case <-req.Ctx.Killed():
				case <-w.Quit:
				}
				return
			}
			planetest.Tokens(w, req)
		})
	}
	m.start()
	m.waitModels("m")
	// Warm up until the frontend has routed to both workers, so that it
	// knows both when the request under test starts.
	deadline := time.Now().Add(planetest.WaitLimit)
	for m.served[0].Load() == 0 || m.served[1].Load() == 0 {
		require.True(t, time.Now().Before(deadline), "the frontend never routed to both workers")
		r := m.post("/v1/completions", completion("m", "warm", 1, false), nil)
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	}
	for _, w := range m.ws {
		for len(w.Reqs) > 0 {
			<-w.Reqs
		}
	}
	return m
}

// crash closes the runtime of the worker that took the request under test,
// and returns the other.
func (m *migrationEnv) crash(t *testing.T) (crashed, other *planetest.Worker) {
	t.Helper()
	crashed = planetest.Recv(t, m.crashed, "the first worker to send its tokens")
	crashed.RT.Close() // its stream ends without a final marker
	other = m.ws[0]
	if other == crashed {
		other = m.ws[1]
	}
	return crashed, other
}

// checkContinuation checks the attempts of request id: the first at crashed
// with the prompt, the second at other with the prompt extended by the k
// tokens the frontend received and max_tokens reduced by k.
func checkContinuation(t *testing.T, crashed, other *planetest.Worker, id string, maxTokens int, exactK int) {
	t.Helper()
	a1 := crashed.NextReq(t)
	assert.Equal(t, id, a1.ID)
	assert.Equal(t, bytesOf("hello"), parse(a1).TokenIDs)
	a2 := other.NextReq(t)
	assert.Equal(t, id, a2.ID, "the migrated attempt keeps the request id")
	p := parseReq(t, a2)
	k := len(p.TokenIDs) - len("hello")
	if exactK >= 0 {
		assert.Equal(t, exactK, k)
	}
	require.True(t, k >= 0 && k <= 3, "the second worker got %d extra tokens", k)
	want := bytesOf("hello")
	for i := 0; i < k; i++ {
		want = append(want, len("hello")+i)
	}
	assert.Equal(t, want, p.TokenIDs, "token_ids extended by the tokens received")
	assert.Equal(t, maxTokens-k, p.StopConditions.MaxTokens, "max_tokens reduced by the tokens received")
}

func TestMigrationStreaming(t *testing.T) {
	m := newMigrationEnv(t)
	const n = 10
	resp := m.open("/v1/completions", completion("m", "hello", n, true), map[string]string{"x-request-id": "mig-s"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	var got strings.Builder
	for i := 0; i < 3; i++ {
		got.WriteString(choice(t, ev.chunk(t))["text"].(string))
	}
	crashed, other := m.crash(t)
	for i := 3; i < n; i++ {
		c := choice(t, ev.chunk(t))
		got.WriteString(c["text"].(string))
		if i == n-1 {
			assert.Equal(t, "length", c["finish_reason"])
		}
	}
	ev.done(t)
	assert.Equal(t, text(5, n), got.String(), "every token once, in order")
	checkContinuation(t, crashed, other, "mig-s", n, 3)

	mm := m.metrics()
	assert.Zero(t, mm[key(mCancellations, "m")], "a migration is no cancellation")
}

func TestMigrationNonStreaming(t *testing.T) {
	m := newMigrationEnv(t)
	const n = 10
	done := make(chan response, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), planetest.WaitLimit)
		defer cancel()
		req := m.request(http.MethodPost, "/v1/completions", completion("m", "hello", n, false),
			map[string]string{"x-request-id": "mig-u"}).WithContext(ctx)
		resp, err := m.hc.Do(req)
		if err != nil {
			done <- response{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- response{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	crashed, other := m.crash(t)
	r := planetest.Recv(t, done, "the response")
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	body := r.json(t)
	c := choice(t, body)
	assert.Equal(t, text(5, n), c["text"], "every token once, in order")
	assert.Equal(t, "length", c["finish_reason"])
	assert.EqualValues(t, n, body["usage"].(map[string]any)["completion_tokens"])
	checkContinuation(t, crashed, other, "mig-u", n, -1)
}

// A worker's last item said "abort" (a reason that does not complete the
// request), then its stream broke: the migration continues the request, and
// the client sees no finish reason before the real one. Were the "abort"
// chunk written, the stream would carry two finish reasons, tokens after
// the first.
func TestMigrationAfterAnAbortReasonWritesOneFinish(t *testing.T) {
	m := newMigrationEnvEnding(t, "abort")
	const n = 10
	resp := m.open("/v1/completions", completion("m", "hello", n, true), map[string]string{"x-request-id": "mig-abort"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	var got strings.Builder
	var reasons []any
	for i := 0; i < 3; i++ {
		c := choice(t, ev.chunk(t))
		got.WriteString(c["text"].(string))
		reasons = append(reasons, c["finish_reason"])
	}
	crashed, other := m.crash(t)
	for i := 3; i < n; i++ {
		c := choice(t, ev.chunk(t))
		got.WriteString(c["text"].(string))
		reasons = append(reasons, c["finish_reason"])
	}
	ev.done(t)
	assert.Equal(t, text(5, n), got.String(), "every token once, in order")
	want := make([]any, n)
	want[n-1] = "length"
	assert.Equal(t, want, reasons, "one finish reason, the last chunk's")
	checkContinuation(t, crashed, other, "mig-abort", n, 3)
}

// A worker that ends a request with "abort" on its last item and a clean
// end: the client gets that reason, in a chunk of its own at the stream's
// end (streaming), or on the choice (not streaming).
func TestAbortReasonWrittenAtTheEnd(t *testing.T) {
	e := newEnv(t)
	e.worker("w", "dynamo", "m", 1, func(w *planetest.Worker, req *plane.Request) {
		if w.SendTokens(req, len(parse(req).TokenIDs), 3, "abort") {
			req.Complete()
		}
	})
	e.start()
	e.waitModels("m")

	resp := e.open("/v1/completions", completion("m", "hello", 10, true), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	var got strings.Builder
	for i := 0; i < 3; i++ {
		c := choice(t, ev.chunk(t))
		got.WriteString(c["text"].(string))
		assert.Nil(t, c["finish_reason"], "chunk %d", i)
	}
	c := choice(t, ev.chunk(t))
	assert.Equal(t, "abort", c["finish_reason"])
	assert.Equal(t, "", c["text"])
	ev.done(t)
	assert.Equal(t, text(5, 3), got.String())

	r := e.post("/v1/completions", completion("m", "hello", 10, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	c = choice(t, r.json(t))
	assert.Equal(t, "abort", c["finish_reason"])
	assert.Equal(t, text(5, 3), c["text"])
}
