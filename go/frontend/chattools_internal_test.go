package frontend

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
)

// Messages keep the keys vLLM keeps for the template, on the roles it keeps
// them; a call's arguments are parsed, or an empty object as vLLM coerces
// them.
func TestChatMessagesWithTools(t *testing.T) {
	var in []chatMessage
	require.NoError(t, json.Unmarshal([]byte(`[
		{"role":"user","content":"Hi","name":"ana","tool_call_id":"dropped","reasoning":"dropped"},
		{"role":"assistant","content":null,"reasoning":"r","tool_calls":[
			{"id":"a","type":"function","function":{"name":"f","arguments":"{\"x\": [1, 2.0]}"}},
			{"id":"b","type":"function","function":{"name":"g","arguments":"{not json"}},
			{"id":"c","type":"function","function":{"name":"h","arguments":""}},
			{"id":"d","type":"function","function":{"name":"i","arguments":"[1]"}}]},
		{"role":"tool","content":[{"type":"text","text":"1"},{"type":"text","text":"2"}],"tool_call_id":"a"},
		{"role":"assistant","content":"ok","tool_calls":[]}]`), &in))
	got, err := chatMessages(in, "\n")
	require.NoError(t, err)
	assert.Equal(t, []hfmodel.Message{
		{Role: "user", Content: "Hi", Name: ptr("ana")},
		{Role: "assistant", Reasoning: ptr("r"), ToolCalls: []hfmodel.ToolCall{
			{ID: "a", Name: "f", Arguments: json.RawMessage(`{"x": [1, 2.0]}`)},
			{ID: "b", Name: "g", Arguments: json.RawMessage(`{}`)},
			{ID: "c", Name: "h", Arguments: json.RawMessage(`{}`)},
			{ID: "d", Name: "i", Arguments: json.RawMessage(`{}`)},
		}},
		{Role: "tool", Content: "1\n2", ToolCallID: ptr("a")},
		{Role: "assistant", Content: "ok", ToolCalls: []hfmodel.ToolCall{}},
	}, got)
}

func TestToolCallsRefused(t *testing.T) {
	for _, calls := range []string{
		`{}`, `[1]`, `[{"type":"function","function":{"name":"f","arguments":"{}"}}]`,
		`[{"id":5,"type":"function","function":{"name":"f","arguments":"{}"}}]`,
		`[{"id":"a","function":{"name":"f","arguments":"{}"}}]`,
		`[{"id":"a","type":"other","function":{"name":"f","arguments":"{}"}}]`,
		`[{"id":"a","type":"function","function":{"arguments":"{}"}}]`,
		`[{"id":"a","type":"function","function":{"name":"f","arguments":{}}}]`,
		`[{"id":"a","type":"function","function":{"name":"f"}}]`,
		`[{"id":"a","type":"function"}]`,
	} {
		_, err := chatMessages([]chatMessage{{Role: "assistant", ToolCalls: json.RawMessage(calls)}}, "")
		assert.Error(t, err, calls)
	}
}

// Tools are read as vLLM's models read them and dumped as they dump them.
func TestChatTools(t *testing.T) {
	got, err := chatTools(json.RawMessage(`[
		{"function":{"name":"f"}},
		{"type":"function","defer_loading":"yes","x":1,"function":{"name":"g","description":"d","strict":0,
		 "parameters":{"type":"object"},"y":2}},
		{"type":"function","defer_loading":true,"function":{"name":"h","defer_loading":false,"description":null,"parameters":null}}]`))
	require.NoError(t, err)
	assert.Equal(t, []hfmodel.Tool{
		{Name: "f"},
		{Name: "g", Description: ptr("d"), Parameters: json.RawMessage(`{"type":"object"}`), Strict: ptr(false),
			FunctionDeferLoading: ptr(true), DeferLoading: ptr(true)},
		{Name: "h", FunctionDeferLoading: ptr(false), DeferLoading: ptr(true)},
	}, got)

	none, err := chatTools(json.RawMessage(`null`))
	require.NoError(t, err)
	assert.Nil(t, none)
	empty, err := chatTools(json.RawMessage(`[]`))
	require.NoError(t, err)
	assert.NotNil(t, empty)
	assert.Empty(t, empty)

	for _, bad := range []string{
		`{}`, `[1]`, `[{"type":"function"}]`, `[{"type":"other","function":{"name":"f"}}]`, `[{"type":null,"function":{"name":"f"}}]`,
		`[{"function":{}}]`, `[{"function":{"name":5}}]`, `[{"function":{"name":"f","description":5}}]`,
		`[{"function":{"name":"f","parameters":[1]}}]`, `[{"function":{"name":"f","strict":"maybe"}}]`,
		`[{"function":{"name":"f","strict":2}}]`, `[{"function":"f"}]`,
	} {
		_, err := chatTools(json.RawMessage(bad))
		assert.Error(t, err, bad)
	}
}
