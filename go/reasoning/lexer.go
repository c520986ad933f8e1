package reasoning

import "strings"

// contentTerm names a lexer token that is plain text, not a terminal.
const contentTerm = ""

// dropTerm is the terminal of a special token the engine drops.
const dropTerm = "DROP"

// lit is one literal terminal of the engine's lexer.
type lit struct{ text, name string }

// shape is what the lexer derives once from its literals.
type shape struct {
	lits     []lit
	first    [256]bool       // bytes a literal starts with
	prefixes map[string]bool // proper prefixes of the literals
	longest  int
}

func newShape(lits []lit) *shape {
	s := &shape{lits: lits, prefixes: map[string]bool{}}
	for _, l := range lits {
		if l.text == "" {
			continue
		}
		s.first[l.text[0]] = true
		s.longest = max(s.longest, len(l.text))
		for i := 1; i < len(l.text); i++ {
			s.prefixes[l.text[:i]] = true
		}
	}
	return s
}

// hasFirst reports whether text holds a byte some literal starts with.
func (s *shape) hasFirst(text string) bool {
	for i := 0; i < len(text); i++ {
		if s.first[text[i]] {
			return true
		}
	}
	return false
}

// lexTok is a lexer token: a terminal or a run of content, with the count
// of model tokens its text came from.
type lexTok struct {
	term  string
	value string
	count int
}

// lexer splits streamed text into literal terminals and content, holding
// back text that may yet become a terminal, as vLLM's IncrementalLexer
// does (its terminals here are all literals).
type lexer struct {
	sh     *shape
	buf    string
	counts []int // model tokens per byte of buf, all on a chunk's first byte
	at     int   // while draining: how much of buf is consumed
}

func (l *lexer) reset() {
	l.buf = ""
	l.counts = l.counts[:0]
}

func (l *lexer) feed(text string, count int) []lexTok {
	if l.buf == "" && !l.sh.hasFirst(text) {
		return []lexTok{{term: contentTerm, value: text, count: count}}
	}
	l.buf += text
	for i := 0; i < len(text); i++ {
		c := 0
		if i == 0 {
			c = count
		}
		l.counts = append(l.counts, c)
	}
	return l.drain(false)
}

func (l *lexer) flush() []lexTok {
	var toks []lexTok
	if l.buf != "" {
		toks = l.drain(true)
	}
	if l.buf != "" {
		l.at = 0
		toks = append(toks, l.take(contentTerm, len(l.buf)))
		l.compact()
	}
	return toks
}

// take makes a token of the next n bytes.
func (l *lexer) take(term string, n int) lexTok {
	sum := 0
	for _, c := range l.counts[l.at : l.at+n] {
		sum += c
	}
	t := lexTok{term: term, value: l.buf[l.at : l.at+n], count: sum}
	l.at += n
	return t
}

// compact drops what was consumed.
func (l *lexer) compact() {
	l.buf = l.buf[l.at:]
	l.counts = append(l.counts[:0], l.counts[l.at:]...)
	l.at = 0
}

func (l *lexer) drain(final bool) []lexTok {
	var toks []lexTok
	l.at = 0
	defer l.compact()
	for l.at < len(l.buf) {
		rest := l.buf[l.at:]
		if !l.sh.hasFirst(rest) {
			toks = append(toks, l.take(contentTerm, len(rest)))
			break
		}
		best := -1
		for i, c := range l.sh.lits {
			if c.text != "" && strings.HasPrefix(rest, c.text) &&
				(best < 0 || len(c.text) > len(l.sh.lits[best].text)) {
				best = i
			}
		}
		if !final && len(rest) < l.sh.longest && l.sh.prefixes[rest] {
			if best < 0 || l.longerThan(rest, best) {
				break // wait: the next text decides
			}
		}
		if best >= 0 {
			toks = append(toks, l.take(l.sh.lits[best].name, len(l.sh.lits[best].text)))
			continue
		}
		toks = append(toks, l.take(contentTerm, l.contentEnd(rest)))
	}
	return toks
}

// longerThan reports whether a literal longer than lits[best] starts with
// the whole of rest.
func (l *lexer) longerThan(rest string, best int) bool {
	n := len(l.sh.lits[best].text)
	for _, c := range l.sh.lits {
		if len(c.text) > n && strings.HasPrefix(c.text, rest) {
			return true
		}
	}
	return false
}

// contentEnd is where, after its first byte, a literal (or the start of
// one, at the end) begins in b; all of b if none does.
func (l *lexer) contentEnd(b string) int {
	for i := 1; i < len(b); i++ {
		if !l.sh.first[b[i]] {
			continue
		}
		rest := b[i:]
		for _, c := range l.sh.lits {
			n := min(len(rest), len(c.text))
			if rest[:n] == c.text[:n] {
				return i
			}
		}
	}
	return len(b)
}
