package reasoning

import (
	"fmt"
	"slices"
)

// Options are what a parser may need from the request and the model.
type Options struct {
	// TokenID looks a token up in the model's vocabulary (added tokens included).
	TokenID func(token string) (int, bool)
	// Vars are the request's chat_template_kwargs (e.g. enable_thinking), nil when none.
	Vars map[string]any
	// PromptIDs are the prompt's token ids (for parsers that read whether the prompt opened the reasoning).
	PromptIDs []int
	// SpecialTokens are the tokenizer's special tokens (transformers'
	// all_special_tokens: eos, pad, additional ones). The qwen3 parser drops
	// them from what it splits, by token id and, in a non-streamed output,
	// by text; nil means none.
	SpecialTokens []string
}

// delta is one streamed step's message: the keys vLLM sets, and their values
// (a set key with a nil value is written as null).
type delta struct {
	reasoning, content       *string
	hasReasoning, hasContent bool
}

// impl is one vLLM reasoning parser.
type impl interface {
	extract(text string) (reasoning, content *string)
	stream(text string, ids []int) (delta, bool)
	// endedNow is the server's test, after a piece, that the reasoning ended.
	endedNow(ids []int) bool
	// finish flushes what an engine-based parser holds back.
	finish() (delta, bool)
	engineBased() bool
	isEnd(ids []int) bool
	count(ids []int) int
}

var makers = map[string]func(Options) (impl, error){
	"deepseek_r1": func(o Options) (impl, error) { return newDeepseekR1(o) },
	"qwen3":       func(o Options) (impl, error) { return newQwen3(o) },
}

// Names are the parsers, by vLLM's --reasoning-parser names, sorted.
func Names() []string {
	names := make([]string, 0, len(makers))
	for n := range makers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// KeepsSpecialTokens reports whether the parser name reads the output with
// its special tokens: vLLM's server then detokenizes it with
// skip_special_tokens=false (qwen3's adjust_request does; deepseek_r1
// keeps the request's choice).
func KeepsSpecialTokens(name string) bool { return name == "qwen3" }

// Parser splits one choice of one request.
type Parser struct {
	impl    impl
	prompt  []int
	checked bool // the prompt was looked at
	ended   bool
	last    delta
}

// New makes a parser for one choice of one request; it fails for an unknown
// name or a vocabulary without the parser's tokens (as vLLM refuses).
func New(name string, o Options) (*Parser, error) {
	mk, ok := makers[name]
	if !ok {
		return nil, fmt.Errorf("reasoning: no parser %q (have %v)", name, Names())
	}
	im, err := mk(o)
	if err != nil {
		return nil, err
	}
	return &Parser{impl: im, prompt: slices.Clone(o.PromptIDs)}, nil
}

func lookup(o Options, token string) (int, bool) {
	if o.TokenID == nil {
		return 0, false
	}
	return o.TokenID(token)
}

// Extract splits a whole (non-streamed) output: nil means JSON null (vLLM's None).
func (p *Parser) Extract(text string, ids []int) (reasoning, content *string) {
	return p.impl.extract(text)
}

// Next feeds the next piece of a streamed output (its text, as the frontend's
// incremental detokenization gives it, the same pieces as vLLM's, and the ids
// that made it). ok is false when vLLM's parser returns None for the step.
func (p *Parser) Next(text string, ids []int) (reasoning, content *string, ok bool) {
	return p.step(text, ids, false)
}

// Final feeds the last piece of a streamed output, the one that comes with
// the finish reason (its text may be empty, as for the stop token), and
// adds what the parser held back. Call it instead of Next for that piece.
func (p *Parser) Final(text string, ids []int) (reasoning, content *string, ok bool) {
	return p.step(text, ids, true)
}

// Keys reports which keys vLLM's delta message for the last step sets. A
// set key whose value is nil is written "key": null in vLLM's chunk (its
// deltas are serialized without unset fields); an unset key is left out.
func (p *Parser) Keys() (reasoning, content bool) {
	return p.last.hasReasoning, p.last.hasContent
}

// Ended reports whether the reasoning has ended by now (vLLM's is_reasoning_end on
// the ids so far): from then on, content goes to the tool-call parser.
func (p *Parser) Ended() bool { return p.ended }

// IsReasoningEnd is vLLM's is_reasoning_end: whether the reasoning is over
// at the end of ids. The server asks it of the prompt's ids (for the first
// streamed piece, and for structured outputs, whose grammar applies only
// after the reasoning).
func (p *Parser) IsReasoningEnd(ids []int) bool { return p.impl.isEnd(ids) }

// CountReasoningTokens is vLLM's count_reasoning_tokens of the generated ids,
// the usage's completion_tokens_details.reasoning_tokens (vLLM reports it
// whenever a reasoning parser is configured). After a stream it counts what
// the stream did; otherwise the ids on their own.
func (p *Parser) CountReasoningTokens(ids []int) int { return p.impl.count(ids) }

// step is vLLM's Parser.parse_delta with a reasoning parser and no tool
// parser, reasoning included.
func (p *Parser) step(text string, ids []int, finished bool) (*string, *string, bool) {
	if !p.checked {
		p.checked = true
		p.ended = p.impl.isEnd(p.prompt)
	}
	var d delta
	have, transitioned := false, false
	if !p.ended {
		d, have = p.impl.stream(text, ids)
		if p.impl.endedNow(ids) {
			p.ended, transitioned = true, true
			if p.impl.engineBased() {
				// What the engine still holds is content now.
				cur := ""
				if have && d.content != nil {
					cur = *d.content
				}
				if f, ok := p.impl.finish(); ok && f.content != nil {
					cur += *f.content
				}
				if cur != "" {
					if !have {
						d, have = delta{}, true
					}
					d.content, d.hasContent = &cur, true
				}
			}
		}
	}
	if !have && !transitioned && p.ended {
		d, have = contentDelta(text), true
	}
	if finished && p.impl.engineBased() && !p.ended {
		if f, ok := p.impl.finish(); ok {
			d, have = merge(d, have, f), true
		}
	}
	if !have {
		d = delta{}
	}
	p.last = d
	return d.reasoning, d.content, have
}

// merge adds a flushed delta to a step's.
func merge(d delta, have bool, f delta) delta {
	if !have {
		return f
	}
	if f.content != nil && *f.content != "" {
		s := *f.content
		if d.content != nil {
			s = *d.content + s
		}
		d.content, d.hasContent = &s, true
	}
	if f.reasoning != nil && *f.reasoning != "" {
		s := *f.reasoning
		if d.reasoning != nil {
			s = *d.reasoning + s
		}
		d.reasoning, d.hasReasoning = &s, true
	}
	return d
}
