package toolcall

import (
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/anchorsplit"
)

// This file is vLLM's parser engine (vllm/parser/engine) as it runs the
// mistral config for a tokenizer with [ARGS] and no reasoning: the token-id
// scanner, the incremental lexer and the state machine, producing semantic
// events. mistral_events.go turns the events into deltas and calls.

type engState uint8

const (
	esContent engState = iota
	esToolName
	esToolArgs
)

// Terminals (the lexer's literal names).
const (
	tmContent = iota
	tmToolCalls
	tmArgs
	tmOpenBrace
	tmDrop // a special token that is not part of the format: dropped
)

type evType uint8

const (
	evText evType = iota
	evCallStart
	evName
	evArg
	evCallEnd
)

type semEvent struct {
	typ   evType
	value string
	index int
}

type literal struct {
	text string
	term int
}

// lexItem is a scanner item: a text chunk (term tmContent) or a terminal
// pre-lexed from its token id.
type lexItem struct {
	term int
	text string
}

// engine is StreamingParserEngine for the mistral config.
type engine struct {
	lits   []literal      // the text terminals
	idTerm map[int]int    // token id -> terminal
	idText map[int]string // token id -> its text

	state     engState
	toolIndex int
	everIDs   bool
	buf       string // the lexer's held-back text

	deferred []lexItem // terminals whose text has not arrived
	postText string

	args      strings.Builder // argument text held back
	depth     int
	inString  bool
	escapeNxt bool
}

// newEngine builds the terminals; drop are the tokenizer's special tokens
// not in the format (vLLM: tokenizer.all_special_tokens).
func newEngine(o Options, drop []string) *engine {
	e := &engine{idTerm: map[int]int{}, idText: map[int]string{}, toolIndex: -1}
	add := func(text string, term int) {
		e.lits = append(e.lits, literal{text, term})
		if id, ok := o.lookup(text); ok {
			e.idTerm[id], e.idText[id] = term, text
		}
	}
	add(mistralBot, tmToolCalls)
	add(mistralArgs, tmArgs)
	e.lits = append(e.lits, literal{"{", tmOpenBrace})
	for _, d := range drop {
		if _, ok := o.lookup(d); ok {
			add(d, tmDrop)
		}
	}
	return e
}

func (e *engine) firstChar(c byte) bool {
	for _, l := range e.lits {
		if l.text[0] == c {
			return true
		}
	}
	return false
}

func (e *engine) hasFirstChar(s string) bool {
	for i := 0; i < len(s); i++ {
		if e.firstChar(s[i]) {
			return true
		}
	}
	return false
}

// feed is StreamingParserEngine.feed.
func (e *engine) feed(text string, ids []int) []semEvent {
	special := false
	for _, id := range ids {
		if _, ok := e.idTerm[id]; ok {
			special = true
		}
	}
	if len(ids) > 0 {
		e.everIDs = true
	}
	if text != "" && e.buf == "" && len(e.deferred) == 0 && !e.hasFirstChar(text) && !special {
		return e.emitForState(text)
	}
	return e.items(e.scan(text, ids, special))
}

// scan is TokenIDScanner.scan. Where vLLM decodes each token alone and
// matches the pieces against the text, the terminals are found in the text
// right to left (its _rebuild_from_anchors), which is where they are
// whenever the detokenized pieces agree with the text.
func (e *engine) scan(text string, ids []int, special bool) []lexItem {
	var out []lexItem
	if len(e.deferred) > 0 {
		out, text = e.resolveDeferred(text)
	}
	if !special {
		if text != "" {
			out = append(out, lexItem{tmContent, text})
		}
		return out
	}
	var anchors []lexItem
	for _, id := range ids {
		if t, ok := e.idTerm[id]; ok {
			anchors = append(anchors, lexItem{t, e.idText[id]})
		}
	}
	if text == "" {
		e.deferred = append(e.deferred, anchors...)
		return out
	}
	texts := make([]string, len(anchors))
	for i, a := range anchors {
		texts[i] = a.text
	}
	parts, deferred, post := anchorsplit.Split(text, texts, func(i int) bool { return anchors[i].term == tmDrop })
	for _, p := range parts {
		if p.Anchor {
			out = append(out, anchors[p.Index])
		} else {
			out = append(out, lexItem{tmContent, p.Text})
		}
	}
	for _, i := range deferred {
		e.deferred = append(e.deferred, anchors[i])
	}
	e.postText += post
	return out
}

// resolveDeferred is TokenIDScanner._resolve_deferred.
func (e *engine) resolveDeferred(text string) ([]lexItem, string) {
	deferred := e.deferred
	e.deferred = nil
	var out []lexItem
	rest := e.postText + text
	e.postText = ""
	for _, t := range deferred {
		p := strings.Index(rest, t.text)
		if p < 0 {
			e.postText += rest
			rest = ""
			e.deferred = append(e.deferred, t)
			continue
		}
		if p > 0 {
			out = append(out, lexItem{tmContent, rest[:p]})
		}
		out = append(out, t)
		rest = rest[p+len(t.text):]
	}
	return out, rest
}

// items is _process_scanner_items.
func (e *engine) items(items []lexItem) []semEvent {
	var out []semEvent
	for _, it := range items {
		if it.term != tmContent {
			out = append(out, e.lexTokens(e.lexFlush())...)
			out = append(out, e.onTerminal(it.term, it.text)...)
		} else {
			out = append(out, e.lexTokens(e.lexFeed(it.text))...)
		}
	}
	return out
}

// finish is StreamingParserEngine.finish.
func (e *engine) finish() []semEvent {
	var pending []lexItem
	if e.postText != "" {
		pending = append(pending, lexItem{tmContent, e.postText})
		e.postText = ""
	}
	pending = append(pending, e.deferred...)
	e.deferred = nil
	out := e.items(pending)
	out = append(out, e.lexTokens(e.lexFlush())...)
	if e.args.Len() > 0 {
		out = append(out, semEvent{evArg, e.args.String(), e.toolIndex})
		e.args.Reset()
	}
	if e.state != esContent {
		if e.toolIndex >= 0 {
			out = append(out, semEvent{evCallEnd, "", e.toolIndex})
		}
		e.state = esContent
	}
	return out
}

// lexFeed is IncrementalLexer.feed: text out as tokens, holding back what
// may begin a terminal.
func (e *engine) lexFeed(text string) []lexItem {
	if e.buf == "" && !e.hasFirstChar(text) {
		return []lexItem{{tmContent, text}}
	}
	e.buf += text
	return e.drain(false)
}

func (e *engine) lexFlush() []lexItem {
	if e.buf == "" {
		return nil
	}
	return e.drain(true)
}

// drain is IncrementalLexer._drain.
func (e *engine) drain(final bool) []lexItem {
	var out []lexItem
	for e.buf != "" {
		if !e.hasFirstChar(e.buf) {
			out = append(out, lexItem{tmContent, e.buf})
			e.buf = ""
			break
		}
		best := -1
		for i, l := range e.lits {
			if strings.HasPrefix(e.buf, l.text) && (best < 0 || len(l.text) > len(e.lits[best].text)) {
				best = i
			}
		}
		if !final && e.properPrefix(e.buf) {
			if best < 0 || e.longerLiteral(e.buf, len(e.lits[best].text)) {
				break
			}
		}
		if best >= 0 {
			out = append(out, lexItem{e.lits[best].term, e.lits[best].text})
			e.buf = e.buf[len(e.lits[best].text):]
			continue
		}
		n := e.contentBoundary()
		out = append(out, lexItem{tmContent, e.buf[:n]})
		e.buf = e.buf[n:]
	}
	return out
}

// properPrefix: s is a literal's proper prefix (vLLM's prefix_set).
func (e *engine) properPrefix(s string) bool {
	for _, l := range e.lits {
		if len(s) < len(l.text) && strings.HasPrefix(l.text, s) {
			return true
		}
	}
	return false
}

func (e *engine) longerLiteral(s string, n int) bool {
	for _, l := range e.lits {
		if l.text[0] == s[0] && len(l.text) > n && strings.HasPrefix(l.text, s) {
			return true
		}
	}
	return false
}

// contentBoundary is _find_content_boundary: where a literal may start
// (matching to the buffer's end), else the buffer's length.
func (e *engine) contentBoundary() int {
	b := e.buf
	for i := 1; i < len(b); i++ {
		if !e.firstChar(b[i]) {
			continue
		}
		for _, l := range e.lits {
			k := min(len(b)-i, len(l.text))
			if b[i:i+k] == l.text[:k] {
				return i
			}
		}
	}
	return len(b)
}

// lexTokens is _process_lex_tokens: once token ids have been seen, a
// terminal that has a token id is content when it only came as text.
func (e *engine) lexTokens(toks []lexItem) []semEvent {
	var out []semEvent
	for _, t := range toks {
		strict := false
		if e.everIDs && t.term != tmContent && t.term != tmOpenBrace {
			for _, term := range e.idTerm {
				strict = strict || term == t.term
			}
		}
		if t.term == tmContent || strict {
			if t.text != "" {
				out = append(out, e.emitForState(t.text)...)
			}
			continue
		}
		out = append(out, e.onTerminal(t.term, t.text)...)
	}
	return out
}

// onTerminal is _on_terminal with the mistral transitions.
func (e *engine) onTerminal(term int, value string) []semEvent {
	var next engState
	var evs []evType
	switch {
	case e.state == esContent && term == tmToolCalls:
		next, evs = esToolName, []evType{evCallStart}
	case e.state == esToolName && term == tmArgs:
		next = esToolArgs
	case e.state == esToolName && term == tmOpenBrace:
		next, evs = esToolArgs, []evType{evArg}
	case e.state == esToolArgs && term == tmToolCalls:
		next, evs = esToolName, []evType{evCallEnd, evCallStart}
	case term == tmDrop:
		return nil
	default:
		return e.emitForState(value)
	}
	var out []semEvent
	if e.state == esToolArgs && next != esToolArgs && e.args.Len() > 0 {
		out = append(out, semEvent{evArg, e.args.String(), e.toolIndex})
		e.args.Reset()
	}
	e.state = next
	for _, t := range evs {
		if t == evCallStart {
			e.toolIndex++
		}
		out = append(out, semEvent{t, value, e.toolIndex})
	}
	if next == esToolArgs {
		e.depth, e.inString, e.escapeNxt = 0, false, false
	}
	return out
}

func (e *engine) emitForState(text string) []semEvent {
	switch e.state {
	case esToolArgs:
		// vLLM sends one event per flush; consecutive ones of a call are
		// merged into one delta entry anyway, so they go out as one.
		var sent strings.Builder
		for _, c := range text {
			e.argsChar(c, &sent)
		}
		if sent.Len() == 0 {
			return nil
		}
		return []semEvent{{evArg, sent.String(), e.toolIndex}}
	case esToolName:
		return []semEvent{{evName, text, e.toolIndex}}
	}
	return []semEvent{{evText, text, e.toolIndex}}
}

// argsChar is _feed_args_char: argument text streams as it comes (into
// sent), but a closing brace or bracket that ends the top level is held
// back until another character follows.
func (e *engine) argsChar(c rune, sent *strings.Builder) {
	e.args.WriteRune(c)
	switch {
	case e.escapeNxt:
		e.escapeNxt = false
	case e.inString:
		if c == '\\' {
			e.escapeNxt = true
		} else if c == '"' {
			e.inString = false
		}
	case c == '"':
		e.inString = true
	case c == '{' || c == '[':
		e.depth++
	case c == '}' || c == ']':
		if e.depth > 0 {
			e.depth--
		}
		if e.depth == 0 {
			return
		}
	}
	sent.WriteString(e.args.String())
	e.args.Reset()
}
