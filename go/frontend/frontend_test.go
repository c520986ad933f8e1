package frontend_test

// Tests of the OpenAI-compatible HTTP frontend (docs/design.md, section 7) against real
// request planes: every test starts a runtime that embeds NATS on an
// ephemeral port and runs the frontend; every worker is a runtime of its own
// that joins it (so a kill reaches the worker as a Kill frame, and closing a
// worker's runtime is that worker crashing), with a handler loop driven by
// Endpoint.Arm/Accept like the Python dispatcher.
//
// A worker's handler reads the token request the frontend sends
// ({"model", "token_ids", "stop_conditions": {"max_tokens"}}) and answers
// {"token_ids": [k], "finish_reason": ...} items where k is the position of
// the token in the sequence (the next token is len(token_ids)), so the text a
// client receives is checkable, and so is the continuity of a migrated
// stream.

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/procs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHealthAndModels(t *testing.T) {
	e := newEnv(t)
	e.worker("alpha", "dynamo", "alpha", 0, planetest.Tokens)
	e.worker("beta1", "dynamo", "beta", 0, planetest.Tokens)
	e.worker("beta2", "dynamo", "beta", 0, planetest.Tokens)
	// Another namespace's model is not this frontend's.
	gamma := e.worker("gamma", "other", "gamma", 0, planetest.Tokens)
	e.start()

	e.waitModels("alpha", "beta") // each once, sorted; not gamma

	r := e.do(http.MethodGet, "/health", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, r.header.Get("Content-Type"), "application/json")
	h := r.json(t)
	assert.Equal(t, "healthy", h["status"])
	assert.Equal(t, []any{"alpha", "beta"}, h["models"])
	assert.EqualValues(t, 3, h["instances"])

	// A model served only in another namespace is unknown here.
	r = e.post("/v1/completions", completion("gamma", "hi", 2, false), nil)
	assert.Equal(t, http.StatusNotFound, r.status, "body %s", r.body)
	assert.Empty(t, gamma.Reqs)
}

// A frontend with AdaptiveProcs fits the process's Ps while it runs and
// stops at its close (TestMain's leak check sees the fitting goroutine
// gone), leaving the runtime's default; requests are served meanwhile.
func TestAdaptiveProcsEndWithTheFrontend(t *testing.T) {
	def := runtime.GOMAXPROCS(0)
	e := newEnv(t)
	e.worker("alpha", "dynamo", "alpha", 0, planetest.Tokens)
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, AdaptiveProcs: true})
	e.waitModels("alpha")
	r := e.post("/v1/completions", completion("alpha", "hi", 2, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	require.NoError(t, e.fe.Close())
	assert.False(t, procs.One())
	assert.Equal(t, def, runtime.GOMAXPROCS(0))
}

// A model /health and /v1/models list is routable at once: the first
// requests for it, many at the same moment (a load balancer that waited for
// health), are served, none refused as an unknown model. The routing view
// and the listed view are one.
func TestListedModelIsRoutableAtOnce(t *testing.T) {
	// The burst is 400 envelopes at once for two workers, under -race, on
	// a machine running other packages' tests: their acknowledgements may
	// take longer than the default second, which is not what this tests.
	e := &env{t: t, host: planetest.Embedded(t, func(o *plane.Options) { o.AckTimeout = planetest.WaitLimit })}
	e.worker("w1", "dynamo", "m", 0, planetest.Tokens)
	e.worker("w2", "dynamo", "m", 0, planetest.Tokens)
	e.start()
	for {
		h := e.do(http.MethodGet, "/health", "", nil).json(t)
		if models, _ := h["models"].([]any); len(models) == 1 {
			break
		}
	}
	const n = 400 // enough that, when each first request started its own discovery query, most were refused
	statuses := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := e.request(http.MethodPost, "/v1/completions", completion("m", "hi", 2, false), nil)
			resp, err := e.hc.Do(req)
			if err != nil {
				statuses <- err.Error()
				return
			}
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			statuses <- fmt.Sprintf("%d %.200s", resp.StatusCode, b)
		}()
	}
	wg.Wait()
	close(statuses)
	for st := range statuses {
		assert.True(t, strings.HasPrefix(st, "200 "), "a first request got %s", st)
	}
}

func TestRoutesOnlyToRequestedModel(t *testing.T) {
	e := newEnv(t)
	alpha := e.worker("alpha", "dynamo", "alpha", 0, planetest.Tokens)
	beta := e.worker("beta", "dynamo", "beta", 0, planetest.Tokens)
	e.start()
	e.waitModels("alpha", "beta")

	for range 4 {
		r := e.post("/v1/completions", completion("alpha", "hi", 2, false), nil)
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
		assert.Equal(t, "alpha", parseReq(t, alpha.NextReq(t)).Model)
	}
	assert.Empty(t, beta.Reqs, "a request for alpha reached beta's worker")
	r := e.post("/v1/completions", completion("beta", "hi", 2, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Equal(t, "beta", parseReq(t, beta.NextReq(t)).Model)
	assert.Empty(t, alpha.Reqs)
}

func TestCompletionNonStreaming(t *testing.T) {
	e, w := one(t)
	r := e.post("/v1/completions", completion("m", "hello", 4, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Contains(t, r.header.Get("Content-Type"), "application/json")
	body := r.json(t)
	id := r.header.Get("x-request-id")
	assert.Equal(t, "cmpl-"+id, body["id"], "the response id is cmpl- and the request id")
	assert.Equal(t, "text_completion", body["object"])
	assert.Equal(t, "m", body["model"])
	c := choice(t, body)
	assert.Equal(t, text(5, 4), c["text"], "the tokens after the 5 prompt tokens")
	assert.Equal(t, "length", c["finish_reason"])
	assert.EqualValues(t, 4, body["usage"].(map[string]any)["completion_tokens"], "completion_tokens equals max_tokens")

	// The worker got the token request under the request's id.
	req := w.NextReq(t)
	assert.Equal(t, id, req.ID)
	p := parseReq(t, req)
	assert.Equal(t, "m", p.Model)
	assert.Equal(t, bytesOf("hello"), p.TokenIDs)
	assert.Equal(t, 4, p.StopConditions.MaxTokens)

	// Without max_tokens the default applies.
	r = e.post("/v1/completions", `{"model":"m","prompt":"hello"}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.EqualValues(t, 16, r.json(t)["usage"].(map[string]any)["completion_tokens"])
	assert.Equal(t, 16, parseReq(t, w.NextReq(t)).StopConditions.MaxTokens)
}

func TestRequestID(t *testing.T) {
	e, w := one(t)
	cases := []struct {
		name string
		hdr  map[string]string
		want string // "" means a new uuid
	}{
		{"x-request-id", map[string]string{"x-request-id": "req-abc-1"}, "req-abc-1"},
		{"x-dynamo-request-id", map[string]string{"x-dynamo-request-id": "dyn-xyz-2"}, "dyn-xyz-2"},
		{"both: x-request-id wins", map[string]string{"x-request-id": "req-3", "x-dynamo-request-id": "dyn-3"}, "req-3"},
		{"absent", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, stream := range []bool{false, true} {
				var id string
				if stream {
					resp := e.open("/v1/completions", completion("m", "hi", 2, true), tc.hdr)
					require.Equal(t, http.StatusOK, resp.StatusCode)
					id = resp.Header.Get("x-request-id")
					ev := newEvents(resp)
					assert.Equal(t, "cmpl-"+id, ev.chunk(t)["id"])
					assert.Equal(t, "cmpl-"+id, ev.chunk(t)["id"])
					ev.done(t)
				} else {
					r := e.post("/v1/completions", completion("m", "hi", 2, false), tc.hdr)
					require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
					id = r.header.Get("x-request-id")
					assert.Equal(t, "cmpl-"+id, r.json(t)["id"])
				}
				if tc.want != "" {
					assert.Equal(t, tc.want, id, "stream=%v", stream)
				} else {
					assert.Regexp(t, planetest.UUID, id, "stream=%v", stream)
				}
				req := w.NextReq(t)
				assert.Equal(t, id, req.ID, "the worker's request id (stream=%v)", stream)
				assert.Equal(t, id, req.Ctx.ID(), "the worker's context id (stream=%v)", stream)
			}
		})
	}

	// Generated ids are new for every request.
	a := e.post("/v1/completions", completion("m", "hi", 1, false), nil)
	b := e.post("/v1/completions", completion("m", "hi", 1, false), nil)
	assert.Regexp(t, planetest.UUID, a.header.Get("x-request-id"))
	assert.NotEqual(t, a.header.Get("x-request-id"), b.header.Get("x-request-id"))
}

func TestCompletionStreaming(t *testing.T) {
	e, w := one(t)
	const n = 6
	resp := e.open("/v1/completions", completion("m", "hello", n, true), map[string]string{"x-request-id": "s-1"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	assert.Equal(t, "s-1", resp.Header.Get("x-request-id"))

	ev := newEvents(resp)
	var got strings.Builder
	for i := 0; i < n; i++ {
		m := ev.chunk(t)
		assert.Equal(t, "cmpl-s-1", m["id"])
		assert.Equal(t, "text_completion", m["object"])
		assert.Equal(t, "m", m["model"])
		c := choice(t, m)
		assert.Equal(t, text(5+i, 1), c["text"], "chunk %d", i)
		if i < n-1 {
			assert.Nil(t, c["finish_reason"], "chunk %d", i)
		} else {
			assert.Equal(t, "length", c["finish_reason"], "the last chunk")
		}
		got.WriteString(c["text"].(string))
	}
	ev.done(t)
	assert.Equal(t, text(5, n), got.String())
	assert.Equal(t, "s-1", w.NextReq(t).ID)
}

func TestChatCompletionStreaming(t *testing.T) {
	e, w := one(t)
	const n = 4
	resp := e.open("/v1/chat/completions", chat("m", "hi", n, true), nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	id := resp.Header.Get("x-request-id")
	require.Regexp(t, planetest.UUID, id)

	prompt := len("user: hi\n")
	ev := newEvents(resp)
	var got strings.Builder
	for i := 0; i < n; i++ {
		m := ev.chunk(t)
		assert.Equal(t, "chatcmpl-"+id, m["id"])
		assert.Equal(t, "chat.completion.chunk", m["object"])
		c := choice(t, m)
		delta, ok := c["delta"].(map[string]any)
		require.True(t, ok, "chunk %d has no delta: %v", i, m)
		if i == 0 {
			assert.Equal(t, "assistant", delta["role"], "the first delta has the role")
		} else {
			assert.NotContains(t, delta, "role", "chunk %d", i)
		}
		assert.Equal(t, text(prompt+i, 1), delta["content"], "chunk %d", i)
		got.WriteString(delta["content"].(string))
	}
	ev.done(t)
	assert.Equal(t, text(prompt, n), got.String())

	req := w.NextReq(t)
	assert.Equal(t, id, req.ID)
	assert.Equal(t, bytesOf("user: hi\n"), parseReq(t, req).TokenIDs, "the chat prompt")
}

func TestChatCompletionNonStreaming(t *testing.T) {
	e, w := one(t)
	r := e.post("/v1/chat/completions", chat("m", "hi", 3, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	body := r.json(t)
	assert.Equal(t, "chatcmpl-"+r.header.Get("x-request-id"), body["id"])
	assert.Equal(t, "chat.completion", body["object"])
	c := choice(t, body)
	msg, ok := c["message"].(map[string]any)
	require.True(t, ok, "no message: %v", body)
	assert.Equal(t, "assistant", msg["role"])
	prompt := len("user: hi\n")
	assert.Equal(t, text(prompt, 3), msg["content"])
	assert.Equal(t, "length", c["finish_reason"])
	assert.EqualValues(t, 3, body["usage"].(map[string]any)["completion_tokens"])
	assert.Equal(t, r.header.Get("x-request-id"), w.NextReq(t).ID)

	// Content parts, and max_completion_tokens over max_tokens.
	r = e.post("/v1/chat/completions", `{"model":"m","max_tokens":7,"max_completion_tokens":2,
		"messages":[{"role":"system","content":"be"},{"role":"user","content":[{"type":"text","text":"h"},{"type":"text","text":"i"}]}]}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	p := parseReq(t, w.NextReq(t))
	assert.Equal(t, bytesOf("system: be\nuser: hi\n"), p.TokenIDs)
	assert.Equal(t, 2, p.StopConditions.MaxTokens)
	msg = choice(t, r.json(t))["message"].(map[string]any)
	assert.Equal(t, text(len("system: be\nuser: hi\n"), 2), msg["content"])
}

func TestBadRequests(t *testing.T) {
	e, w := one(t)
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"bad JSON", "/v1/completions", `{"model": "m", "prompt": `, http.StatusBadRequest, "invalid_json"},
		{"bad JSON chat", "/v1/chat/completions", `not json`, http.StatusBadRequest, "invalid_json"},
		{"missing model", "/v1/completions", `{"prompt":"hi","max_tokens":2}`, http.StatusBadRequest, "missing_model"},
		{"missing model chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "missing_model"},
		{"unknown model", "/v1/completions", completion("nope", "hi", 2, false), http.StatusNotFound, "model_not_found"},
		{"unknown model streaming", "/v1/completions", completion("nope", "hi", 2, true), http.StatusNotFound, "model_not_found"},
		{"unknown model chat", "/v1/chat/completions", chat("nope", "hi", 2, false), http.StatusNotFound, "model_not_found"},
		{"max_tokens 0", "/v1/completions", completion("m", "hi", 0, false), http.StatusBadRequest, "invalid_max_tokens"},
		{"max_tokens negative", "/v1/completions", completion("m", "hi", -3, true), http.StatusBadRequest, "invalid_max_tokens"},
		{"max_tokens 0 chat", "/v1/chat/completions", chat("m", "hi", 0, false), http.StatusBadRequest, "invalid_max_tokens"},
		{"max_completion_tokens 0", "/v1/chat/completions", `{"model":"m","max_tokens":5,"max_completion_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, http.StatusBadRequest, "invalid_max_tokens"},
		{"no messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, http.StatusBadRequest, "invalid_prompt"},
		{"prompt not a string", "/v1/completions", `{"model":"m","prompt":42}`, http.StatusBadRequest, "invalid_prompt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post(tc.path, tc.body, map[string]string{"x-request-id": "bad-1"})
			require.Equal(t, tc.status, r.status, "body %s", r.body)
			assert.Equal(t, "bad-1", r.header.Get("x-request-id"), "the id is returned on errors too")
			errObj, ok := r.json(t)["error"].(map[string]any)
			require.True(t, ok, "body %s", r.body)
			assert.Equal(t, tc.code, errObj["code"])
			assert.Contains(t, errObj, "param")
			assert.Equal(t, "invalid_request_error", errObj["type"])
			assert.NotEmpty(t, errObj["message"])
		})
	}
	assert.Empty(t, w.Reqs, "a bad request reached the worker")
	m := e.metrics()
	assert.Zero(t, m[key(mRequests, "m")])
	assert.Zero(t, m[key(mCancellations, "m")])
}

func TestCompletedRequestIsNotACancellation(t *testing.T) {
	e, _ := one(t)
	r := e.post("/v1/completions", completion("m", "hi", 3, false), nil)
	require.Equal(t, http.StatusOK, r.status)
	r = e.post("/v1/chat/completions", chat("m", "hi", 3, false), nil)
	require.Equal(t, http.StatusOK, r.status)
	resp := e.open("/v1/completions", completion("m", "hi", 3, true), nil)
	ev := newEvents(resp)
	for range 3 {
		ev.chunk(t)
	}
	ev.done(t)
	require.NoError(t, resp.Body.Close()) // closing a finished stream is no disconnect

	m := e.metrics()
	assert.Equal(t, 3.0, m[key(mRequests, "m")])
	assert.Zero(t, m[key(mCancellations, "m")])
	assert.Zero(t, m[key(mConfirmed, "m")])
	assert.NotContains(t, m, key(mLatency+"_count", "m"))
}
