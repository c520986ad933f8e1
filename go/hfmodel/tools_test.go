package hfmodel

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// toolsTemplate is written in the style of the templates of tool-calling
// models: the tools printed with tojson (one indented, keys sorted), each
// tool call's arguments and the whole call printed with tojson, a tool
// message's tool_call_id, keys tested with "is defined".
const toolsTemplate = "{{- bos_token }}\n{%- if tools is not none %}\n{{- '<tools>' }}\n{%- for t in tools %}\n{{- '\\n' + t | tojson }}\n{%- endfor %}\n{{- '\\n</tools>\\n' }}\n{%- if tools | length > 0 %}{{- tools[0] | tojson(indent=2, sort_keys=true) + '\\n' }}{% endif %}\n{%- endif %}\n{%- for m in messages %}\n{{- '[' + m.role }}{% if m.name is defined %}{{ ' ' + m.name }}{% endif %}{{ ']' }}\n{%- if m.role == 'tool' %}{{- '(' + m.tool_call_id + ') ' }}{% endif %}\n{%- if m.reasoning_content is defined %}{{ '<think>' + m.reasoning_content + '</think>' }}{% endif %}\n{{- m.content }}\n{%- if m.tool_calls is defined %}\n{%- for c in m.tool_calls %}\n{{- '\\n<call id=\"' + c.id + '\">' + c.function.name + ' ' + c.function.arguments | tojson + ' ' + c | tojson(separators=(',', ':')) + '</call>' }}\n{%- endfor %}\n{%- endif %}\n{{- '\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}{{ '[assistant]' }}{% endif %}"

func toolsModel(t *testing.T) *Model {
	t.Helper()
	m, err := Load(dir(t, map[string]string{TokenizerConfigFile: `{"bos_token":"<s>","chat_template":` + quote(toolsTemplate) + `}`}))
	require.NoError(t, err)
	return m
}

func ptr[T any](v T) *T { return &v }

// The conversation and tools render as transformers renders them when
// vLLM's server passes them (the expected texts are transformers' own
// renderings of this template).
func TestRenderTools(t *testing.T) {
	m := toolsModel(t)
	conv := []Message{
		{Role: "system", Content: "Use tools."},
		{Role: "user", Content: "Weather in Zürich?", Name: ptr("ana")},
		{Role: "assistant", Reasoning: ptr("Two calls."), ToolCalls: []ToolCall{
			{ID: "c1", Name: "weather", Arguments: json.RawMessage(`{"city":"Zürich","days":2,"ratio":1.0,"tiny":1e-05,"big":1e16,"flags":[true,null],"html":"<a&b>"}`)},
			{ID: "c2", Name: "now"},
		}},
		{Role: "tool", Content: "sunny ☀", ToolCallID: ptr("c1")},
		{Role: "tool", Content: "12:00", ToolCallID: ptr("c2"), Name: ptr("now")},
	}
	tools := []Tool{
		{Name: "weather", Description: ptr("Weather — «city»"), Strict: ptr(true),
			Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","default":1}},"required":["city"]}`)},
		{Name: "now"},
	}
	got, err := m.RenderChatWith(conv, ChatOptions{AddGenerationPrompt: true, Tools: tools})
	require.NoError(t, err)
	assert.Equal(t, "<s><tools>\n{\"type\": \"function\", \"function\": {\"name\": \"weather\", \"description\": \"Weather — «city»\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"default\": 1}}, \"required\": [\"city\"]}, \"strict\": true}}\n{\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": null, \"parameters\": null}}\n</tools>\n{\n  \"function\": {\n    \"description\": \"Weather — «city»\",\n    \"name\": \"weather\",\n    \"parameters\": {\n      \"properties\": {\n        \"city\": {\n          \"type\": \"string\"\n        },\n        \"days\": {\n          \"default\": 1,\n          \"type\": \"integer\"\n        }\n      },\n      \"required\": [\n        \"city\"\n      ],\n      \"type\": \"object\"\n    },\n    \"strict\": true\n  },\n  \"type\": \"function\"\n}\n[system]Use tools.\n[user ana]Weather in Zürich?\n[assistant]<think>Two calls.</think>\n<call id=\"c1\">weather {\"city\": \"Zürich\", \"days\": 2, \"ratio\": 1.0, \"tiny\": 1e-05, \"big\": 1e+16, \"flags\": [true, null], \"html\": \"<a&b>\"} {\"id\":\"c1\",\"function\":{\"arguments\":{\"city\":\"Zürich\",\"days\":2,\"ratio\":1.0,\"tiny\":1e-05,\"big\":1e+16,\"flags\":[true,null],\"html\":\"<a&b>\"},\"name\":\"weather\"},\"type\":\"function\"}</call>\n<call id=\"c2\">now {} {\"id\":\"c2\",\"function\":{\"arguments\":{},\"name\":\"now\"},\"type\":\"function\"}</call>\n[tool](c1) sunny ☀\n[tool now](c2) 12:00\n[assistant]", got)

	// Without tools the template sees None; a message's absent keys are undefined.
	got, err = m.RenderChatWith(conv[:2], ChatOptions{})
	require.NoError(t, err)
	assert.Equal(t, "<s>[system]Use tools.\n[user ana]Weather in Zürich?\n", got)
}

// Floats are written as Python's repr writes them.
func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		1: "1.0", 2.5: "2.5", 0.1: "0.1", 1e15: "1000000000000000.0", 1e16: "1e+16", 1.5e300: "1.5e+300",
		0.0001: "0.0001", 1e-05: "1e-05", 123456789.123: "123456789.123", -2.5e-7: "-2.5e-07",
		math.Copysign(0, -1): "-0.0", math.Inf(1): "Infinity", math.Inf(-1): "-Infinity",
	} {
		assert.Equal(t, want, jsonscan.PyFloat(f), "%v", f)
	}
	assert.Equal(t, "NaN", jsonscan.PyFloat(math.NaN()))
}

// tojson's options, as json.dumps takes them, and its strings: only the
// controls escaped, or every non-ASCII character with ensure_ascii.
func TestPyTojson(t *testing.T) {
	v, err := jsonValue([]byte(`{"b":[1,{"x":null}],"a":"é\u2028<>&\u0001\"\\","a":"last","c":[],"d":{}}`))
	require.NoError(t, err)
	dump := func(kw map[string]jinja.Value, args ...jinja.Value) string {
		out, err := pyTojson.AsCallable().Fn(append([]jinja.Value{v}, args...), kw)
		require.NoError(t, err)
		return out.AsString()
	}
	assert.Equal(t, `{"b": [1, {"x": null}], "a": "last", "c": [], "d": {}}`, dump(nil))
	assert.Equal(t, "{\n  \"a\": \"last\",\n  \"b\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"c\": [],\n  \"d\": {}\n}",
		dump(map[string]jinja.Value{"indent": jinja.NewInt(2), "sort_keys": jinja.NewBool(true)}))
	assert.Equal(t, `{"b":[1,{"x":null}],"a":"last","c":[],"d":{}}`,
		dump(map[string]jinja.Value{"separators": jinja.NewList([]jinja.Value{jinja.NewString(","), jinja.NewString(":")})}))
	var b strings.Builder
	dumpString(&b, "é\u2028<>&\x01\"\\\n😀", false)
	assert.Equal(t, "\"é\u2028<>&\\u0001\\\"\\\\\\n😀\"", b.String())
	b.Reset()
	dumpString(&b, "é😀", true)
	assert.Equal(t, `"\u00e9\ud83d\ude00"`, b.String())
}

// Only the tojson filter inside tags is renamed: not text, not strings, not
// comments, not a longer name.
func TestUseOwnTojson(t *testing.T) {
	src := `tojson | tojson {{ x | tojson }}{%- set y = x|tojson(indent=2) -%}{{ "| tojson" }}{# x | tojson #}{{ x | tojsonx }}{ {{'a}}b'|tojson}}`
	want := `tojson | tojson {{ x | __hfmodel_tojson }}{%- set y = x|__hfmodel_tojson(indent=2) -%}{{ "| tojson" }}{# x | tojson #}{{ x | tojsonx }}{ {{'a}}b'|__hfmodel_tojson}}`
	assert.Equal(t, want, useOwnTojson(src))
}

// JSON becomes values as Python's json.loads makes them: keys in order (a
// repeated key keeps its place, takes its last value), ints and floats
// apart; nesting is bounded.
func TestJSONValue(t *testing.T) {
	v, err := jsonValue([]byte(`{"z":1,"a":2.0,"z":3,"big":1e400,"huge":123456789012345678901}`))
	require.NoError(t, err)
	assert.Equal(t, []string{"z", "a", "big", "huge"}, v.AsDict().OrderedKeys())
	z, _ := v.AsDict().Get("z")
	a, _ := v.AsDict().Get("a")
	big, _ := v.AsDict().Get("big")
	assert.True(t, z.IsInt() && z.AsInt() == 3)
	assert.True(t, a.IsFloat())
	assert.True(t, math.IsInf(big.AsFloat(), 1))
	_, err = jsonValue([]byte(strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1)))
	assert.Error(t, err)
	_, err = jsonValue([]byte(strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth)))
	assert.NoError(t, err)
	_, err = jsonValue([]byte(`{} {}`))
	assert.Error(t, err)
}

// Arguments or parameters that are not a JSON object are the request's
// mistake; an empty list of tools is a list.
func TestToolsRefused(t *testing.T) {
	m := toolsModel(t)
	_, err := m.RenderChatWith([]Message{{Role: "assistant", ToolCalls: []ToolCall{{ID: "a", Name: "f", Arguments: json.RawMessage(`[1]`)}}}}, ChatOptions{})
	assert.ErrorIs(t, err, ErrChatOptions)
	_, err = m.RenderChatWith(msgs, ChatOptions{Tools: []Tool{{Name: "f", Parameters: json.RawMessage(`"x"`)}}})
	assert.ErrorIs(t, err, ErrChatOptions)
	got, err := m.RenderChatWith(msgs[:1], ChatOptions{Tools: []Tool{}})
	require.NoError(t, err)
	assert.Equal(t, "<s><tools>\n</tools>\n[system]Be brief.\n", got)
}
