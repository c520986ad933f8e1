package frontend

// Tools in the chat API, as vLLM's server takes them: tools, tool_choice
// and parallel_tool_calls are checked by its rules; tool_choice "auto"
// parses the output with the model's tool-call parser (its workers'
// --tool-call-parser, in their model cards; go/toolcall), "required" and a
// named function constrain the output with structured output (a JSON
// schema made from the tools, as vLLM makes it) and read the calls from
// that JSON. The tools themselves are rendered by the chat template
// (text.go). What the choices' output becomes: chatparse.go.

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/toolcall"
)

// toolMode is what a request's tool_choice asks.
type toolMode int

const (
	toolsNone     toolMode = iota // no tools, or tool_choice "none": the output is content
	toolsAuto                     // the model may call tools: its output is parsed
	toolsRequired                 // the output is a JSON array of calls
	toolsNamed                    // the output is the named function's arguments
)

// MaxTools bounds the tools of a request.
const MaxTools = 256

// toolPlan is a request's tools as checked.
type toolPlan struct {
	mode     toolMode
	named    string // toolsNamed: the function
	tools    []toolcall.Tool
	parallel bool // false: parallel_tool_calls false, only the first call is returned
}

// toolChoiceParam reads tool_choice: "", "none", "auto", "required", or a
// function's name (named true).
func toolChoiceParam(raw json.RawMessage) (choice string, named bool, err error) {
	raw = jsonscan.Trim(raw)
	if jsonscan.IsNull(raw) {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return s, false, nil
		}
		return "", false, invalid("tool_choice", "invalid_tool_choice",
			`invalid value for tool_choice: %q; only a named function, "none", "auto" or "required" are supported`, s)
	}
	const usage = `correct usage: {"type": "function", "function": {"name": "my_function"}}`
	var obj struct {
		Type     json.RawMessage `json:"type"`
		Function json.RawMessage `json:"function"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", false, invalid("tool_choice", "invalid_tool_choice", `tool_choice must be "none", "auto", "required" or an object naming a function`)
	}
	if !jsonscan.IsNull(obj.Type) { // absent: "function", as vLLM's model defaults it
		var typ string
		if json.Unmarshal(obj.Type, &typ) != nil || typ != "function" {
			return "", false, invalid("tool_choice.type", "invalid_tool_choice", `tool_choice.type must be "function"; %s`, usage)
		}
	}
	var fn map[string]json.RawMessage
	if t := jsonscan.Trim(obj.Function); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &fn) != nil {
		return "", false, invalid("tool_choice.function", "invalid_tool_choice", "tool_choice.function must be an object; %s", usage)
	}
	nameRaw, ok := fn["name"]
	if !ok {
		return "", false, invalid("tool_choice.function.name", "invalid_tool_choice", "tool_choice.function needs a name; %s", usage)
	}
	if json.Unmarshal(nameRaw, &s) != nil || s == "" {
		return "", false, invalid("tool_choice.function.name", "invalid_tool_choice", "tool_choice.function.name must be a non-empty string; %s", usage)
	}
	return s, true, nil
}

// checkTools reads the request's tools and tool_choice by vLLM's rules:
// no empty tools array; tool_choice defaults to "auto" with tools and
// "none" without; any tool_choice but "none" needs tools, and a named one
// one of them; tools are functions with names and object schemas.
func (req *completionRequest) checkTools(chat bool) (toolPlan, error) {
	tp := toolPlan{parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls}
	rawTools := jsonscan.Trim(req.Tools)
	hasTools := !jsonscan.IsNull(rawTools)
	choice, named, err := toolChoiceParam(req.ToolChoice)
	if err != nil {
		return tp, err
	}
	if !chat {
		if hasTools || choice != "" {
			param := "tools"
			if !hasTools {
				param = "tool_choice"
			}
			return tp, unsupported(param, param+" in the completions API (the chat API takes them)")
		}
		return tp, nil
	}
	if hasTools {
		tools, err := chatTools(rawTools) // as the template gets them (chattools.go)
		if err != nil {
			return tp, invalid("tools", "invalid_tools", "%s", err.Error())
		}
		if len(tools) == 0 {
			return tp, invalid("tools", "invalid_tools", "tools must not be an empty array: give at least one tool or leave the field out")
		}
		if len(tools) > MaxTools {
			return tp, invalid("tools", "invalid_tools", "tools may have at most %d tools", MaxTools)
		}
		for _, t := range tools {
			tp.tools = append(tp.tools, toolcall.Tool{Name: t.Name, Parameters: t.Parameters})
		}
	}
	switch {
	case choice == "" && hasTools:
		choice = "auto"
	case !named && (choice == "" || choice == "none"):
		return tp, nil // tools, if any, are rendered; the output is content
	case !hasTools:
		return tp, invalid("tool_choice", "invalid_tool_choice", "when tool_choice is given, tools must be too")
	}
	switch {
	case named:
		found := false
		for _, t := range tp.tools {
			found = found || t.Name == choice
		}
		if !found {
			return tp, invalid("tool_choice", "invalid_tool_choice", "the function named in tool_choice (%q) is none of the request's tools", choice)
		}
		if req.StructuredOutputs != nil {
			return tp, invalid("tool_choice", "invalid_tool_choice", "a named tool_choice and structured_outputs cannot be used together")
		}
		tp.mode, tp.named = toolsNamed, choice
	case choice == "required":
		tp.mode = toolsRequired
	default:
		tp.mode = toolsAuto
	}
	return tp, nil
}

// jsonToolChoice reports whether tool_choice "required" and named
// functions constrain the output to JSON (schema) with the tool-call parser
// name, as vLLM's parsers that support it do (vLLM's
// supports_required_and_named); with the others (mistral) they read the
// output as "auto" does, unconstrained.
//
// vLLM 0.32 by default (VLLM_ENFORCE_STRICT_TOOL_CALLING=1) constrains the
// hermes, llama3_json and deepseek_v3 formats with xgrammar structural tags
// instead, and reads them as "auto"; the frontend does what vLLM does with
// that variable 0 (docs/openai-api.md, "Tools").
func jsonToolChoice(parser string) bool { return parser != "mistral" }

// toolParser is the tool-call parser the model's instances (cards) name,
// and an error for a request whose tool_choice needs one they do not name.
func (tp *toolPlan) toolParser(model string, cards []modelcard.Card) (string, error) {
	if tp.mode == toolsNone {
		return "", nil // the output is content: no parser reads it
	}
	name, err := cardsName(model, "tool-call parsers", "tool_choice", "unsupported_parameter", cards,
		func(c modelcard.Card) string { return c.ToolCallParser })
	if err != nil || name != "" {
		return name, err
	}
	what := fmt.Sprintf("tool_choice %q", tp.choiceName())
	return "", invalid("tool_choice", "unsupported_parameter",
		"%s needs a tool-call parser: the workers of model %q run without --tool-call-parser", what, model)
}

func (tp *toolPlan) choiceName() string {
	switch tp.mode {
	case toolsAuto:
		return "auto"
	case toolsRequired:
		return "required"
	case toolsNamed:
		return tp.named
	}
	return "none"
}

// schema is the JSON schema that constrains the output of tool_choice
// "required" (an array of {"name", "parameters"} objects, one of the tools
// each; at most one when parallel_tool_calls is false) or of a named
// function (its parameters), as vLLM makes it; nil for the other modes.
func (tp *toolPlan) schema() (json.RawMessage, error) {
	params := func(p json.RawMessage) json.RawMessage {
		if len(p) == 0 || string(p) == "{}" {
			return json.RawMessage(`{"type":"object","properties":{}}`)
		}
		return p
	}
	switch tp.mode {
	case toolsNamed:
		for _, t := range tp.tools {
			if t.Name == tp.named {
				return params(t.Parameters), nil
			}
		}
	case toolsRequired:
		var b strings.Builder
		b.WriteString(`{"type":"array","minItems":1,"items":{"type":"object","anyOf":[`)
		defs := map[string]json.RawMessage{}
		var order []string
		for i, t := range tp.tools {
			p := params(t.Parameters)
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(p, &fields); err != nil {
				return nil, invalid("tools", "invalid_tools", "tools[%d].function.parameters must be a JSON schema object", i)
			}
			if d, ok := fields["$defs"]; ok {
				var m map[string]json.RawMessage
				if json.Unmarshal(d, &m) != nil {
					return nil, invalid("tools", "invalid_tools", "$defs in the parameters of tool %q must be an object", t.Name)
				}
				for k, v := range m {
					if old, seen := defs[k]; seen && !jsonEqual(old, v) {
						return nil, invalid("tools", "invalid_tools", "tool definition %q has several schemas, which is not supported", k)
					} else if !seen {
						order = append(order, k)
					}
					defs[k] = v
				}
				delete(fields, "$defs")
				p, _ = json.Marshal(fields)
			}
			if i > 0 {
				b.WriteByte(',')
			}
			name, _ := json.Marshal(t.Name)
			fmt.Fprintf(&b, `{"properties":{"name":{"type":"string","enum":[%s]},"parameters":%s},"required":["name","parameters"]}`, name, p)
		}
		b.WriteString(`]}`)
		if !tp.parallel {
			b.WriteString(`,"maxItems":1`)
		}
		if len(defs) > 0 {
			b.WriteString(`,"$defs":{`)
			for i, k := range order {
				if i > 0 {
					b.WriteByte(',')
				}
				key, _ := json.Marshal(k)
				fmt.Fprintf(&b, "%s:%s", key, defs[k])
			}
			b.WriteByte('}')
		}
		b.WriteByte('}')
		return json.RawMessage(b.String()), nil
	}
	return nil, nil
}

// jsonEqual reports whether two JSON texts have the same value.
func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
