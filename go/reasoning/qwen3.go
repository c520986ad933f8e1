package reasoning

import (
	"fmt"
	"strings"
)

// qwen3 is vLLM's qwen3 reasoning parser: its Qwen3Parser engine behind
// the reasoning adapter, tool-call parsing skipped.
type qwen3 struct {
	thinking bool
	startID  int // -1 when the vocabulary lacks <think>
	endIDs   map[int]bool
	bounds   map[int]bool // the chat turn boundaries <|im_start|>, <|im_end|>
	proto    engine       // configuration only; copied for each pass

	eng         engine // the streaming pass
	started     bool
	streamed    bool // counts come from the streaming pass
	ended       bool // the engine saw the reasoning end
	deferred    string
	contentSeen bool // non-whitespace content went out
}

func newQwen3(o Options) (*qwen3, error) {
	thinking := true
	if v, ok := o.Vars["enable_thinking"]; ok {
		switch v.(type) {
		case map[string]any, []any:
			// vLLM caches its grammar by this value and fails on one
			// that is not hashable.
			return nil, fmt.Errorf("reasoning: qwen3: enable_thinking %T is not hashable", v)
		}
		thinking = truthy(v)
	}
	q := &qwen3{thinking: thinking, startID: -1, endIDs: map[int]bool{}, bounds: map[int]bool{}}
	idTerm, idText := map[int]string{}, map[int]string{}
	lits := append([]lit(nil), qwen3Literals...)
	for _, name := range []string{termThinkStart, termThinkEnd, termToolStart, termToolEnd} {
		text := literalOf(name)
		if id, ok := lookup(o, text); ok {
			idTerm[id], idText[id] = name, text
		}
	}
	// The tokenizer's other special tokens are dropped from the output.
	for _, sp := range o.SpecialTokens {
		if isQwen3Literal(sp) {
			continue
		}
		if id, ok := lookup(o, sp); ok {
			idTerm[id], idText[id] = dropTerm, sp
		}
		lits = append(lits, lit{sp, dropTerm})
	}
	if id, ok := lookup(o, "<think>"); ok {
		q.startID = id
	}
	// The reasoning ends at </think> or at a tool call; without a </think>
	// token vLLM knows no end token at all.
	if id, ok := lookup(o, "</think>"); ok {
		q.endIDs[id] = true
		if id, ok := lookup(o, "<tool_call>"); ok {
			q.endIDs[id] = true
		}
	}
	for _, b := range []string{"<|im_start|>", "<|im_end|>"} {
		if id, ok := lookup(o, b); ok {
			q.bounds[id] = true
		}
	}
	strict := map[string]bool{}
	for _, name := range idTerm {
		strict[name] = true
	}
	q.proto = engine{
		initial: thinking,
		strict:  strict,
		sc:      scanner{idTerm: idTerm, idText: idText},
		lx:      lexer{sh: newShape(lits)},
	}
	return q, nil
}

func literalOf(name string) string {
	for _, l := range qwen3Literals {
		if l.name == name {
			return l.text
		}
	}
	return ""
}

func isQwen3Literal(s string) bool {
	for _, l := range qwen3Literals {
		if l.text == s {
			return true
		}
	}
	return false
}

// fresh is an engine of this configuration with no state shared.
func (q *qwen3) fresh() engine {
	e := q.proto
	e.sc = scanner{idTerm: q.proto.sc.idTerm, idText: q.proto.sc.idText}
	e.lx = lexer{sh: q.proto.lx.sh}
	e.reset()
	return e
}

func (q *qwen3) extract(text string) (*string, *string) {
	if !q.thinking {
		return nil, &text
	}
	e := q.fresh()
	evs := append(e.feed(text, nil), e.finish()...)
	var r, c strings.Builder
	for _, ev := range evs {
		switch ev.kind {
		case evReasoning:
			r.WriteString(ev.value)
		case evText:
			c.WriteString(ev.value)
		}
	}
	return orNil(r.String()), orNil(c.String())
}

func (q *qwen3) stream(text string, ids []int) (delta, bool) {
	if !q.started {
		q.started = true
		q.eng = q.fresh()
	}
	q.streamed = true
	return q.toDelta(q.eng.feed(text, ids), false)
}

func (q *qwen3) endedNow([]int) bool { return q.ended }

func (q *qwen3) finish() (delta, bool) {
	if !q.started {
		q.started = true
		q.eng = q.fresh()
	}
	evs := q.eng.finish()
	if len(evs) == 0 && q.deferred == "" {
		return delta{}, false
	}
	return q.toDelta(evs, true)
}

func (q *qwen3) engineBased() bool { return true }

// toDelta is the engine's events as one streamed delta. Content that is
// only whitespace waits until something else is said or the stream ends.
func (q *qwen3) toDelta(evs []event, finished bool) (delta, bool) {
	if len(evs) == 0 && q.deferred == "" {
		return delta{}, false
	}
	var c, r strings.Builder
	c.WriteString(q.deferred)
	q.deferred = ""
	for _, ev := range evs {
		switch ev.kind {
		case evText:
			c.WriteString(ev.value)
		case evReasoning:
			r.WriteString(ev.value)
		case evEnd:
			q.ended = true
		}
	}
	content := c.String()
	if !q.contentSeen && content != "" {
		if pyStrip(content) != "" {
			q.contentSeen = true
		} else if !finished {
			q.deferred, content = content, ""
		}
	}
	var d delta
	if content != "" {
		d.content, d.hasContent = &content, true
	}
	if s := r.String(); s != "" {
		d.reasoning, d.hasReasoning = &s, true
	}
	return d, d.hasContent || d.hasReasoning
}

func (q *qwen3) isEnd(ids []int) bool {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if q.endIDs[id] {
			return true
		}
		if id == q.startID {
			if q.thinking {
				return false // <think> opens the reasoning only in that state
			}
			break
		}
		if q.bounds[id] {
			break
		}
	}
	return !q.thinking
}

func (q *qwen3) count(ids []int) int {
	if q.streamed {
		return q.eng.count
	}
	// A fresh pass over the whole output, by its ids: tokens count while
	// the reasoning lasts, its markers and dropped tokens not.
	if !q.thinking {
		return 0
	}
	n := 0
	for _, id := range ids {
		term, marked := q.proto.sc.idTerm[id]
		switch {
		case q.endIDs[id] && (term == termThinkEnd || term == termToolStart):
			return n
		case marked:
		default:
			n++
		}
	}
	return n
}
