package reasoning

import (
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/anchorsplit"
)

// item is what the scanner hands the lexer: a chunk of text (with the count
// of model tokens it came from) or a terminal recognized by its token id.
type item struct {
	term  string // "" for a text chunk
	text  string
	count int
}

// scanner finds the engine's token-id terminals in a streamed piece and
// splits the piece's text around them, as vLLM's TokenIDScanner does. When
// a terminal's text has not arrived yet (held back by the detokenizer), the
// terminal waits for it.
type scanner struct {
	idTerm map[int]string // token id -> terminal
	idText map[int]string // token id -> the token's text

	deferred       []item
	deferredPrefix []int
	trailing       int
	post           string
}

func (s *scanner) reset() {
	s.deferred = s.deferred[:0]
	s.deferredPrefix = s.deferredPrefix[:0]
	s.trailing = 0
	s.post = ""
}

func (s *scanner) scan(text string, ids []int) []item {
	var prefix []item
	eff := text
	trailing := 0
	if len(s.deferred) > 0 {
		prefix, eff, trailing = s.resolve(text, len(ids))
	}
	special := false
	for _, id := range ids {
		if _, ok := s.idTerm[id]; ok {
			special = true
			break
		}
	}
	if !special {
		if eff != "" {
			if len(prefix) == 0 {
				return []item{{text: eff, count: len(ids)}}
			}
			prefix = append(prefix, item{text: eff, count: trailing + len(ids)})
		}
		return prefix
	}

	// The piece's tokens: runs of plain tokens between terminals.
	var results []item
	plain, run := false, 0
	for _, id := range ids {
		if term, ok := s.idTerm[id]; ok {
			if run > 0 {
				results = append(results, item{count: run})
				run = 0
			}
			results = append(results, item{term: term, text: s.idText[id]})
			continue
		}
		plain = true
		run++
	}
	if run > 0 {
		results = append(results, item{count: run})
	}
	if trailing > 0 {
		results = append([]item{{count: trailing}}, results...)
	}
	if eff == "" {
		// No text to place the terminals in yet: they wait for it.
		n := 0
		for _, r := range results {
			if r.term == "" {
				n += r.count
				continue
			}
			s.deferred = append(s.deferred, r)
			s.deferredPrefix = append(s.deferredPrefix, n)
			n = 0
		}
		s.trailing += n
		return prefix
	}
	return append(prefix, s.place(eff, results, plain)...)
}

// place splits text around the piece's terminals. A piece of terminals
// alone is matched whole (text before it is held-back text); otherwise the
// terminals anchor the split, rightmost first.
func (s *scanner) place(text string, results []item, plain bool) []item {
	if !plain {
		var whole strings.Builder
		for _, r := range results {
			whole.WriteString(r.text)
		}
		switch pos := strings.Index(text, whole.String()); {
		case whole.Len() == 0:
			return append([]item{{text: text}}, results...)
		case pos > 0:
			return append([]item{{text: text[:pos]}}, results...)
		case pos == 0:
			return results
		}
	}
	return s.anchor(text, results)
}

func (s *scanner) anchor(text string, results []item) []item {
	var anchors []item
	counts := []int{0}
	for _, r := range results {
		if r.term != "" {
			anchors = append(anchors, r)
			counts = append(counts, 0)
			continue
		}
		counts[len(counts)-1] += r.count
	}
	if len(anchors) == 0 {
		return []item{{text: text}}
	}
	texts := make([]string, len(anchors))
	for i, a := range anchors {
		texts[i] = a.text
	}
	parts, deferred, post := anchorsplit.Split(text, texts, func(i int) bool { return anchors[i].term == dropTerm })
	var out []item
	for _, p := range parts {
		if p.Anchor {
			out = append(out, anchors[p.Index])
		} else {
			out = append(out, item{text: p.Text, count: counts[p.Index]})
		}
	}
	for _, i := range deferred {
		s.deferred = append(s.deferred, anchors[i])
		s.deferredPrefix = append(s.deferredPrefix, counts[i])
	}
	s.post += post
	return out
}

// resolve places terminals that waited for their text in the new text.
func (s *scanner) resolve(text string, n int) ([]item, string, int) {
	deferred, prefix, trailing := s.deferred, s.deferredPrefix, s.trailing
	s.deferred, s.deferredPrefix, s.trailing = nil, nil, 0
	rest := text
	if s.post != "" {
		rest = s.post + rest
		s.post = ""
	}
	var out []item
	for i, t := range deferred {
		c := prefix[i]
		switch pos := strings.Index(rest, t.text); {
		case pos > 0:
			out = append(out, item{text: rest[:pos], count: c}, t)
			rest = rest[pos+len(t.text):]
		case pos == 0:
			out = append(out, t)
			rest = rest[len(t.text):]
		default:
			if rest != "" {
				s.post += rest
				c += n
				rest = ""
			}
			s.deferred = append(s.deferred, t)
			s.deferredPrefix = append(s.deferredPrefix, c)
		}
	}
	if len(s.deferred) > 0 {
		s.trailing = trailing
		trailing = 0
	}
	return out, rest, trailing
}

// flush hands over what still waits, at the end of the stream.
func (s *scanner) flush() []item {
	if len(s.deferred) == 0 && s.post == "" {
		return nil
	}
	var out []item
	if s.post != "" {
		c := 0
		if len(s.deferredPrefix) > 0 {
			c = s.deferredPrefix[0]
		}
		out = append(out, item{text: s.post, count: c})
		s.post = ""
	}
	out = append(out, s.deferred...)
	if s.trailing > 0 {
		out = append(out, item{count: s.trailing})
	}
	s.reset()
	return out
}
