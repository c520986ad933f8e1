package hfmodel

// The conversation and the tools as the chat template sees them: what vLLM's
// server gives transformers' apply_chat_template (its chat_utils'
// conversation messages in the "string" content format, and its request's
// tools dumped by its pydantic models), key for key and in the same order,
// for templates that print them with tojson or test a key with "is defined".

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// Message is one chat message as the template sees it: {"role", "content"},
// then the keys below that are set, in this order.
type Message struct {
	Role string
	// Content is the message's text (vLLM gives the template "" for a
	// message without content, such as an assistant's with tool calls).
	Content string
	// ToolCalls are an assistant message's tool calls ("tool_calls"; none:
	// no key, as vLLM drops an empty list).
	ToolCalls []ToolCall
	// Reasoning is an assistant message's reasoning, given as "reasoning"
	// and "reasoning_content" (nil: neither key).
	Reasoning *string
	// ToolCallID is a tool message's "tool_call_id" (nil: no key).
	ToolCallID *string
	// Name is the message's "name" (nil: no key).
	Name *string
}

// ToolCall is one tool call of an assistant message: {"id", "function":
// {"arguments", "name"}, "type": "function"}.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the call's arguments as a JSON object, which the
	// template sees parsed ("{}" when empty): vLLM parses OpenAI's string
	// before rendering.
	Arguments json.RawMessage
}

// Tool is one function of a request's tools as vLLM dumps it for the
// template: {"type": "function", "function": {"name", "description",
// "parameters", "strict", "defer_loading"}, "defer_loading"}, where
// description and parameters are null when not given and strict and the
// defer_loading keys are left out when not given.
type Tool struct {
	Name        string
	Description *string
	// Parameters is the function's JSON Schema, a JSON object (nil: null).
	Parameters json.RawMessage
	Strict     *bool
	// FunctionDeferLoading is the function's defer_loading (vLLM gives it
	// the tool's when the function has none), DeferLoading the tool's.
	FunctionDeferLoading *bool
	DeferLoading         *bool
}

// messagesValue is the template's messages; the final message's content
// ends with suffix (the mark of continue_final_message, or "").
func messagesValue(messages []Message, suffix string) (jinja.Value, error) {
	items := make([]jinja.Value, len(messages))
	for i, msg := range messages {
		m := jinja.NewDict()
		d := m.AsDict()
		d.Set("role", jinja.NewString(msg.Role))
		content := msg.Content
		if i == len(messages)-1 {
			content += suffix
		}
		d.Set("content", jinja.NewString(content))
		if len(msg.ToolCalls) > 0 {
			calls := make([]jinja.Value, len(msg.ToolCalls))
			for j, c := range msg.ToolCalls {
				v, err := toolCallValue(c)
				if err != nil {
					return jinja.Undefined(), fmt.Errorf("message %d, tool call %d: %w", i, j, err)
				}
				calls[j] = v
			}
			d.Set("tool_calls", jinja.NewList(calls))
		}
		setString(d, "reasoning", msg.Reasoning)
		setString(d, "reasoning_content", msg.Reasoning)
		setString(d, "tool_call_id", msg.ToolCallID)
		setString(d, "name", msg.Name)
		items[i] = m
	}
	return jinja.NewList(items), nil
}

func toolCallValue(c ToolCall) (jinja.Value, error) {
	args := jinja.NewDict()
	if len(c.Arguments) > 0 {
		v, err := jsonValue(c.Arguments)
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("arguments: %w", err)
		}
		if !v.IsDict() {
			return jinja.Undefined(), errors.New("arguments must be a JSON object")
		}
		args = v
	}
	fn := jinja.NewDict()
	fn.AsDict().Set("arguments", args)
	fn.AsDict().Set("name", jinja.NewString(c.Name))
	call := jinja.NewDict()
	call.AsDict().Set("id", jinja.NewString(c.ID))
	call.AsDict().Set("function", fn)
	call.AsDict().Set("type", jinja.NewString("function"))
	return call, nil
}

// toolsValue is the template's tools: None for nil, else the list (empty
// or not).
func toolsValue(tools []Tool) (jinja.Value, error) {
	if tools == nil {
		return jinja.None(), nil
	}
	items := make([]jinja.Value, len(tools))
	for i, t := range tools {
		fn := jinja.NewDict()
		f := fn.AsDict()
		f.Set("name", jinja.NewString(t.Name))
		f.Set("description", stringOrNone(t.Description))
		params := jinja.None()
		if len(t.Parameters) > 0 {
			v, err := jsonValue(t.Parameters)
			if err != nil {
				return jinja.Undefined(), fmt.Errorf("tool %d: parameters: %w", i, err)
			}
			if !v.IsDict() && !v.IsNone() {
				return jinja.Undefined(), fmt.Errorf("tool %d: parameters must be a JSON object", i)
			}
			params = v
		}
		f.Set("parameters", params)
		setBool(f, "strict", t.Strict)
		setBool(f, "defer_loading", t.FunctionDeferLoading)
		tool := jinja.NewDict()
		tool.AsDict().Set("type", jinja.NewString("function"))
		tool.AsDict().Set("function", fn)
		setBool(tool.AsDict(), "defer_loading", t.DeferLoading)
		items[i] = tool
	}
	return jinja.NewList(items), nil
}

func stringOrNone(s *string) jinja.Value {
	if s == nil {
		return jinja.None()
	}
	return jinja.NewString(*s)
}

func setString(d *jinja.Dict, key string, s *string) {
	if s != nil {
		d.Set(key, jinja.NewString(*s))
	}
}

func setBool(d *jinja.Dict, key string, b *bool) {
	if b != nil {
		d.Set(key, jinja.NewBool(*b))
	}
}
