package frontend_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func postJSON(t *testing.T, e *env, path string, body map[string]any) response {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	return e.post(path, string(b), nil)
}

// ints reads a JSON array of numbers.
func ints(t *testing.T, v any) []int {
	t.Helper()
	list, ok := v.([]any)
	require.True(t, ok, "%v is not an array", v)
	out := make([]int, len(list))
	for i, x := range list {
		out[i] = int(x.(float64))
	}
	return out
}

// /tokenize gives the tokens a completions or chat request would send, in
// vLLM's shape; /detokenize gives their text back, special tokens included.
func TestTokenizeAndDetokenize(t *testing.T) {
	dir, x := modelDir(t)
	e, _ := modelEnv(t, dir, x.OutputIDs)
	c := x.Completions[0]

	r := postJSON(t, e, "/tokenize", map[string]any{"model": "llama", "prompt": c.Prompt})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	m := r.json(t)
	assert.Equal(t, c.IDs, ints(t, m["tokens"]), "as Hugging Face tokenizes it, BOS added")
	assert.EqualValues(t, len(c.IDs), m["count"])
	assert.EqualValues(t, 512, m["max_model_len"])
	assert.Contains(t, m, "token_strs")
	assert.Nil(t, m["token_strs"])

	// No model named: the one served. Without special tokens, token strings.
	r = postJSON(t, e, "/tokenize", map[string]any{"prompt": c.Prompt, "add_special_tokens": false, "return_token_strs": true})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	m = r.json(t)
	assert.Equal(t, c.IDs[1:], ints(t, m["tokens"]))
	strs, _ := m["token_strs"].([]any)
	assert.Len(t, strs, len(c.IDs)-1)

	ch := x.Chat[0]
	r = postJSON(t, e, "/tokenize", map[string]any{"model": "llama", "messages": ch.Messages})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, ch.IDs, ints(t, r.json(t)["tokens"]), "the chat rendered by the model's template")
	r = postJSON(t, e, "/tokenize", map[string]any{"model": "llama", "messages": ch.Messages, "add_generation_prompt": false})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	short := ints(t, r.json(t)["tokens"])
	assert.Equal(t, ch.IDs[:len(short)], short, "the same, less the assistant's header")
	assert.Less(t, len(short), len(ch.IDs))

	r = postJSON(t, e, "/detokenize", map[string]any{"model": "llama", "tokens": c.IDs})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, map[string]any{"prompt": "<|begin_of_text|>" + c.Prompt}, r.json(t))
}

func TestTokenizeRefusals(t *testing.T) {
	dir, x := modelDir(t)
	e, _ := modelEnv(t, dir, x.OutputIDs)
	msgs := x.Chat[0].Messages
	for _, c := range []struct {
		path   string
		body   map[string]any
		status int
		param  string
	}{
		{"/tokenize", map[string]any{"model": "nope", "prompt": "x"}, http.StatusNotFound, "model"},
		{"/tokenize", map[string]any{"model": "llama"}, http.StatusBadRequest, "prompt"},
		{"/tokenize", map[string]any{"model": "llama", "prompt": []int{1, 2}}, http.StatusBadRequest, "prompt"},
		{"/tokenize", map[string]any{"model": "llama", "messages": msgs, "tools": []any{map[string]any{"type": "function"}}},
			http.StatusBadRequest, "tools"},
		{"/tokenize", map[string]any{"model": "llama", "messages": msgs, "chat_template": "{{ 1 }}"}, http.StatusBadRequest, "chat_template"},
		{"/tokenize", map[string]any{"model": "llama", "messages": msgs, "continue_final_message": true}, http.StatusBadRequest,
			"continue_final_message"},
		{"/detokenize", map[string]any{"model": "llama"}, http.StatusBadRequest, "tokens"},
		{"/detokenize", map[string]any{"model": "llama", "tokens": []int{1, -1}}, http.StatusBadRequest, "tokens"},
	} {
		r := postJSON(t, e, c.path, c.body)
		require.Equal(t, c.status, r.status, "%s %v: %s", c.path, c.body, r.body)
		assert.Equal(t, c.param, r.json(t)["error"].(map[string]any)["param"], "%v", c.body)
	}
}

// The chat API takes the same template options: the prompt sent to the
// worker is the one /tokenize gives.
func TestChatTemplateOptionsReachThePrompt(t *testing.T) {
	dir, x := modelDir(t)
	e, prompts := modelEnv(t, dir, x.OutputIDs)
	msgs := append(append([]map[string]string{}, x.Chat[0].Messages...), map[string]string{"role": "assistant", "content": "Sure"})
	for _, opts := range []map[string]any{
		{"add_generation_prompt": false},
		{"add_generation_prompt": false, "continue_final_message": true},
		{"chat_template_kwargs": map[string]any{"bos_token": ""}},
	} {
		tok := map[string]any{"model": "llama", "messages": msgs}
		chat := map[string]any{"model": "llama", "messages": msgs, "max_tokens": len(x.OutputIDs)}
		for k, v := range opts {
			tok[k], chat[k] = v, v
		}
		r := postJSON(t, e, "/tokenize", tok)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		want := ints(t, r.json(t)["tokens"])
		r = postJSON(t, e, "/v1/chat/completions", chat)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, want, received(t, prompts), "%v", opts)
	}
}

// toolTemplate prints tools and tool calls with tojson, in the style of the
// templates of tool-calling models.
const toolTemplate = `{{ bos_token }}{% if tools is not none %}{% for t in tools %}{{ t | tojson }}{{ '\n' }}{% endfor %}{% endif %}{% for m in messages %}[{{ m.role }}]{{ m.content }}` +
	`{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<call {{ c.id }}>{{ c.function | tojson }}{% endfor %}{% endif %}` +
	`{% if m.tool_call_id is defined %}<result {{ m.tool_call_id }}>{% endif %}{% endfor %}`

// /tokenize renders a request's tools and its messages' tool calls as
// vLLM's server does: the tools as its models dump them, a call's
// arguments parsed; a malformed tool or call is refused naming its param.
func TestTokenizeWithTools(t *testing.T) {
	dir := t.TempDir()
	revision(t, dir, toolTemplate)
	e, _ := modelEnv(t, dir, []int{0})
	msgs := []any{
		map[string]any{"role": "user", "content": "Weather?"},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
			"id": "c1", "type": "function", "function": map[string]any{"name": "w", "arguments": `{"city": "Zürich", "n": 1.0}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
	}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "w", "strict": true,
		"parameters": map[string]any{"type": "object"}}}}
	r := postJSON(t, e, "/tokenize", map[string]any{"model": "llama", "messages": msgs, "tools": tools})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	r = postJSON(t, e, "/detokenize", map[string]any{"model": "llama", "tokens": r.json(t)["tokens"]})
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	want := "<|begin_of_text|>" + `{"type": "function", "function": {"name": "w", "description": null, "parameters": {"type": "object"}, "strict": true}}` +
		"\n[user]Weather?[assistant]<call c1>" + `{"arguments": {"city": "Zürich", "n": 1.0}, "name": "w"}` + "[tool]sunny<result c1>"
	assert.Equal(t, want, r.json(t)["prompt"])

	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"messages": msgs, "tools": map[string]any{}}, "tools"},
		{map[string]any{"messages": msgs, "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": 1}}}}, "tools"},
		{map[string]any{"messages": []any{map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"id": "x"}}}}}, "messages"},
	} {
		c.body["model"] = "llama"
		r := postJSON(t, e, "/tokenize", c.body)
		require.Equal(t, http.StatusBadRequest, r.status, "%v: %s", c.body, r.body)
		assert.Equal(t, c.param, r.json(t)["error"].(map[string]any)["param"], "%v", c.body)
	}
}
