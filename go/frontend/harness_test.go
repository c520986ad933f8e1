package frontend_test

// The harness of the frontend's tests (frontend_test.go says what it runs):
// the request plane and the frontend, workers, the client's side, metrics
// and models.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// --- the request plane and the frontend ---------------------------------------

type env struct {
	t    testing.TB     // a test's, or BenchmarkIdleFlood's
	host *plane.Runtime // embeds NATS; the frontend runs on it
	fe   *frontend.Frontend
	base string
	hc   *http.Client
	// slow raises do's deadline for requests that are heavy under -race
	// (multi-megabyte bodies) on a loaded machine.
	slow bool
}

func newEnv(t testing.TB) *env {
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
	return e.workerMeta(name, namespace, modelcard.Card{Model: model, Mode: modelcard.Agg, MigrationLimit: migrationLimit}, h)
}

// workerMeta is worker with the given model card as its instance metadata.
func (e *env) workerMeta(name, namespace string, card modelcard.Card, h planetest.Handler) *planetest.Worker {
	e.t.Helper()
	return planetest.Serve(e.t, planetest.Join(e.t, e.host), namespace+".backend.generate", h,
		planetest.Named(name), planetest.WithMetadata(cardJSON(e.t, card)))
}

// cardJSON is card's encoding, as a worker publishes it (go/modelcard), for
// cards of any test's making (Validate is the worker's business).
func cardJSON(t testing.TB, card modelcard.Card) []byte {
	t.Helper()
	b, err := json.Marshal(card)
	require.NoError(t, err)
	return b
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

func (r response) json(t testing.TB) map[string]any {
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
