package frontend

// What a chat choice's output becomes when the model's workers name a
// reasoning parser or the request has tools, as vLLM's server makes it:
//
//   - The reasoning parser (go/reasoning) splits the reasoning from the
//     content; the response carries it as "reasoning" (vLLM's name) and
//     "reasoning_content" (the older name, Dynamo's), null when there was
//     none; include_reasoning false leaves it out.
//   - Then the content goes by the request's tool_choice (tools.go): "auto"
//     through the model's tool-call parser (go/toolcall), "required" read as
//     the JSON array of calls its schema made the engine write, a named
//     function as that function's arguments; "none" (or no tools) leaves it
//     content. finish_reason is "tool_calls" when "auto" found calls or
//     "required" stopped, as vLLM's.
//   - Streamed, the same pieces go out as deltas: reasoning first, then
//     content or tool-call deltas (index, and id, type and name with a
//     call's first delta); what the parser held of the arguments goes with
//     the last delta.

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/reasoning"
	"github.com/dynamo-ctx/dynamo-ctx/go/toolcall"
)

// cardsName is the parser the model's instances (cards) name by field
// ("" for none), and an error naming what when two name different ones.
func cardsName(model, what, param, code string, cards []modelcard.Card, field func(modelcard.Card) string) (string, error) {
	name := ""
	for i, c := range cards {
		if i > 0 && field(c) != name {
			return "", invalid(param, code, "the workers of model %q name different %s (%q, %q)", model, what, name, field(c))
		}
		name = field(c)
	}
	return name, nil
}

// reasoningParserOf is the reasoning parser the model's instances name.
func reasoningParserOf(model string, cards []modelcard.Card) (string, error) {
	return cardsName(model, "reasoning parsers", "model", "model_misconfigured", cards,
		func(c modelcard.Card) string { return c.ReasoningParser })
}

// outputParse reads one chat choice's output.
type outputParse struct {
	tools            *toolPlan
	reason           *reasoning.Parser // nil: no reasoning parser
	calls            *toolcall.Parser  // toolsAuto: the model's tool-call parser
	includeReasoning bool

	// Streaming.
	reasoningEnded  bool
	toolTextStarted bool
	prevText        string // the output so far; once the tool phase started, its text
	nameSent        bool   // toolsNamed: the call's first delta went out
	streamed        bool   // a delta carried tool calls
}

// callOut is one tool call, whole or a delta of it.
type callOut struct {
	Index    int     `json:"index"`
	ID       string  `json:"id,omitempty"`
	Type     string  `json:"type,omitempty"`
	Function funcOut `json:"function"`
}

type funcOut struct {
	Name      *string `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
}

// wholeCall is a tool call of a (non-streamed) message.
type wholeCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// deltaMsg is what one streamed step sends of a choice.
type deltaMsg struct {
	content   *string
	reasoning *string
	calls     []callOut
}

// toolCallID is a new tool call's id, as vLLM makes one.
func toolCallID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "chatcmpl-tool-" + hex.EncodeToString(b[:])
}

// readsToolsAsAuto reports whether the choices' output goes through the
// model's tool-call parser: tool_choice auto, or required and named with a
// parser that cannot read them as JSON (jsonToolChoice).
func (p *plan) readsToolsAsAuto() bool {
	return p.tools.mode == toolsAuto || (p.tools.mode != toolsNone && !jsonToolChoice(p.toolParser))
}

// parsing reports whether the plan's chat choices need an outputParse.
func (p *plan) parsing() bool {
	return p.chat && (p.reasoningParser != "" || p.tools.mode != toolsNone)
}

// skipsSpecial: whether the choices' text leaves special tokens out (the
// request's choice, unless its tool-call parser reads them).
func (p *plan) skipsSpecial() bool {
	if !p.skipSpecial || !p.chat {
		return p.skipSpecial
	}
	keep := (p.reasoningParser != "" && reasoning.KeepsSpecialTokens(p.reasoningParser)) ||
		(p.readsToolsAsAuto() && toolcall.KeepsSpecialTokens(p.toolParser))
	return !keep
}

// checkParsers makes the request's parsers once, so that a model whose
// vocabulary they cannot read is refused before anything is sent.
func (p *plan) checkParsers(tx text) error {
	if !p.parsing() {
		return nil
	}
	_, err := p.outputParse(tx, nil)
	return err
}

// outputParse makes a choice's parser (nil when the plan needs none);
// promptIDs are the choice's prompt.
func (p *plan) outputParse(tx text, promptIDs []int) (*outputParse, error) {
	if !p.parsing() {
		return nil, nil
	}
	o := &outputParse{tools: &p.tools, includeReasoning: p.req.IncludeReasoning == nil || *p.req.IncludeReasoning}
	if p.reasoningParser != "" {
		r, err := reasoning.New(p.reasoningParser, reasoning.Options{TokenID: tx.tokenID, Vars: p.req.chatOptions().Vars,
			PromptIDs: promptIDs, SpecialTokens: tx.specialTokens()})
		if err != nil {
			return nil, &requestError{msg: "the model's reasoning parser cannot read its output: " + err.Error(), param: "model", code: "model_misconfigured"}
		}
		o.reason = r
		// As vLLM's server: a prompt that ended the reasoning (a template
		// that closed it) makes the whole output content.
		o.reasoningEnded = r.IsReasoningEnd(promptIDs)
	} else {
		o.reasoningEnded = true
	}
	if p.readsToolsAsAuto() {
		tp, err := toolcall.New(p.toolParser, toolcall.Options{Tools: p.tools.tools, TokenID: tx.tokenID})
		if err != nil {
			return nil, &requestError{msg: "the model's tool-call parser cannot read its output: " + err.Error(), param: "tools", code: "model_misconfigured"}
		}
		o.calls = tp
	}
	return o, nil
}

// whole reads a whole (non-streamed) output: the message's content,
// reasoning and tool calls, and the choice's finish reason.
func (o *outputParse) whole(text string, ids []int, finish string) (content, reason *string, calls []wholeCall, finishReason string) {
	content = &text
	if o.reason != nil {
		reason, content = o.reason.Extract(text, ids)
		if !o.includeReasoning {
			reason = nil
		}
	}
	var found []toolcall.Call
	switch {
	case o.calls != nil: // auto, or required and named read as auto
		var rest *string
		if rest, found = o.calls.Extract(deref(content)); len(found) > 0 {
			content = rest
			if content != nil && strings.TrimSpace(*content) == "" {
				content = nil
			}
		} else if o.tools.mode != toolsAuto && (content == nil || strings.TrimSpace(*content) == "") {
			content = nil
		}
		if o.tools.mode != toolsAuto && content == nil {
			content = ptr("")
		}
	case o.tools.mode == toolsNamed:
		if content != nil && strings.TrimSpace(*content) != "" {
			found = []toolcall.Call{{Name: o.tools.named, Arguments: *content}}
		}
		content = ptr("")
	case o.tools.mode == toolsRequired:
		found = requiredCalls(deref(content))
		content = ptr("")
	}
	if !o.tools.parallel && len(found) > 1 {
		found = found[:1]
	}
	finishReason = finish
	if (o.tools.mode == toolsAuto && len(found) > 0) || (o.tools.mode == toolsRequired && finish == "stop") {
		finishReason = "tool_calls"
	}
	calls = make([]wholeCall, len(found))
	for i, f := range found {
		calls[i].ID, calls[i].Type = toolCallID(), "function"
		calls[i].Function.Name, calls[i].Function.Arguments = f.Name, f.Arguments
	}
	return content, reason, calls, finishReason
}

// requiredCalls reads the output of tool_choice "required": a JSON array
// of {"name": string, "parameters": object or null} (vLLM's
// FunctionDefinition); anything else is no call. The arguments are the
// parameters as Python's json.dumps writes them.
func requiredCalls(s string) []toolcall.Call {
	var items []map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &items) != nil {
		return nil
	}
	out := make([]toolcall.Call, 0, len(items))
	for _, it := range items {
		var name string
		if it == nil || json.Unmarshal(it["name"], &name) != nil {
			return nil
		}
		if d, ok := it["description"]; ok && !jsonscan.IsNull(d) {
			var desc string
			if json.Unmarshal(d, &desc) != nil {
				return nil
			}
		}
		args := "null"
		if p, ok := it["parameters"]; ok && !jsonscan.IsNull(p) {
			if t := jsonscan.Trim(p); t[0] != '{' {
				return nil
			}
			var ok bool
			if args, ok = toolcall.PyDumps(string(p)); !ok {
				return nil
			}
		}
		out = append(out, toolcall.Call{Name: name, Arguments: args})
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// deref is *s, "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// step reads the next piece of a streamed output (its text and the ids that
// made it); finished: the choice's last. nil: nothing to send for it.
func (o *outputParse) step(delta string, ids []int, finished bool) *deltaMsg {
	var dm *deltaMsg
	transitioned := false
	if !o.reasoningEnded {
		next := o.reason.Next
		if finished {
			next = o.reason.Final // with what the parser held back
		}
		if r, c, ok := next(delta, ids); ok {
			dm = &deltaMsg{reasoning: r, content: c}
		}
		if o.reason.Ended() {
			// The tool phase starts with what followed the reasoning.
			o.reasoningEnded, transitioned = true, true
			delta = ""
			if dm != nil && dm.content != nil {
				delta = *dm.content
			}
		}
	}
	inTools := o.tools.mode != toolsNone && o.reasoningEnded
	if inTools {
		if !o.toolTextStarted {
			o.toolTextStarted, o.prevText = true, ""
		}
		// Only the required-calls scanner reads the whole text so far; the
		// others take the piece (no copy of the text per token).
		current := ""
		if o.tools.mode == toolsRequired && o.calls == nil {
			current = o.prevText + delta
		}
		var fromReasoning *string
		if dm != nil {
			fromReasoning = dm.reasoning
		}
		dm = o.toolStep(o.prevText, current, delta, ids, finished)
		if fromReasoning != nil && *fromReasoning != "" {
			if dm == nil {
				dm = &deltaMsg{}
			}
			if dm.reasoning == nil || *dm.reasoning == "" {
				dm.reasoning = fromReasoning
			}
		}
		if dm != nil && len(dm.calls) > 0 {
			o.streamed = true
		}
		o.prevText = current
	}
	if dm == nil && !transitioned && o.reasoningEnded && !inTools {
		dm = &deltaMsg{content: ptr(delta)}
	}
	if dm != nil && !o.includeReasoning {
		dm.reasoning = nil
		if (dm.content == nil || *dm.content == "") && len(dm.calls) == 0 {
			dm = nil
		}
	}
	if dm != nil && !o.tools.parallel {
		kept := dm.calls[:0]
		for _, c := range dm.calls {
			if c.Index == 0 {
				kept = append(kept, c)
			}
		}
		dm.calls = kept
	}
	return dm
}

// toolStep is the tool phase of step, by tool_choice; finished: the
// output's last piece, which also carries what the parser held back (the
// rest of the last call's arguments, as vLLM's server sends it).
func (o *outputParse) toolStep(prev, current, delta string, ids []int, finished bool) *deltaMsg {
	switch {
	case o.calls != nil: // below
	case o.tools.mode == toolsNamed:
		c := callOut{Index: 0, Function: funcOut{Arguments: ptr(delta)}}
		if !o.nameSent {
			o.nameSent = true
			c.ID, c.Type, c.Function.Name = toolCallID(), "function", ptr(o.tools.named)
		}
		return &deltaMsg{calls: []callOut{c}}
	case o.tools.mode == toolsRequired:
		return requiredDelta(prev, current)
	}
	d, ok := o.calls.Next(delta, ids)
	if finished {
		d, ok = o.calls.FinalDelta(d, ok)
	}
	if !ok {
		return nil
	}
	out := &deltaMsg{content: d.Content}
	for _, c := range d.Calls {
		co := callOut{Index: c.Index, Function: funcOut{Name: c.Name, Arguments: c.Arguments}}
		if c.Opens {
			co.ID, co.Type = toolCallID(), "function"
		}
		out.calls = append(out.calls, co)
	}
	return out
}

// finishReason is a streamed choice's finish reason: "tool_calls" when tool
// calls went out and the output stopped, but for a named function.
func (o *outputParse) finishReason(finish string) string {
	if o.streamed && o.tools.mode != toolsNamed && finish == "stop" {
		return "tool_calls"
	}
	return finish
}

// parsedChoice is a streamed chat choice whose output is parsed.
type parsedChoice struct {
	Delta        parsedDelta `json:"delta"`
	FinishReason *string     `json:"finish_reason"`
	Index        int         `json:"index"`
	Logprobs     any         `json:"logprobs,omitempty"`
}

type parsedDelta struct {
	Content          *string   `json:"content,omitempty"`
	Reasoning        *string   `json:"reasoning,omitempty"`
	ReasoningContent *string   `json:"reasoning_content,omitempty"`
	Role             string    `json:"role,omitempty"`
	ToolCalls        []callOut `json:"tool_calls,omitempty"`
}

// sendParsed sends what a step of a parsed choice's stream makes, if
// anything.
func (p *response) sendParsed(c *choice, text string, finished bool, buf *[]byte) error {
	dm := c.parse.step(text, c.lastIDs, finished)
	c.lastIDs = nil
	withLogprobs := c.lp != nil && (c.lp.sent < len(c.lp.all) || finished)
	if dm == nil && !finished && !withLogprobs {
		return nil
	}
	ch := parsedChoice{Index: c.index}
	if dm != nil {
		ch.Delta = parsedDelta{Content: dm.content, Reasoning: dm.reasoning, ReasoningContent: dm.reasoning, ToolCalls: dm.calls}
	}
	if !c.started {
		ch.Delta.Role = "assistant"
	}
	if finished {
		ch.FinishReason = ptr(c.parse.finishReason(c.finish))
	}
	if withLogprobs {
		ch.Logprobs = c.lp.object(true, p.text)
	}
	c.started = true
	b := append((*buf)[:0], "data: "...)
	b = append(b, p.chunk([]parsedChoice{ch}, nil)...)
	b = append(b, "\n\n"...)
	*buf = b
	if _, err := p.w.Write(b); err != nil {
		return err
	}
	if !p.w.Flush() {
		return io.ErrClosedPipe
	}
	return nil
}

// parsedMessage is a parsed choice's message and finish reason (a
// non-streamed response).
func (p *response) parsedMessage(c *choice) (map[string]any, string) {
	content, reason, calls, finish := c.parse.whole(c.all.String(), c.ids, c.finish)
	msg := map[string]any{"role": "assistant", "content": content}
	if len(p.plan.tools.tools) > 0 {
		msg["tool_calls"] = calls
	}
	if c.parse.reason != nil { // the model has a reasoning parser: messages carry the field
		msg["reasoning"], msg["reasoning_content"] = reason, reason
	}
	return msg, finish
}
