package frontend_test

// Tools and reasoning end to end through the frontend: a worker of a model
// directory (testdata/model with Hermes' and DeepSeek-R1's markers added as
// tokens) whose card names a tool-call parser and a reasoning parser, and
// that says a chosen output.

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// markerDir is testdata/model with the markers as added tokens (not
// special, as Qwen3's are) and a template that renders tools.
func markerDir(t *testing.T) string {
	t.Helper()
	src, _ := modelDir(t)
	dir := t.TempDir()
	var tok map[string]any
	b, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &tok))
	added := tok["added_tokens"].([]any)
	next := 283
	for _, m := range []string{"<think>", "</think>", "<tool_call>", "</tool_call>"} {
		added = append(added, map[string]any{"id": next, "content": m, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": false})
		next++
	}
	tok["added_tokens"] = added
	b, _ = json.Marshal(tok)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644))
	cfg := `{"bos_token":"<|begin_of_text|>","eos_token":"<|eot_id|>","chat_template":` +
		`"{% if tools %}[tools]{{ tools | tojson }}{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644))
	return dir
}

// eotID is testdata/model's <|eot_id|>, its end of turn.
const eotID = 282

// sayer answers every request with ids, one per item, the last with finish;
// a "stop" comes with the end-of-turn token, as an engine's EOS.
func sayer(ids []int, finish string) planetest.Handler {
	if finish == "stop" {
		ids = append(slices.Clone(ids), eotID)
	}
	return func(w *planetest.Worker, req *plane.Request) {
		for i, id := range ids {
			item := map[string]any{"token_ids": []int{id}}
			if i == len(ids)-1 {
				item["finish_reason"] = finish
			}
			b, _ := json.Marshal(item)
			if req.Send(b) != nil {
				return
			}
		}
		req.Complete()
	}
}

// toolEnv runs a frontend and a worker of markerDir whose card names the
// parsers, saying out (tokenized by the model's tokenizer).
func toolEnv(t *testing.T, toolParser, reasoningParser, out, finish string) *env {
	dir := markerDir(t)
	m, err := hfmodel.Load(dir)
	require.NoError(t, err)
	ids, err := m.Tokenizer().Encode(out, false)
	require.NoError(t, err)
	card := llamaCard(t, dir, dir)
	card.ToolCallParser, card.ReasoningParser = toolParser, reasoningParser
	e := newEnv(t)
	e.workerMeta("w", "dynamo", card, sayer(ids, finish))
	e.start()
	return e
}

const weatherTools = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

func toolRequest(stream bool, extra string) string {
	s := `{"model":"llama","messages":[{"role":"user","content":"Weather?"}],"tools":` + weatherTools + extra
	if stream {
		s += `,"stream":true`
	}
	return s + "}"
}

// streamed gathers a streamed chat response: its reasoning, content, calls
// (name and arguments by index, ids counted) and finish reason.
type streamed struct {
	reasoning, content, finish string
	names, args                map[int]string
	ids                        map[int]int
}

func gather(t *testing.T, e *env, body string) streamed {
	t.Helper()
	resp := e.open("/v1/chat/completions", body, nil)
	ev := newEvents(resp)
	out := streamed{names: map[int]string{}, args: map[int]string{}, ids: map[int]int{}}
	for {
		data, err := ev.next()
		require.NoError(t, err)
		if data == "[DONE]" {
			return out
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content          *string `json:"content"`
					Reasoning        *string `json:"reasoning"`
					ReasoningContent *string `json:"reasoning_content"`
					ToolCalls        []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Type     string `json:"type"`
						Function struct {
							Name      *string `json:"name"`
							Arguments *string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk), data)
		for _, c := range chunk.Choices {
			d := c.Delta
			if d.Reasoning != nil {
				require.NotNil(t, d.ReasoningContent, "both names carry the reasoning")
				assert.Equal(t, *d.Reasoning, *d.ReasoningContent)
				out.reasoning += *d.Reasoning
			}
			if d.Content != nil {
				out.content += *d.Content
			}
			for _, tc := range d.ToolCalls {
				if tc.ID != "" {
					out.ids[tc.Index]++
					assert.Equal(t, "function", tc.Type)
					assert.True(t, strings.HasPrefix(tc.ID, "chatcmpl-tool-"), tc.ID)
				}
				if tc.Function.Name != nil {
					out.names[tc.Index] += *tc.Function.Name
				}
				if tc.Function.Arguments != nil {
					out.args[tc.Index] += *tc.Function.Arguments
				}
			}
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
	}
}

func TestToolCallsParsedWholeAndStreamed(t *testing.T) {
	out := "<think>Paris, then.</think>Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	e := toolEnv(t, "hermes", "deepseek_r1", out, "stop")

	r := e.post("/v1/chat/completions", toolRequest(false, ""), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	ch := choice(t, r.json(t))
	assert.Equal(t, "tool_calls", ch["finish_reason"])
	msg := ch["message"].(map[string]any)
	assert.Equal(t, "Paris, then.", msg["reasoning"])
	assert.Equal(t, "Paris, then.", msg["reasoning_content"])
	assert.Equal(t, "Let me look.", msg["content"])
	calls := msg["tool_calls"].([]any)
	require.Len(t, calls, 1)
	call := calls[0].(map[string]any)
	assert.Equal(t, "function", call["type"])
	fn := call["function"].(map[string]any)
	assert.Equal(t, "get_weather", fn["name"])
	assert.JSONEq(t, `{"city":"Paris"}`, fn["arguments"].(string))

	s := gather(t, e, toolRequest(true, ""))
	assert.Equal(t, "Paris, then.", s.reasoning)
	assert.Equal(t, "Let me look.", s.content)
	assert.Equal(t, "tool_calls", s.finish)
	assert.Equal(t, map[int]string{0: "get_weather"}, s.names)
	assert.Equal(t, map[int]int{0: 1}, s.ids, "one id per call")
	assert.JSONEq(t, `{"city":"Paris"}`, s.args[0])

	// tool_choice none: the output is content (the reasoning still split).
	r = e.post("/v1/chat/completions", toolRequest(false, `,"tool_choice":"none"`), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	ch = choice(t, r.json(t))
	assert.Equal(t, "stop", ch["finish_reason"])
	msg = ch["message"].(map[string]any)
	assert.True(t, strings.HasPrefix(msg["content"].(string), "Let me look.<tool_call>"), msg["content"])
	assert.Empty(t, msg["tool_calls"])

	// include_reasoning false leaves the reasoning out.
	r = e.post("/v1/chat/completions", toolRequest(false, `,"include_reasoning":false`), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Nil(t, choice(t, r.json(t))["message"].(map[string]any)["reasoning"])
}

func TestRequiredAndNamedNeedStructuredOutput(t *testing.T) {
	e := toolEnv(t, "hermes", "", "x", "stop")
	for _, tc := range []string{`,"tool_choice":"required"`, `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`} {
		r := e.post("/v1/chat/completions", toolRequest(false, tc), nil)
		require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, "tool_choice", errObj["param"])
		assert.Equal(t, "unsupported_parameter", errObj["code"])
	}
}

// With structured output, "required" and a named function constrain the
// output to JSON and read the calls from it.
func TestRequiredAndNamedReadTheirJSON(t *testing.T) {
	for _, c := range []struct {
		choice, out, finish string
		name, args          string
	}{
		{`"required"`, `[{"name": "get_weather", "parameters": {"city": "Paris"}}]`, "tool_calls", "get_weather", `{"city": "Paris"}`},
		{`{"type":"function","function":{"name":"get_weather"}}`, `{"city": "Oslo"}`, "stop", "get_weather", `{"city": "Oslo"}`},
	} {
		dir := markerDir(t)
		m, err := hfmodel.Load(dir)
		require.NoError(t, err)
		ids, err := m.Tokenizer().Encode(c.out, false)
		require.NoError(t, err)
		card := llamaCard(t, dir, dir)
		card.ToolCallParser, card.Supports = "hermes", []string{"structured_outputs"}
		e := newEnv(t)
		got := make(chan tokenRequestSeen, 8)
		e.workerMeta("w", "dynamo", card, func(w *planetest.Worker, req *plane.Request) {
			var seen tokenRequestSeen
			_ = json.Unmarshal(req.Payload, &seen)
			got <- seen
			sayer(ids, "stop")(w, req)
		})
		e.start()
		r := e.post("/v1/chat/completions", toolRequest(false, `,"tool_choice":`+c.choice), nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		seen := <-got
		assert.Contains(t, string(seen.SamplingOptions["structured_outputs"]), `"json"`, "the schema goes to the engine")
		ch := choice(t, r.json(t))
		assert.Equal(t, c.finish, ch["finish_reason"])
		msg := ch["message"].(map[string]any)
		assert.Equal(t, "", msg["content"])
		call := msg["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
		assert.Equal(t, c.name, call["name"])
		assert.Equal(t, c.args, call["arguments"])

		s := gather(t, e, toolRequest(true, `,"tool_choice":`+c.choice))
		assert.Equal(t, c.finish, s.finish)
		assert.Equal(t, c.name, s.names[0])
		assert.JSONEq(t, c.args, s.args[0])
	}
}

type tokenRequestSeen struct {
	SamplingOptions map[string]json.RawMessage `json:"sampling_options"`
}

// A model whose workers name no tool-call parser refuses tool_choice auto
// (the default with tools) but renders tools with tool_choice none.
func TestAutoNeedsAToolCallParser(t *testing.T) {
	e := toolEnv(t, "", "", "plain", "stop")
	r := e.post("/v1/chat/completions", toolRequest(false, ""), nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Equal(t, "tool_choice", r.json(t)["error"].(map[string]any)["param"])
	r = e.post("/v1/chat/completions", toolRequest(false, `,"tool_choice":"none"`), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, "plain", choice(t, r.json(t))["message"].(map[string]any)["content"])
}
