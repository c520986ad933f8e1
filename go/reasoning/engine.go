package reasoning

// The terminals of vLLM's qwen3 parser engine.
const (
	termThinkStart = "THINK_START"
	termThinkEnd   = "THINK_END"
	termToolStart  = "TOOL_START"
	termToolEnd    = "TOOL_END"
)

// qwen3Literals are the qwen3 grammar's text terminals (its tool-call
// markup included: the lexer holds back their prefixes too).
var qwen3Literals = []lit{
	{"<think>", termThinkStart}, {"</think>", termThinkEnd},
	{"<tool_call>", termToolStart}, {"</tool_call>", termToolEnd},
	{"<function=", "FUNC_PREFIX"}, {"</function>", "FUNC_END"},
	{"<parameter=", "PARAM_START"}, {"</parameter>", "PARAM_END"},
	{">", "CLOSE_ANGLE"},
}

type eventKind int

const (
	evText eventKind = iota
	evReasoning
	evEnd
)

type event struct {
	kind  eventKind
	value string
	count int
}

// engine is vLLM's StreamingParserEngine for the qwen3 grammar as its
// reasoning adapter runs it (tool-call parsing skipped), so in one of two
// states: reasoning or content.
type engine struct {
	initial   bool            // starts in reasoning
	strict    map[string]bool // terminals recognized by token id only, once ids arrived
	sc        scanner
	lx        lexer
	reasoning bool
	everIDs   bool
	count     int // reasoning tokens so far
}

func (e *engine) reset() {
	e.reasoning = e.initial
	e.everIDs = false
	e.count = 0
	e.sc.reset()
	e.lx.reset()
}

func (e *engine) record(evs []event) []event {
	for _, ev := range evs {
		if ev.kind == evReasoning {
			e.count += ev.count
		}
	}
	return evs
}

func (e *engine) feed(text string, ids []int) []event {
	if len(ids) > 0 {
		e.everIDs = true
	}
	if text != "" && e.lx.buf == "" && len(e.sc.deferred) == 0 && !e.lx.sh.hasFirst(text) {
		special := false
		for _, id := range ids {
			if _, ok := e.sc.idTerm[id]; ok {
				special = true
				break
			}
		}
		if !special {
			return e.record(e.emit(text, len(ids)))
		}
	}
	items := e.sc.scan(text, ids)
	if len(items) == 1 && items[0].term == "" {
		toks := e.lx.feed(items[0].text, items[0].count)
		if len(toks) == 1 && toks[0].term == contentTerm {
			return e.record(e.emit(toks[0].value, toks[0].count))
		}
		return e.record(e.lexed(toks))
	}
	return e.record(e.items(items))
}

func (e *engine) finish() []event {
	evs := e.items(e.sc.flush())
	evs = append(evs, e.lexed(e.lx.flush())...)
	if e.reasoning {
		evs = append(evs, event{kind: evEnd})
		e.reasoning = false
	}
	return e.record(evs)
}

func (e *engine) items(items []item) []event {
	var evs []event
	for _, it := range items {
		switch {
		case it.term != "":
			evs = append(evs, e.lexed(e.lx.flush())...)
			evs = append(evs, e.terminal(it.term, it.text, 0)...)
		case it.text == "" && it.count > 0:
			evs = append(evs, e.emit("", it.count)...)
		default:
			evs = append(evs, e.lexed(e.lx.feed(it.text, it.count))...)
		}
	}
	return evs
}

func (e *engine) lexed(toks []lexTok) []event {
	var evs []event
	for _, t := range toks {
		if t.term == contentTerm || (e.everIDs && e.strict[t.term]) {
			if t.value != "" {
				evs = append(evs, e.emit(t.value, t.count)...)
			}
			continue
		}
		evs = append(evs, e.terminal(t.term, t.value, t.count)...)
	}
	return evs
}

// terminal applies the grammar's transitions from the two states the
// reasoning pass can be in.
func (e *engine) terminal(term, value string, count int) []event {
	switch {
	case term == dropTerm:
		return nil
	case term == termThinkStart && e.reasoning:
		return nil
	case term == termThinkEnd && e.reasoning:
		e.reasoning = false
		return []event{{kind: evEnd, value: value, count: count}}
	case term == termThinkEnd:
		return nil // a repeated end is dropped
	case term == termToolStart:
		// A tool call ends the reasoning; its opener is content.
		e.reasoning = false
		return []event{{kind: evEnd, value: value}, {kind: evText, value: value}}
	case term == "FUNC_PREFIX" && !e.reasoning:
		return []event{{kind: evText, value: value}}
	}
	return e.emit(value, count)
}

func (e *engine) emit(text string, count int) []event {
	if e.reasoning {
		return []event{{kind: evReasoning, value: text, count: count}}
	}
	return []event{{kind: evText, value: text, count: count}}
}
