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
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// --- the request plane and the frontend ---------------------------------------

type env struct {
	t    *testing.T
	host *plane.Runtime // embeds NATS; the frontend runs on it
	fe   *frontend.Frontend
	base string
	hc   *http.Client
	// slow raises do's deadline for requests that are heavy under -race
	// (multi-megabyte bodies) on a loaded machine.
	slow bool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return &env{t: t, host: planetest.Embedded(t)}
}

// start runs the frontend on the host runtime, deferring to the migration
// limit the workers declare. Start it after the workers: it closes first.
func (e *env) start() {
	e.t.Helper()
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1})
}

// startWith is start with the given options.
func (e *env) startWith(opts frontend.Options) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), planetest.WaitLimit)
	defer cancel()
	fe, err := frontend.New(ctx, e.host, opts)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { assert.NoError(e.t, fe.Close()) })
	e.fe = fe
	e.base = "http://" + fe.Addr()
	tr := &http.Transport{}
	e.hc = &http.Client{Transport: tr}
	e.t.Cleanup(tr.CloseIdleConnections) // before the frontend closes
}

// --- workers ------------------------------------------------------------------

// worker starts a worker runtime serving "<namespace>.backend.generate" for
// model, declaring migrationLimit in its instance metadata.
func (e *env) worker(name, namespace, model string, migrationLimit int, h planetest.Handler) *planetest.Worker {
	e.t.Helper()
	return e.workerMeta(name, namespace, map[string]any{"model": model, "migration_limit": migrationLimit}, h)
}

// workerMeta is worker with the given instance metadata.
func (e *env) workerMeta(name, namespace string, metadata map[string]any, h planetest.Handler) *planetest.Worker {
	e.t.Helper()
	meta, err := json.Marshal(metadata)
	require.NoError(e.t, err)
	return planetest.Serve(e.t, planetest.Join(e.t, e.host), namespace+".backend.generate", h,
		planetest.Named(name), planetest.WithMetadata(meta))
}

// tokenRequest is what the frontend sends a worker.
type tokenRequest struct {
	Model          string `json:"model"`
	TokenIDs       []int  `json:"token_ids"`
	StopConditions struct {
		MaxTokens int `json:"max_tokens"`
	} `json:"stop_conditions"`
}

func parseReq(t *testing.T, req *plane.Request) tokenRequest {
	t.Helper()
	var p tokenRequest
	require.NoError(t, json.Unmarshal(req.Payload, &p), "payload %s", req.Payload)
	return p
}

// held is one request of a hold handler, as the handler saw it.
type held struct {
	req    *plane.Request
	reason ctxtree.Reason // once killed
}

// hold is an engine that sends k tokens, reports the request on got, waits
// until the request is killed, reports its state on killed, then waits for
// release before returning (the abort is confirmed when it returns).
func hold(k int, got chan<- *plane.Request, killed chan<- held, release <-chan struct{}) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		w.SendTokens(req, len(parse(req).TokenIDs), k, "")
		got <- req
		select {
		case <-req.Ctx.Killed():
		case <-w.Quit:
			return
		}
		killed <- held{req: req, reason: req.Ctx.Reason()}
		select {
		case <-release:
		case <-w.Quit:
		}
	}
}

func parse(req *plane.Request) tokenRequest {
	var p tokenRequest
	_ = json.Unmarshal(req.Payload, &p)
	return p
}

// --- the client's side --------------------------------------------------------

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body %s", r.body)
	return m
}

func (e *env) request(method, path, body string, hdr map[string]string) *http.Request {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	require.NoError(e.t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return req
}

// do sends a request and reads the whole response.
func (e *env) do(method, path, body string, hdr map[string]string) response {
	e.t.Helper()
	limit := planetest.WaitLimit
	if e.slow {
		limit = 6 * planetest.WaitLimit
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	resp, err := e.hc.Do(e.request(method, path, body, hdr).WithContext(ctx))
	require.NoError(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// doAsync sends req on another goroutine; the channel gets the error of the
// exchange (the response's body is closed unread).
func (e *env) doAsync(req *http.Request) <-chan error {
	errc := make(chan error, 1)
	go func() {
		resp, err := e.hc.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	return errc
}

func (e *env) post(path, body string, hdr map[string]string) response {
	e.t.Helper()
	return e.do(http.MethodPost, path, body, hdr)
}

// open sends a (streaming) request and returns the response with its body
// still open; the body is closed at cleanup.
func (e *env) open(path, body string, hdr map[string]string) *http.Response {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), planetest.WaitLimit)
	e.t.Cleanup(cancel)
	resp, err := e.hc.Do(e.request(http.MethodPost, path, body, hdr).WithContext(ctx))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// events reads the data of server-sent events.
type events struct{ r *bufio.Reader }

func newEvents(resp *http.Response) *events { return &events{r: bufio.NewReader(resp.Body)} }

// next returns the data of the next event.
func (s *events) next() (string, error) {
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line != "" {
				return "", io.ErrUnexpectedEOF
			}
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return "", fmt.Errorf("not an SSE data line: %q", line)
		}
		return data, nil
	}
}

// chunk reads the next event, which must be a JSON chunk.
func (s *events) chunk(t *testing.T) map[string]any {
	t.Helper()
	data, err := s.next()
	require.NoError(t, err)
	require.NotEqual(t, "[DONE]", data, "the stream ended early")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(data), &m), "chunk %s", data)
	return m
}

// done reads the final [DONE] event and the end of the body.
func (s *events) done(t *testing.T) {
	t.Helper()
	data, err := s.next()
	require.NoError(t, err)
	require.Equal(t, "[DONE]", data)
	_, err = s.next()
	require.ErrorIs(t, err, io.EOF, "nothing after [DONE]")
}

func choice(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	cs, ok := m["choices"].([]any)
	require.True(t, ok && len(cs) == 1, "choices of %v", m)
	c, ok := cs[0].(map[string]any)
	require.True(t, ok)
	return c
}

// text is the text the frontend makes of the tokens at positions from,
// from+1, ..., from+n-1.
func text(from, n int) string {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = from + i
	}
	return frontend.Detokenize(ids)
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// --- metrics and models ---------------------------------------------------------

// metrics fetches GET /metrics as "name{labels}" -> value.
func (e *env) metrics() map[string]float64 {
	e.t.Helper()
	r := e.do(http.MethodGet, "/metrics", "", nil)
	require.Equal(e.t, http.StatusOK, r.status)
	out := map[string]float64{}
	for _, line := range strings.Split(string(r.body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		require.Positive(e.t, i, "metrics line %q", line)
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(e.t, err, "metrics line %q", line)
		out[line[:i]] = v
	}
	return out
}

func key(name, model string) string { return name + `{model="` + model + `"}` }

const (
	mRequests      = "dynamo_ctx_frontend_requests_total"
	mCancellations = "dynamo_ctx_frontend_cancellations_total"
	mConfirmed     = "dynamo_ctx_frontend_aborts_confirmed_total"
	mLatency       = "dynamo_ctx_frontend_disconnect_to_abort_seconds"
)

// waitMetric waits until the metric has the value.
func (e *env) waitMetric(k string, want float64) {
	e.t.Helper()
	var last float64
	ok := assert.Eventually(e.t, func() bool {
		last = e.metrics()[k]
		return last == want
	}, planetest.WaitLimit, 5*time.Millisecond)
	if !ok {
		e.t.Fatalf("metric %s is %v, want %v", k, last, want)
	}
}

// models returns the ids GET /v1/models lists.
func (e *env) models() []string {
	e.t.Helper()
	r := e.do(http.MethodGet, "/v1/models", "", nil)
	require.Equal(e.t, http.StatusOK, r.status)
	var body struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	require.NoError(e.t, json.Unmarshal(r.body, &body))
	require.Equal(e.t, "list", body.Object)
	ids := []string{}
	for _, d := range body.Data {
		require.Equal(e.t, "model", d.Object)
		ids = append(ids, d.ID)
	}
	return ids
}

// waitModels waits until GET /v1/models lists exactly want.
func (e *env) waitModels(want ...string) {
	e.t.Helper()
	var last []string
	ok := assert.Eventually(e.t, func() bool {
		last = e.models()
		return slices.Equal(last, want)
	}, planetest.WaitLimit, 5*time.Millisecond)
	if !ok {
		e.t.Fatalf("models are %v, want %v", last, want)
	}
}

// --- helpers ------------------------------------------------------------------

func completion(model, prompt string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "stream": stream})
	return string(b)
}

func chat(model, content string, maxTokens int, stream bool) string {
	b, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "stream": stream,
		"messages": []any{map[string]any{"role": "user", "content": content}},
	})
	return string(b)
}

// one starts an env with one healthy worker of model "m" and the frontend.
func one(t *testing.T) (*env, *planetest.Worker) {
	t.Helper()
	e := newEnv(t)
	w := e.worker("w", "dynamo", "m", 0, planetest.Tokens)
	e.start()
	e.waitModels("m")
	return e, w
}

// holding starts the frontend with one worker for model "m" that yields
// nothing and holds each request until it is killed (then returns, which
// confirms the abort); the requests arrive on the returned channel.
func holding(t *testing.T, buffer int) (*env, chan *plane.Request) {
	t.Helper()
	e := newEnv(t)
	got := make(chan *plane.Request, buffer)
	e.worker("w", "dynamo", "m", 0, planetest.Hold(got))
	e.start()
	e.waitModels("m")
	return e, got
}

// ================================================================================
// Tests
// ================================================================================

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

// lateRegistration is a bug of the frontend (serve.go, serve): when the
// disconnect's AfterFunc has started (on its own goroutine) but not yet
// registered the pending abort, stopWatching() returns false and serve goes
// on at once to stream.Kill(), which kills the request's attempt. A worker
// whose handler returns at once when killed (as engines do) confirms the
// abort, and the confirmation can reach onAbortConfirmed before
// f.disconnected has put the request in f.pending: it is dropped, and the
// cancellation is counted but never confirmed. serve must wait for a running
// AfterFunc to finish (e.g. run disconnected under a sync.Once and call it
// after stopWatching() whenever r.Context() is done) before killing the
// stream. In TestEveryDisconnectCounted about one run in five loses one.

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

// migrationEnv has two workers of model "m" declaring migration_limit 1. The
// first request whose prompt is "hello" (whichever worker gets it) sends
// three tokens, reports its worker on crashed and waits; every other request
// is served normally.
type migrationEnv struct {
	*env
	ws      [2]*planetest.Worker
	crashed chan *planetest.Worker
	served  [2]atomic.Int64
}

func newMigrationEnv(t *testing.T) *migrationEnv {
	t.Helper()
	m := &migrationEnv{env: newEnv(t), crashed: make(chan *planetest.Worker, 1)}
	var first atomic.Bool
	for i := range m.ws {
		m.ws[i] = m.worker(fmt.Sprintf("w%d", i), "dynamo", "m", 1, func(w *planetest.Worker, req *plane.Request) {
			m.served[i].Add(1)
			p := parse(req)
			if slices.Equal(p.TokenIDs, bytesOf("hello")) && first.CompareAndSwap(false, true) {
				if !w.SendTokens(req, len(p.TokenIDs), 3, "") {
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
