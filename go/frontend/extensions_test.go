package frontend_test

// vLLM's extensions (extensions.go): engine parameters go to the engines
// whose cards list them, and are refused elsewhere; the frontend's own shape
// the text.

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

// samplingOf is the sampling_options a worker got.
func samplingOf(t *testing.T, req *plane.Request) map[string]any {
	t.Helper()
	var p struct {
		SamplingOptions map[string]any `json:"sampling_options"`
	}
	require.NoError(t, json.Unmarshal(req.Payload, &p))
	return p.SamplingOptions
}

func TestEngineParamsRefusedUnlessTheCardListsThem(t *testing.T) {
	e, w := one(t) // a card that lists none
	for _, body := range []string{`"top_k":5`, `"min_p":0.1`, `"repetition_penalty":1.2`, `"min_tokens":1`,
		`"logit_bias":{"5":1}`, `"allowed_token_ids":[1,2]`, `"bad_words":["x"]`} {
		r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,`+body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, "unsupported_parameter", errObj["code"], body)
	}
	// Neutral values ask nothing.
	r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"top_k":-1,"min_p":0,"repetition_penalty":1,`+
		`"min_tokens":0,"logit_bias":{},"allowed_token_ids":[],"bad_words":[],"skip_special_tokens":true,"spaces_between_special_tokens":false}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Empty(t, samplingOf(t, w.NextReq(t)))
}

func TestEngineParamsSentWhereHonoured(t *testing.T) {
	e := newEnv(t)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", Mode: modelcard.Agg, Supports: modelcard.EngineParams}, planetest.Tokens)
	e.start()
	e.waitModels("m")
	r := e.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"top_k":5,`+
		`"min_p":0.1,"repetition_penalty":1.2,"min_tokens":2,"logit_bias":{"5":150,"7":-3},"allowed_token_ids":[1,2],"bad_words":["x y"]}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, map[string]any{
		"top_k": 5.0, "min_p": 0.1, "repetition_penalty": 1.2, "min_tokens": 2.0,
		"logit_bias":        map[string]any{"5": 100.0, "7": -3.0}, // clamped to [-100, 100], as vLLM does
		"allowed_token_ids": []any{1.0, 2.0}, "bad_words": []any{"x y"},
	}, samplingOf(t, w.NextReq(t)))

	for _, c := range []struct{ body, param string }{
		{`"top_k":-2`, "top_k"}, {`"min_p":1.5`, "min_p"}, {`"repetition_penalty":0`, "repetition_penalty"},
		{`"min_tokens":-1`, "min_tokens"}, {`"min_tokens":5`, "min_tokens"}, {`"logit_bias":{"a":1}`, "logit_bias"},
		{`"allowed_token_ids":[-1]`, "allowed_token_ids"}, {`"bad_words":[""]`, "bad_words"},
		{`"skip_special_tokens":false,"spaces_between_special_tokens":false`, "spaces_between_special_tokens"},
	} {
		r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4,`+c.body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.body, r.body)
		assert.Equal(t, c.param, r.json(t)["error"].(map[string]any)["param"], c.body)
	}
}

// A model's token ids are checked against its vocabulary.
func TestEngineParamIDsInTheVocabulary(t *testing.T) {
	dir, x := modelDir(t)
	e := newEnv(t)
	prompts := make(chan []int, 16)
	card := llamaCard(t, dir, dir)
	card.Supports = modelcard.EngineParams
	e.workerMeta("w", "dynamo", card, speaker(x.OutputIDs, prompts))
	e.start()
	for _, body := range []string{`"allowed_token_ids":[100000]`, `"logit_bias":{"100000":1}`} {
		r := e.post("/v1/completions", `{"model":"llama","prompt":"hi","max_tokens":4,`+body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
	}
}

// Stop strings: include_stop_str_in_output keeps the stop string; with
// min_tokens, a stop string in the first tokens' text does not stop.
// skip_special_tokens false makes special tokens text.
func TestTextExtensions(t *testing.T) {
	dir, _ := modelDir(t)
	e := newEnv(t)
	prompts := make(chan []int, 64)
	card := llamaCard(t, dir, dir)
	card.Supports = modelcard.EngineParams
	e.workerMeta("w", "dynamo", card, speaker([]int{0, 282, 1, 2}, prompts))
	e.start()
	for _, c := range []struct{ extra, want string }{
		{`"stop":["o"]`, "Hell"},
		{`"stop":["o"],"include_stop_str_in_output":true`, "Hello"},
		{`"stop":["o"],"min_tokens":1`, "Hello w"},
		{`"stop":["o"],"min_tokens":1,"include_stop_str_in_output":true`, "Hello wo"},
		{`"skip_special_tokens":false`, "Hello<|eot_id|> world caf"},
		{``, "Hello world caf"},
	} {
		body := `{"model":"llama","prompt":"hi","max_tokens":8` + map[bool]string{true: "", false: ","}[c.extra == ""] + c.extra + `}`
		r := e.post("/v1/completions", body, nil)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", body, r.body)
		assert.Equal(t, c.want, choice(t, r.json(t))["text"], body)
		<-prompts
	}
}

// Structured output goes to engines whose card lists structured_outputs,
// as vLLM's StructuredOutputsParams fields; elsewhere it is refused naming
// the field that asked it.
func TestStructuredOutput(t *testing.T) {
	e := newEnv(t)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", Mode: modelcard.Agg, Supports: modelcard.EngineParams}, planetest.Tokens)
	e.worker("mock", "dynamo", "plain", 0, planetest.Tokens)
	e.start()
	e.waitModels("m", "plain")
	schema := `{"type":"object","properties":{"a":{"type":"integer"}}}`
	for _, c := range []struct{ body, want string }{
		{`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + schema + `,"strict":true}}`, `{"json":` + schema + `}`},
		{`"response_format":{"type":"json_object"}`, `{"json_object":true}`},
		{`"structured_outputs":{"choice":["a","b"]}`, `{"choice":["a","b"]}`},
		{`"structured_outputs":{"regex":"[0-9]+"}`, `{"regex":"[0-9]+"}`},
	} {
		r := e.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,`+c.body+`}`, nil)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", c.body, r.body)
		got, err := json.Marshal(samplingOf(t, w.NextReq(t))["structured_outputs"])
		require.NoError(t, err)
		assert.JSONEq(t, c.want, string(got), c.body)

		r = e.post("/v1/chat/completions", `{"model":"plain","messages":[{"role":"user","content":"hi"}],"max_tokens":2,`+c.body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.body, r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, "unsupported_parameter", errObj["code"], c.body)
	}
	for _, body := range []string{
		`"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`,
		`"response_format":{"type":"structural_tag"}`,
		`"structured_outputs":{"choice":["a"],"regex":"a"}`,
		`"structured_outputs":{"json":3}`,
	} {
		r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,`+body+`}`, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", body, r.body)
	}
}
