package frontend

// A chat request's tools and its messages' tool calls, read as vLLM's server
// reads them before its chat template renders them (hfmodel.Tool,
// hfmodel.ToolCall): checked as its pydantic models check them (a malformed
// one is a 400 naming the param), and shaped as it gives them to the
// template (a call's arguments parsed from their JSON string).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// chatTools reads a request's tools: nil when absent or null (the template
// gets None), else every tool, an empty list being one too (/tokenize
// renders it; the chat API refuses it in check).
func chatTools(raw json.RawMessage) ([]hfmodel.Tool, error) {
	if jsonscan.IsNull(raw) {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("tools must be a list of tools")
	}
	out := make([]hfmodel.Tool, len(list))
	for i, item := range list {
		t, err := chatTool(item)
		if err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		out[i] = t
	}
	return out, nil
}

// chatTool reads one tool: {"type": "function" (the default), "function":
// {"name", "description", "parameters", "strict", "defer_loading"},
// "defer_loading"}; other keys are ignored, as vLLM's dump leaves them out.
func chatTool(raw json.RawMessage) (hfmodel.Tool, error) {
	var t struct {
		Type         json.RawMessage `json:"type"`
		Function     json.RawMessage `json:"function"`
		DeferLoading json.RawMessage `json:"defer_loading"`
	}
	var f struct {
		Name         json.RawMessage `json:"name"`
		Description  json.RawMessage `json:"description"`
		Parameters   json.RawMessage `json:"parameters"`
		Strict       json.RawMessage `json:"strict"`
		DeferLoading json.RawMessage `json:"defer_loading"`
	}
	var tool hfmodel.Tool
	if !isObject(raw) || json.Unmarshal(raw, &t) != nil {
		return tool, errors.New("a tool must be an object")
	}
	if t.Type != nil {
		if typ, err := stringField(t.Type, "type"); err != nil || typ != "function" {
			return tool, errors.New(`type must be "function"`)
		}
	}
	if t.Function == nil {
		return tool, errors.New("function is required")
	}
	if !isObject(t.Function) || json.Unmarshal(t.Function, &f) != nil {
		return tool, errors.New("function must be an object")
	}
	var err error
	if tool.Name, err = stringField(f.Name, "function.name"); err != nil {
		return tool, err
	}
	if tool.Description, err = optionalString(f.Description, "function.description"); err != nil {
		return tool, err
	}
	if !jsonscan.IsNull(f.Parameters) {
		if !isObject(f.Parameters) {
			return tool, errors.New("function.parameters must be an object")
		}
		tool.Parameters = f.Parameters
	}
	if tool.Strict, err = laxBool(f.Strict, "function.strict"); err != nil {
		return tool, err
	}
	if tool.FunctionDeferLoading, err = laxBool(f.DeferLoading, "function.defer_loading"); err != nil {
		return tool, err
	}
	if tool.DeferLoading, err = laxBool(t.DeferLoading, "defer_loading"); err != nil {
		return tool, err
	}
	if tool.FunctionDeferLoading == nil {
		tool.FunctionDeferLoading = tool.DeferLoading // vLLM's model hands it down
	}
	return tool, nil
}

// toolCalls reads an assistant message's tool_calls: each {"id", "type":
// "function", "function": {"name", "arguments"}}, all required, arguments
// a string. As vLLM, arguments that are empty, not JSON, or JSON but not
// an object are an empty object (a malformed call in a conversation's
// history must not fail every later turn); null or an empty list is no
// tool calls.
func toolCalls(raw json.RawMessage) ([]hfmodel.ToolCall, error) {
	if jsonscan.IsNull(raw) {
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("tool_calls must be a list")
	}
	out := make([]hfmodel.ToolCall, len(list))
	for i, item := range list {
		var c struct {
			ID       json.RawMessage `json:"id"`
			Type     json.RawMessage `json:"type"`
			Function json.RawMessage `json:"function"`
		}
		var f struct {
			Name      json.RawMessage `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		bad := func(err error) ([]hfmodel.ToolCall, error) { return nil, fmt.Errorf("tool_calls[%d]: %w", i, err) }
		if !isObject(item) || json.Unmarshal(item, &c) != nil {
			return bad(errors.New("a tool call must be an object"))
		}
		var err error
		if out[i].ID, err = stringField(c.ID, "id"); err != nil {
			return bad(err)
		}
		if typ, err := stringField(c.Type, "type"); err != nil || typ != "function" {
			return bad(errors.New(`type must be "function"`))
		}
		if !isObject(c.Function) || json.Unmarshal(c.Function, &f) != nil {
			return bad(errors.New("function must be an object with name and arguments"))
		}
		if out[i].Name, err = stringField(f.Name, "function.name"); err != nil {
			return bad(err)
		}
		args, err := stringField(f.Arguments, "function.arguments")
		if err != nil {
			return bad(err)
		}
		out[i].Arguments = json.RawMessage("{}")
		if b := []byte(args); isObject(b) && json.Valid(b) {
			out[i].Arguments = b
		}
	}
	return out, nil
}

// isObject: raw is a JSON object (its first byte; validity is the
// decoder's).
func isObject(raw []byte) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// stringField is a required string.
func stringField(raw json.RawMessage, name string) (string, error) {
	if raw == nil {
		return "", fmt.Errorf("%s is required", name)
	}
	var s string
	if jsonscan.IsNull(raw) || json.Unmarshal(raw, &s) != nil {
		return "", fmt.Errorf("%s must be a string", name)
	}
	return s, nil
}

// optionalString is a string or null (nil).
func optionalString(raw json.RawMessage, name string) (*string, error) {
	if jsonscan.IsNull(raw) {
		return nil, nil
	}
	s, err := stringField(raw, name)
	return &s, err
}

// laxBool is a boolean or null (nil), read as pydantic's lax mode reads
// one: also 0 and 1, and the strings it knows for true and false.
func laxBool(raw json.RawMessage, name string) (*bool, error) {
	if jsonscan.IsNull(raw) {
		return nil, nil
	}
	var v any
	_ = json.Unmarshal(raw, &v)
	var b, ok bool
	switch x := v.(type) {
	case bool:
		b, ok = x, true
	case float64:
		b, ok = x == 1, x == 0 || x == 1
	case string:
		switch strings.ToLower(x) {
		case "1", "on", "t", "true", "y", "yes":
			b, ok = true, true
		case "0", "off", "f", "false", "n", "no":
			ok = true
		}
	}
	if !ok {
		return nil, fmt.Errorf("%s must be a boolean", name)
	}
	return &b, nil
}
