package frontend_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// weigher answers with ids, one per item, each with its log probability
// (-0.5 - position) and three candidates: the sampled token first, then two
// others.
func weigher(ids []int) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		prompt := parse(req).TokenIDs
		var asked struct {
			SamplingOptions map[string]any `json:"sampling_options"`
		}
		_ = json.Unmarshal(req.Payload, &asked)
		for i, id := range ids {
			lp := -0.5 - float64(i)
			item := map[string]any{"token_ids": []int{id}, "log_probs": []float64{lp},
				"top_logprobs": [][]map[string]any{{
					{"token_id": id, "logprob": lp, "rank": 1},
					{"token_id": id + 100, "logprob": lp - 1, "rank": 2},
					{"token_id": id + 200, "logprob": -1e30, "rank": 3},
				}}}
			if i == len(ids)-1 {
				item["finish_reason"] = "length"
			}
			if _, ok := asked.SamplingOptions["prompt_logprobs"]; ok && i == 0 {
				plps, ptops := []any{nil}, [][]map[string]any{{}}
				for j, pid := range prompt[1:] {
					plps = append(plps, -2.0-float64(j))
					ptops = append(ptops, []map[string]any{{"token_id": pid, "logprob": -2.0 - float64(j), "rank": 1}})
				}
				item["prompt_log_probs"], item["prompt_top_logprobs"] = plps, ptops
			}
			b, _ := json.Marshal(item)
			if req.Send(b) != nil {
				return
			}
		}
		req.Complete()
	}
}

// echo repeats the prompt before the completion; with logprobs, the
// prompt's tokens come first, the first without a logprob (null), as vLLM's
// server writes them.
func TestEcho(t *testing.T) {
	e := logprobsEnv(t, []int{0, 1})
	r := e.post("/v1/completions", `{"model":"llama","prompt":"Hi there","max_tokens":2,"echo":true}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "Hi there"+"Hello world", choice(t, r.json(t))["text"])

	r = e.post("/v1/completions", `{"model":"llama","prompt":"Hi there","max_tokens":2,"echo":true,"logprobs":0}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	m := r.json(t)
	lp := choice(t, m)["logprobs"].(map[string]any)
	toks, lps, tops := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any)
	promptTokens := int(m["usage"].(map[string]any)["prompt_tokens"].(float64))
	require.Len(t, toks, promptTokens+2, "the prompt's tokens (BOS first), then the two output tokens")
	assert.Equal(t, "<|begin_of_text|>", toks[0])
	assert.Nil(t, lps[0])
	assert.Nil(t, tops[0])
	assert.Equal(t, -2.0, lps[1])
	assert.Equal(t, []any{-0.5, -1.5}, lps[promptTokens:])

	// Streamed: the first chunk starts with the prompt.
	resp := e.open("/v1/completions", `{"model":"llama","prompt":"Hi there","max_tokens":2,"echo":true,"stream":true}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	first := choice(t, ev.chunk(t))["text"].(string)
	assert.Contains(t, first, "Hi there")

	// Not in the chat API; with logprobs, not where the card lacks prompt_logprobs.
	r = e.post("/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],"max_tokens":1,"echo":true}`, nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	r = e.post("/v1/completions", `{"model":"plain","prompt":"x","max_tokens":1,"echo":true}`, nil)
	require.Equal(t, http.StatusOK, r.status, "echo alone is the frontend's: %s", r.body)
}

func logprobsEnv(t *testing.T, ids []int) *env {
	dir, _ := modelDir(t)
	e := newEnv(t)
	card := llamaCard(t, dir, dir)
	card.Supports = modelcard.EngineParams
	e.workerMeta("w", "dynamo", card, weigher(ids))
	e.worker("mock", "dynamo", "plain", 0, planetest.Tokens)
	e.start()
	e.waitModels("llama", "plain")
	return e
}

func TestChatLogprobs(t *testing.T) {
	e := logprobsEnv(t, []int{0, 1, 2, 3})
	body := `{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"logprobs":true,"top_logprobs":2`
	r := e.post("/v1/chat/completions", body+`}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	content := choice(t, r.json(t))["logprobs"].(map[string]any)["content"].([]any)
	require.Len(t, content, 4)
	first := content[0].(map[string]any)
	assert.Equal(t, "Hello", first["token"])
	assert.Equal(t, -0.5, first["logprob"])
	assert.Equal(t, []any{72.0, 101.0, 108.0, 108.0, 111.0}, first["bytes"])
	tops := first["top_logprobs"].([]any)
	require.Len(t, tops, 2, "top_logprobs candidates, the sampled token first")
	assert.Equal(t, "Hello", tops[0].(map[string]any)["token"])
	assert.Equal(t, -1.5, tops[1].(map[string]any)["logprob"])

	// Streamed, the chunks' entries are the same list.
	resp := e.open("/v1/chat/completions", body+`,"stream":true}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := newEvents(resp)
	var streamed []any
	for {
		c := choice(t, ev.chunk(t))
		if lp, ok := c["logprobs"].(map[string]any); ok {
			streamed = append(streamed, lp["content"].([]any)...)
		}
		if c["finish_reason"] != nil {
			break
		}
	}
	ev.done(t)
	assert.Equal(t, content, streamed)
}

func TestCompletionLogprobs(t *testing.T) {
	e := logprobsEnv(t, []int{0, 1, 2})
	r := e.post("/v1/completions", `{"model":"llama","prompt":"hi","max_tokens":3,"logprobs":1}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	c := choice(t, r.json(t))
	lp := c["logprobs"].(map[string]any)
	toks := lp["tokens"].([]any)
	require.Len(t, toks, 3)
	assert.Equal(t, []any{-0.5, -1.5, -2.5}, lp["token_logprobs"])
	offsets := lp["text_offset"].([]any)
	assert.Equal(t, 0.0, offsets[0])
	assert.Equal(t, float64(len([]rune(toks[0].(string)))), offsets[1], "offsets in code points")
	top := lp["top_logprobs"].([]any)[0].(map[string]any)
	assert.Len(t, top, 2, "logprobs+1 candidates")
	assert.Equal(t, -0.5, top["Hello"])
	joined := ""
	for _, s := range toks {
		joined += s.(string)
	}
	assert.Equal(t, c["text"], joined)
}

// Below -9999 is -9999; the refusals; an engine without logprobs refuses them.
func TestLogprobsBoundsAndRefusals(t *testing.T) {
	e := logprobsEnv(t, []int{0})
	r := e.post("/v1/completions", `{"model":"llama","prompt":"hi","max_tokens":1,"logprobs":5}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	top := choice(t, r.json(t))["logprobs"].(map[string]any)["top_logprobs"].([]any)[0].(map[string]any)
	lowest := 0.0
	for _, v := range top {
		lowest = min(lowest, v.(float64))
	}
	assert.Equal(t, -9999.0, lowest, "-1e30 is written as -9999")
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21`, "top_logprobs"},
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"x"}],"top_logprobs":2`, "top_logprobs"},
		{"/v1/chat/completions", `"messages":[{"role":"user","content":"x"}],"logprobs":3`, "logprobs"},
		{"/v1/completions", `"prompt":"x","logprobs":21`, "logprobs"},
		{"/v1/completions", `"prompt":"x","logprobs":true`, "logprobs"},
		{"/v1/completions", `"prompt":"x","logprobs":1,"top_logprobs":1`, "top_logprobs"},
	} {
		r := e.post(c.path, `{"model":"llama","max_tokens":1,`+c.body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.body, r.body)
		assert.Equal(t, c.param, r.json(t)["error"].(map[string]any)["param"], c.body)
	}
	r = e.post("/v1/completions", `{"model":"plain","prompt":"x","max_tokens":1,"logprobs":1}`, nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, "unsupported_parameter", r.json(t)["error"].(map[string]any)["code"])
}
