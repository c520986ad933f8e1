package frontend_test

// OpenAI compatibility: usage, stream_options, n, seed, stop, prompt forms,
// refused parameters, error shapes on every path, model lookup, and the log
// line of a failed request.

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// payloadOf is the full token request a worker got.
type payloadOf struct {
	TokenIDs       []int `json:"token_ids"`
	StopConditions struct {
		MaxTokens    int   `json:"max_tokens"`
		StopTokenIDs []int `json:"stop_token_ids"`
		IgnoreEOS    *bool `json:"ignore_eos"`
	} `json:"stop_conditions"`
	SamplingOptions map[string]float64 `json:"sampling_options"`
}

func fullReq(t *testing.T, req *plane.Request) payloadOf {
	t.Helper()
	var p payloadOf
	require.NoError(t, json.Unmarshal(req.Payload, &p), "payload %s", req.Payload)
	return p
}

func usageOf(t *testing.T, m map[string]any) [3]int {
	t.Helper()
	u, ok := m["usage"].(map[string]any)
	require.True(t, ok, "no usage in %v", m)
	return [3]int{int(u["prompt_tokens"].(float64)), int(u["completion_tokens"].(float64)), int(u["total_tokens"].(float64))}
}

func choicesByIndex(t *testing.T, m map[string]any, field string) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, c := range m["choices"].([]any) {
		c := c.(map[string]any)
		v := c[field]
		if msg, ok := v.(map[string]any); ok {
			v = msg["content"]
		}
		out[int(c["index"].(float64))] = v.(string)
	}
	return out
}

func TestUsage(t *testing.T) {
	e, _ := one(t)
	r := e.post("/v1/completions", completion("m", "hello", 4, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Equal(t, [3]int{5, 4, 9}, usageOf(t, r.json(t)))
	r = e.post("/v1/chat/completions", chat("m", "hi", 3, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Equal(t, [3]int{len("user: hi\n"), 3, len("user: hi\n") + 3}, usageOf(t, r.json(t)))

	// Streaming with include_usage: every chunk has "usage": null, then a
	// chunk with no choices has the usage, then [DONE].
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := `{"model":"m","prompt":"hello","messages":[{"role":"user","content":"hello"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
		resp := e.open(path, body, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ev := newEvents(resp)
		for i := 0; i < 3; i++ {
			m := ev.chunk(t)
			assert.Contains(t, m, "usage")
			assert.Nil(t, m["usage"])
		}
		last := ev.chunk(t)
		assert.Equal(t, []any{}, last["choices"])
		prompt := 5
		if strings.Contains(path, "chat") {
			prompt = len("user: hello\n")
		}
		assert.Equal(t, [3]int{prompt, 3, prompt + 3}, usageOf(t, last))
		ev.done(t)
	}
	// Without it, no chunk carries usage.
	resp := e.open("/v1/completions", completion("m", "hello", 2, true), nil)
	ev := newEvents(resp)
	assert.NotContains(t, ev.chunk(t), "usage")
	assert.NotContains(t, ev.chunk(t), "usage")
	ev.done(t)
}

func TestPromptForms(t *testing.T) {
	e, w := one(t)
	cases := []struct {
		name, prompt string
		want         [][]int // the token ids each worker request gets
	}{
		{"string", `"ab"`, [][]int{bytesOf("ab")}},
		{"strings", `["ab","c","def"]`, [][]int{bytesOf("ab"), bytesOf("c"), bytesOf("def")}},
		{"token ids", `[5,6,7]`, [][]int{{5, 6, 7}}},
		{"lists of token ids", `[[1,2],[3]]`, [][]int{{1, 2}, {3}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.post("/v1/completions", `{"model":"m","max_tokens":2,"prompt":`+tc.prompt+`}`, nil)
			require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
			var got [][]int
			for range tc.want {
				got = append(got, fullReq(t, w.NextReq(t)).TokenIDs)
			}
			sort.Slice(got, func(i, j int) bool {
				return len(got[i]) < len(got[j]) || len(got[i]) == len(got[j]) && got[i][0] < got[j][0]
			})
			want := append([][]int(nil), tc.want...)
			sort.Slice(want, func(i, j int) bool {
				return len(want[i]) < len(want[j]) || len(want[i]) == len(want[j]) && want[i][0] < want[j][0]
			})
			assert.Equal(t, want, got)
			m := r.json(t)
			texts := choicesByIndex(t, m, "text")
			require.Len(t, texts, len(tc.want))
			prompts := 0
			for i, p := range tc.want {
				assert.Equal(t, text(len(p), 2), texts[i], "choice %d is prompt %d's", i, i)
				prompts += len(p)
			}
			assert.Equal(t, [3]int{prompts, 2 * len(tc.want), prompts + 2*len(tc.want)}, usageOf(t, m))
		})
	}
	for name, prompt := range map[string]string{
		"empty array": `[]`, "empty token list": `[[]]`, "negative id": `[1,-2]`, "mixed": `["a",1]`,
		"number": `42`, "object": `{"a":1}`, "floats": `[1.5]`, "null": `null`,
	} {
		r := e.post("/v1/completions", `{"model":"m","max_tokens":2,"prompt":`+prompt+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: body %s", name, r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, "prompt", errObj["param"], name)
	}
	assert.Empty(t, w.Reqs, "a bad prompt reached the worker")
}

func TestNAndSeed(t *testing.T) {
	e, w := one(t)
	r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"n":3,"seed":40,"temperature":0.5,"top_p":0.9}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	m := r.json(t)
	assert.Len(t, choicesByIndex(t, m, "text"), 3)
	assert.Equal(t, [3]int{2, 6, 8}, usageOf(t, m), "the prompt counts once")
	var seeds []float64
	for range 3 {
		p := fullReq(t, w.NextReq(t))
		seeds = append(seeds, p.SamplingOptions["seed"])
		assert.Equal(t, 0.5, p.SamplingOptions["temperature"])
		assert.Equal(t, 0.9, p.SamplingOptions["top_p"])
	}
	sort.Float64s(seeds)
	assert.Equal(t, []float64{40, 41, 42}, seeds)

	// n without a seed: distinct drawn seeds; n = 1 without one: none sent.
	r = e.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,"n":2}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	a, b := fullReq(t, w.NextReq(t)).SamplingOptions["seed"], fullReq(t, w.NextReq(t)).SamplingOptions["seed"]
	assert.Equal(t, 1.0, math.Abs(a-b), "choice seeds are consecutive") // in either order of arrival
	r = e.post("/v1/completions", completion("m", "hi", 1, false), nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.NotContains(t, fullReq(t, w.NextReq(t)).SamplingOptions, "seed")

	// Streamed n: chunks of both choices, each with its own index and role.
	resp := e.open("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"n":2,"stream":true}`, nil)
	ev := newEvents(resp)
	roles := map[float64]int{}
	for range 4 {
		c := choice(t, ev.chunk(t))
		if _, ok := c["delta"].(map[string]any)["role"]; ok {
			roles[c["index"].(float64)]++
		}
	}
	ev.done(t)
	assert.Equal(t, map[float64]int{0: 1, 1: 1}, roles)
}

func TestStop(t *testing.T) {
	for _, tc := range []struct {
		stops, pieces []string
		want          string
		hit           bool
	}{
		{[]string{"cd"}, []string{"ab", "cd", "ef"}, "ab", true},
		{[]string{"bc"}, []string{"ab", "cd"}, "a", true},            // across pieces
		{[]string{"xyz"}, []string{"ab", "cx", "y"}, "abcxy", false}, // a held prefix that never completes
		{[]string{"zz", "b"}, []string{"abzz"}, "a", true},           // the earliest wins
		{nil, []string{"ab"}, "ab", false},
	} {
		got, hit := frontend.StopText(tc.stops, tc.pieces)
		assert.Equal(t, tc.want, got, "%v in %v", tc.stops, tc.pieces)
		assert.Equal(t, tc.hit, hit, "%v in %v", tc.stops, tc.pieces)
	}

	e, w := one(t)
	words := text(5, 8)              // what "hello" gets
	stop := strings.Fields(words)[3] // the 4th word
	want := words[:strings.Index(words, " "+stop)+1]
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": "hello", "max_tokens": 8, "stop": stop, "stop_token_ids": []int{99}, "ignore_eos": true})
	r := e.post("/v1/completions", string(body), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	c := choice(t, r.json(t))
	assert.Equal(t, want, c["text"])
	assert.Equal(t, "stop", c["finish_reason"])
	p := fullReq(t, w.NextReq(t))
	assert.Equal(t, []int{99}, p.StopConditions.StopTokenIDs)
	require.NotNil(t, p.StopConditions.IgnoreEOS)
	assert.True(t, *p.StopConditions.IgnoreEOS)

	// Streaming: the same text, the last chunk with finish_reason "stop".
	body, _ = json.Marshal(map[string]any{"model": "m", "prompt": "hello", "max_tokens": 8, "stop": []string{stop}, "stream": true})
	resp := e.open("/v1/completions", string(body), nil)
	ev := newEvents(resp)
	var got strings.Builder
	for {
		c := choice(t, ev.chunk(t))
		got.WriteString(c["text"].(string))
		if c["finish_reason"] != nil {
			assert.Equal(t, "stop", c["finish_reason"])
			break
		}
	}
	ev.done(t)
	assert.Equal(t, want, got.String())
	// The frontend ended the worker's request: no cancellation is counted.
	m := e.metrics()
	assert.Zero(t, m[key(mCancellations, "m")])
}

func TestRefusedParameters(t *testing.T) {
	e, w := one(t)
	for _, tc := range []struct{ extra, param string }{
		{`"logprobs":1`, "logprobs"},
		{`"logprobs":0`, "logprobs"},
		{`"top_logprobs":2`, "top_logprobs"},
		{`"echo":true,"logprobs":0`, "logprobs"},
		{`"best_of":2`, "best_of"},
		{`"suffix":"x"`, "suffix"},
		{`"logit_bias":{"1":5}`, "logit_bias"},
		{`"tools":[{"type":"function"}]`, "tools"},
		{`"response_format":{"type":"json_object"}`, "response_format"},
		{`"n":0`, "n"},
		{`"n":129`, "n"},
		{`"temperature":2.5`, "temperature"},
		{`"top_p":0`, "top_p"},
		{`"presence_penalty":3`, "presence_penalty"},
		{`"stop":["a","b","c","d","e"]`, "stop"},
		{`"stop":5`, "stop"},
		{`"stop_token_ids":[-1]`, "stop_token_ids"},
		{`"seed":9223372036854775807,"n":2`, "seed"},
		{`"stream_options":{"include_usage":true}`, "stream_options"},
	} {
		r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,`+tc.extra+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: body %s", tc.extra, r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, tc.param, errObj["param"], tc.extra)
		assert.Equal(t, "invalid_request_error", errObj["type"], tc.extra)
	}
	// prompts times n over MaxChoices (its own body: a key given twice is refused).
	r := e.post("/v1/completions", `{"model":"m","prompt":["a","b"],"max_tokens":2,"n":100}`, nil)
	require.Equal(t, http.StatusBadRequest, r.status, "body %s", r.body)
	assert.Equal(t, "n", r.json(t)["error"].(map[string]any)["param"])
	// Neutral values pass: chat's logprobs false, best_of = n, text format, no tools.
	r = e.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1,
		"logprobs":false,"top_logprobs":0,"response_format":{"type":"text"},"tool_choice":"none","logit_bias":{},"presence_penalty":0}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	w.NextReq(t)
	assert.Empty(t, w.Reqs)
}

func TestChatDefaultsToTheContextLimit(t *testing.T) {
	e := newEnv(t)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxModelLen: 40}, planetest.Tokens)
	e.start()
	e.waitModels("m")
	r := e.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Equal(t, 40-len("user: hi\n"), fullReq(t, w.NextReq(t)).StopConditions.MaxTokens)
	assert.Equal(t, [3]int{9, 31, 40}, usageOf(t, r.json(t)))
	// A prompt that fills the context leaves no room: 400.
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": strings.Repeat("x", 33)}}}) // 40 tokens
	r = e.post("/v1/chat/completions", string(body), nil)
	require.Equal(t, http.StatusBadRequest, r.status, "body %s", r.body)
	assert.Equal(t, "context_length_exceeded", r.json(t)["error"].(map[string]any)["code"])
}

// logCapture collects the library's log records while a test runs.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *logCapture) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.Write(b)
}

func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func captureLogs(t *testing.T) *logCapture {
	c := &logCapture{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return c
}

func TestErrorsEverywhereAndFailureLogs(t *testing.T) {
	logs := captureLogs(t)
	e := newEnv(t)
	e.worker("w", "dynamo", "m", 0, planetest.Tokens)
	e.worker("bad", "dynamo", "broken", 0, func(w *planetest.Worker, req *plane.Request) { req.Fail("RuntimeError: engine exploded") })
	e.start()
	e.waitModels("broken", "m")

	shape := func(r response, status int, code string) {
		t.Helper()
		require.Equal(t, status, r.status, "body %s", r.body)
		assert.Contains(t, r.header.Get("Content-Type"), "application/json")
		errObj, ok := r.json(t)["error"].(map[string]any)
		require.True(t, ok, "body %s", r.body)
		for _, k := range []string{"message", "type", "param", "code"} {
			assert.Contains(t, errObj, k)
		}
		assert.Equal(t, code, errObj["code"])
	}
	shape(e.do(http.MethodGet, "/v1/nope", "", nil), http.StatusNotFound, "unknown_url")
	shape(e.do(http.MethodPost, "/", "{}", nil), http.StatusNotFound, "unknown_url")
	r := e.do(http.MethodGet, "/v1/completions", "", nil)
	shape(r, http.StatusMethodNotAllowed, "method_not_allowed")
	assert.Equal(t, "POST", r.header.Get("Allow"))
	r = e.do(http.MethodPost, "/v1/models", "{}", nil)
	shape(r, http.StatusMethodNotAllowed, "method_not_allowed")
	assert.Contains(t, r.header.Get("Allow"), "GET")
	shape(e.do(http.MethodGet, "/v1/models/nope", "", nil), http.StatusNotFound, "model_not_found")
	r = e.do(http.MethodGet, "/v1/models/m", "", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "m", r.json(t)["id"])
	assert.Equal(t, "model", r.json(t)["object"])

	// A worker's failure: 500 in OpenAI's shape, logged at ERROR with the id.
	shape(e.post("/v1/completions", completion("broken", "hi", 2, false), map[string]string{"x-request-id": "boom-1"}),
		http.StatusInternalServerError, "internal_error")
	// In a stream the status is already 200: an error event, logged the same.
	resp := e.open("/v1/completions", completion("broken", "hi", 2, true), map[string]string{"x-request-id": "boom-2"})
	data, err := newEvents(resp).next()
	require.NoError(t, err)
	assert.Contains(t, data, "engine exploded")

	e.post("/v1/completions", completion("nope", "hi", 2, false), map[string]string{"x-request-id": "lost-1"})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "boom-2") }, planetest.WaitLimit, 10*time.Millisecond)
	lines := func(sub string) []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "request failed") && strings.Contains(l, sub) {
				out = append(out, l)
			}
		}
		return out
	}
	for id, want := range map[string]string{"boom-1": "level=ERROR", "boom-2": "level=ERROR", "lost-1": "level=WARN"} {
		l := lines("request_id=" + id)
		require.Len(t, l, 1, "one line for %s in\n%s", id, logs.String())
		assert.Contains(t, l[0], want)
	}
	assert.Contains(t, lines("request_id=boom-1")[0], "engine exploded")
	assert.Contains(t, lines("request_id=lost-1")[0], "status=404")
	assert.Len(t, lines("path=/v1/nope"), 1)
	assert.Len(t, lines("status=405"), 2)
	// Successful requests are not logged as failures.
	before := len(lines(""))
	require.Equal(t, http.StatusOK, e.post("/v1/completions", completion("m", "hi", 1, false), nil).status)
	assert.Len(t, lines(""), before)
}

// A client that disconnects from a request with n choices kills every one of
// its worker requests: n cancellations, n confirmed aborts.
func TestDisconnectWithNChoices(t *testing.T) {
	d := newDisconnectEnv(t, 1)
	resp := d.open("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":50,"n":2,"stream":true}`, map[string]string{"x-request-id": "dc-n"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	ev.chunk(t)
	ev.chunk(t)
	planetest.Recv(t, d.got, "the first request at the worker")
	planetest.Recv(t, d.got, "the second request at the worker")
	require.NoError(t, resp.Body.Close())
	for range 2 {
		h := planetest.Recv(t, d.killed, "a worker request killed")
		assert.Equal(t, "dc-n", h.req.ID)
	}
	d.waitMetric(key(mCancellations, "m"), 2)
	close(d.release)
	d.waitMetric(key(mConfirmed, "m"), 2)
	assert.Equal(t, 2.0, d.metrics()[key(mRequests, "m")])
}
