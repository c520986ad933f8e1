package toolcall

import (
	"encoding/json"
	"fmt"
	"sort"
)

// Tool is one of a request's tools (function tools).
type Tool struct {
	Name       string
	Parameters json.RawMessage // the function's JSON schema; nil when absent
}

// Options are what a parser may need from the request and the model.
type Options struct {
	Tools []Tool
	// TokenID looks a token up in the model's vocabulary (added tokens included).
	TokenID func(token string) (int, bool)
}

// Call is one parsed tool call.
type Call struct {
	Name      string
	Arguments string // JSON text, as vLLM's server writes it
}

// CallDelta is one tool call's part in a streamed chunk (vLLM's DeltaToolCall).
type CallDelta struct {
	Index     int
	Opens     bool    // the call's first delta: the frontend adds id and type "function"
	Name      *string // the function's name, when this delta carries it
	Arguments *string // a fragment of the arguments' JSON text, when this delta carries one
}

// Delta is what one streamed step sends (vLLM's DeltaMessage).
type Delta struct {
	Content *string
	Calls   []CallDelta
}

// impl is one parser's logic, stepped by Parser.
type impl interface {
	// extract is the parser's extract_tool_calls: called is its tools_called.
	extract(text string) (content *string, calls []Call, called bool)
	// stream is extract_tool_calls_streaming; nil is Python's None.
	stream(s *step) *Delta
	// unstreamed is get_remaining_unstreamed_args.
	unstreamed() string
}

// flusher is an engine-based parser's finish_streaming: what the end of
// the stream releases (held-back text, a held closing brace); nil for none.
type flusher interface {
	flush() *Delta
}

// step is one call of a streaming parser, as vLLM's server makes it.
type step struct {
	prevText, curText, deltaText string
	prevIDs, curIDs, deltaIDs    []int
}

type factory struct {
	keepSpecial bool
	// engine: vLLM runs the parser as an engine-based one, whose
	// non-streamed content without calls is the parser's (nil when empty).
	engine bool
	make   func(o Options) (impl, error)
}

var parsers = map[string]factory{
	"deepseek_v3": {keepSpecial: false, make: newDeepSeekV3},
	"hermes":      {keepSpecial: true, make: newHermes},
	"llama3_json": {keepSpecial: false, make: newLlama3JSON},
	"mistral":     {keepSpecial: true, engine: true, make: newMistral},
}

// Names are the parsers, by vLLM's --tool-call-parser names, sorted.
func Names() []string {
	out := make([]string, 0, len(parsers))
	for n := range parsers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Parser parses one choice of one request: Extract for a whole output, or
// Next (then Finish) for a stream. It is not safe for concurrent use.
type Parser struct {
	name        string
	keepSpecial bool
	engine      bool
	impl        impl

	prevText string
	prevIDs  []int
	last     *Delta // the last step's delta (nil: None)
	stepped  bool
	called   bool

	finished bool        // finish has run
	rest     []CallDelta // finalize_generation's change, when there is one
	flushed  *Delta      // finish_streaming's delta
}

// New makes a parser for one choice of one request. It fails for an unknown
// name, or when the model's vocabulary lacks a token the parser needs (as vLLM refuses at start).
func New(name string, o Options) (*Parser, error) {
	f, ok := parsers[name]
	if !ok {
		return nil, fmt.Errorf("toolcall: unknown tool-call parser %q", name)
	}
	im, err := f.make(o)
	if err != nil {
		return nil, err
	}
	return &Parser{name: name, keepSpecial: f.keepSpecial, engine: f.engine, impl: im}, nil
}

// lookup asks o for token's id; a nil TokenID knows no token.
func (o Options) lookup(token string) (int, bool) {
	if o.TokenID == nil {
		return 0, false
	}
	return o.TokenID(token)
}

// KeepSpecialTokens: the parser reads special tokens, so the output must be
// detokenized with them (vLLM's adjust_request sets skip_special_tokens=False).
func (p *Parser) KeepSpecialTokens() bool { return p.keepSpecial }

// KeepsSpecialTokens is KeepSpecialTokens of the parser name, without
// making one (false for an unknown name).
func KeepsSpecialTokens(name string) bool { return parsers[name].keepSpecial }

// Extract parses a whole (non-streamed) output: content is the message's content
// (nil: JSON null), calls the tool calls (none: the output had none and content is the text as is).
//
// As vLLM's server: when the parser reports a call, content is what it
// returned, nil when that is empty or all whitespace; otherwise content is
// the text as is. (deepseek_v3 can report a call and find none: then calls
// is empty and content is still the parser's, the text before the calls.)
// For mistral, which vLLM runs as an engine-based parser, content without
// calls is the parser's too (nil when empty): after [TOOL_CALLS], what
// follows it.
func (p *Parser) Extract(text string) (content *string, calls []Call) {
	c, calls, called := p.impl.extract(clean(text))
	if !called && p.engine {
		if c == nil || *c == "" {
			return nil, nil
		}
		return c, nil
	}
	if !called {
		t := text
		return &t, nil
	}
	if c != nil && pyStrip(*c) == "" {
		c = nil
	}
	return c, calls
}

// Next feeds the next piece of the output: its text and the token ids that
// made it (the frontend's incremental detokenization gives the same text pieces
// vLLM's does). ok is false when vLLM's parser returns None for the step (nothing is sent).
func (p *Parser) Next(text string, ids []int) (d Delta, ok bool) {
	text = clean(text)
	cur := p.prevText + text
	curIDs := append(append(make([]int, 0, len(p.prevIDs)+len(ids)), p.prevIDs...), ids...)
	out := p.impl.stream(&step{
		prevText: p.prevText, curText: cur, deltaText: text,
		prevIDs: p.prevIDs, curIDs: curIDs, deltaIDs: ids,
	})
	p.prevText, p.prevIDs = cur, curIDs
	p.last, p.stepped = out, true
	if out == nil {
		return Delta{}, false
	}
	if len(out.Calls) > 0 {
		p.called = true
	}
	return cloneDelta(out), true
}

// Finish is what vLLM's server sends with the final chunk: for each call whose
// arguments were not all streamed, the rest (vLLM compares the streamed text with the parsed arguments).
//
// Call it once, after the Next of the final piece. vLLM 0.32 does this only
// when the final step's delta carries tool calls, and only for the last
// call parsed: it appends the rest of that call's arguments (the parsed
// arguments, as JSON text, less what was streamed, when the streamed text is
// a prefix of them, else nothing) to the arguments of the final delta's last
// call, turning a nil Arguments into a string even when the rest is empty.
// Finish returns that change as one CallDelta whose Index is the final
// delta's last call's and whose Arguments is the rest; the frontend must
// append it to that call of the final chunk (not add a second entry), as
// FinalDelta does. It returns nil when vLLM changes nothing.
//
// mistral with [ARGS] in the vocabulary is run by vLLM's parser engine,
// whose end of stream (finish_streaming) can also release held-back output:
// a closing brace of the arguments, text that might have begun a marker, a
// call never named. Finish appends that release's tool call entries (vLLM
// sends them as further entries of the final chunk's tool_calls, an index
// possibly repeated); held-back content and a release after a final piece
// without calls only FinalDelta carries, so a frontend should prefer it.
func (p *Parser) Finish() []CallDelta {
	rest, fl := p.finish()
	out := append([]CallDelta(nil), rest...)
	if fl != nil {
		out = append(out, fl.Calls...)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// finish runs finalize_generation's look-up and the engine's flush once.
func (p *Parser) finish() ([]CallDelta, *Delta) {
	if p.finished {
		return p.rest, p.flushed
	}
	p.finished = true
	if p.last != nil && len(p.last.Calls) > 0 {
		rest := p.impl.unstreamed()
		lastCall := p.last.Calls[len(p.last.Calls)-1]
		p.rest = []CallDelta{{Index: lastCall.Index, Arguments: &rest}}
	}
	if f, ok := p.impl.(flusher); ok {
		p.flushed = f.flush()
		if p.flushed != nil && len(p.flushed.Calls) > 0 {
			p.called = true
		}
	}
	return p.rest, p.flushed
}

// FinalDelta is the final chunk's delta as vLLM's server sends it: d (what
// Next returned for the final piece; ok its ok) with Finish merged in, then
// the engine's flush (content appended, tool call entries added). ok is
// false when there is nothing to send but the finish reason.
func (p *Parser) FinalDelta(d Delta, ok bool) (Delta, bool) {
	rest, fl := p.finish()
	if ok && len(rest) > 0 && len(d.Calls) > 0 {
		d = cloneDelta(&d)
		c := &d.Calls[len(d.Calls)-1]
		s := *rest[0].Arguments
		if c.Arguments != nil {
			s = *c.Arguments + s
		}
		c.Arguments = &s
	}
	if fl == nil {
		return d, ok
	}
	if !ok {
		return cloneDelta(fl), true
	}
	d = cloneDelta(&d)
	if fl.Content != nil && *fl.Content != "" {
		s := *fl.Content
		if d.Content != nil {
			s = *d.Content + s
		}
		d.Content = &s
	}
	d.Calls = append(d.Calls, fl.Calls...)
	return d, true
}

// Called reports whether the stream produced any tool call (finish_reason "tool_calls" in vLLM's rules; document the exact rule).
//
// vLLM's rule: the final chunk's finish_reason is "tool_calls" when any
// chunk sent so far carried at least one tool call delta (this is true then),
// the request's tool_choice did not name a function, and the engine's
// finish reason is "stop"; otherwise it is the engine's finish reason.
// Non-streamed, it is "tool_calls" when Extract returned at least one call
// (tool_choice "auto"); the engine's reason otherwise.
func (p *Parser) Called() bool { return p.called }

func cloneDelta(d *Delta) Delta {
	out := Delta{Content: d.Content}
	if len(d.Calls) > 0 {
		out.Calls = append([]CallDelta(nil), d.Calls...)
	}
	return out
}

func strp(s string) *string { return &s }
