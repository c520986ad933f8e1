package frontend

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requiredDelta streams tool_choice "required" calls as vLLM's server does:
// testdata/tools/required_stream.json holds what vLLM 0.32's
// extract_required_tool_call_streaming returned for each prefix of a few
// outputs (fed 1, 3 and 7 characters at a time).
func TestRequiredDeltaAsVLLM(t *testing.T) {
	b, err := os.ReadFile("testdata/tools/required_stream.json")
	require.NoError(t, err)
	var cases []struct {
		Text     string   `json:"text"`
		Step     int      `json:"step"`
		Prefixes []string `json:"prefixes"`
		Deltas   [][]struct {
			Index     int     `json:"index"`
			Opens     bool    `json:"opens"`
			Name      *string `json:"name"`
			Arguments *string `json:"arguments"`
		} `json:"deltas"`
	}
	require.NoError(t, json.Unmarshal(b, &cases))
	require.NotEmpty(t, cases)
	for _, c := range cases {
		prev := ""
		for i, cur := range c.Prefixes {
			d := requiredDelta(prev, cur)
			want := c.Deltas[i]
			if want == nil {
				assert.Nil(t, d, "%q step %d at %q", c.Text, c.Step, cur)
			} else if assert.NotNil(t, d, "%q step %d at %q", c.Text, c.Step, cur) && assert.Len(t, d.calls, len(want)) {
				for j, w := range want {
					got := d.calls[j]
					assert.Equal(t, w.Index, got.Index)
					assert.Equal(t, w.Opens, got.ID != "", "%q at %q", c.Text, cur)
					assert.Equal(t, w.Name, got.Function.Name, "%q at %q", c.Text, cur)
					assert.Equal(t, w.Arguments, got.Function.Arguments, "%q at %q", c.Text, cur)
				}
			}
			prev = cur
		}
	}
}

// The calls of a whole "required" output, with arguments as Python writes
// them; what is not vLLM's FunctionDefinition list is no call.
func TestRequiredCalls(t *testing.T) {
	calls := requiredCalls(`[{"name":"a","parameters":{"x":1.50,"y":"é"}},{"name":"b"},{"name":"c","parameters":null,"description":"d"}]`)
	require.Len(t, calls, 3)
	assert.Equal(t, `{"x": 1.5, "y": "é"}`, calls[0].Arguments)
	assert.Equal(t, "null", calls[1].Arguments)
	assert.Equal(t, "c", calls[2].Name)
	for _, bad := range []string{``, `{}`, `[1]`, `[{"name":1}]`, `[{"parameters":{}}]`, `[{"name":"a","parameters":[1]}]`, `[{"name":"a","description":2}]`} {
		assert.Nil(t, requiredCalls(bad), bad)
	}
	assert.Empty(t, requiredCalls(`[]`))
}

// The schema of tool_choice "required" is vLLM's: an array of one of the
// tools' {name, parameters} each, at most one without parallel calls, the
// tools' $defs gathered at the top.
func TestRequiredSchema(t *testing.T) {
	req := completionRequest{Tools: json.RawMessage(`[{"type":"function","function":{"name":"a","parameters":{"type":"object","$defs":{"D":{"type":"string"}}}}},
		{"type":"function","function":{"name":"b"}}]`), ToolChoice: json.RawMessage(`"required"`), ParallelToolCalls: ptr(false)}
	tp, err := req.checkTools(true)
	require.NoError(t, err)
	raw, err := tp.schema()
	require.NoError(t, err)
	var got any
	require.NoError(t, json.Unmarshal(raw, &got))
	var want any
	require.NoError(t, json.Unmarshal([]byte(`{"type":"array","minItems":1,"maxItems":1,"$defs":{"D":{"type":"string"}},"items":{"type":"object","anyOf":[
		{"properties":{"name":{"type":"string","enum":["a"]},"parameters":{"type":"object"}},"required":["name","parameters"]},
		{"properties":{"name":{"type":"string","enum":["b"]},"parameters":{"type":"object","properties":{}}},"required":["name","parameters"]}]}}`), &want))
	assert.Equal(t, want, got)

	req.ToolChoice = json.RawMessage(`{"type":"function","function":{"name":"b"}}`)
	tp, err = req.checkTools(true)
	require.NoError(t, err)
	raw, err = tp.schema()
	require.NoError(t, err)
	assert.JSONEq(t, `{"type":"object","properties":{}}`, string(raw))
}

// tools and tool_choice are checked by vLLM's rules.
func TestToolChoiceRules(t *testing.T) {
	tool := `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`
	for _, c := range []struct {
		tools, choice string
		chat          bool
		mode          toolMode
		param         string // "": accepted
	}{
		{tool, ``, true, toolsAuto, ""},
		{tool, `"none"`, true, toolsNone, ""},
		{tool, `"auto"`, true, toolsAuto, ""},
		{tool, `"required"`, true, toolsRequired, ""},
		{tool, `{"type":"function","function":{"name":"f"}}`, true, toolsNamed, ""},
		{``, `"none"`, true, toolsNone, ""},
		{``, ``, true, toolsNone, ""},
		{`[]`, ``, true, 0, "tools"},
		{`[{"type":"function"}]`, ``, true, 0, "tools"},
		{`[{"type":"retrieval","function":{"name":"f"}}]`, ``, true, 0, "tools"},
		{`[{"type":"function","function":{"name":"f","parameters":[1]}}]`, ``, true, 0, "tools"},
		{`{"a":1}`, ``, true, 0, "tools"},
		{``, `"auto"`, true, 0, "tool_choice"},
		{tool, `"sometimes"`, true, 0, "tool_choice"},
		{tool, `{"type":"function","function":{"name":"g"}}`, true, 0, "tool_choice"},
		{tool, `{"type":"function"}`, true, 0, "tool_choice.function"},
		{tool, `{"type":"function","function":{}}`, true, 0, "tool_choice.function.name"},
		{tool, `{"type":"function","function":{"name":""}}`, true, 0, "tool_choice.function.name"},
		{tool, `{"type":"bogus","function":{"name":"f"}}`, true, 0, "tool_choice.type"},
		{tool, `{"function":{"name":"f"}}`, true, toolsNamed, ""},
		{tool, `{"type":"function","function":{"name":"none"}}`, true, 0, "tool_choice"},
		{``, `{"type":"function","function":{"name":"none"}}`, true, 0, "tool_choice"},
		{tool, ``, false, 0, "tools"},
		{``, `"none"`, false, 0, "tool_choice"},
	} {
		req := completionRequest{Tools: json.RawMessage(c.tools), ToolChoice: json.RawMessage(c.choice)}
		tp, err := req.checkTools(c.chat)
		if c.param == "" {
			require.NoError(t, err, "%s %s", c.tools, c.choice)
			assert.Equal(t, c.mode, tp.mode, "%s %s", c.tools, c.choice)
			continue
		}
		var re *requestError
		require.ErrorAs(t, err, &re, "%s %s", c.tools, c.choice)
		assert.Equal(t, c.param, re.param, "%s %s: %s", c.tools, c.choice, re.msg)
	}
}
