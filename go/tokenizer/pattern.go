package tokenizer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// matchTimeout bounds one regex match of a pattern that no built-in
// scanner implements, so that a pathological pattern or input cannot hang
// Encode: past it, Encode fails.
const matchTimeout = 2 * time.Second

// matcher finds the matches of a Split/Replace pattern in s in order, as
// the format's regex engine iterates them: leftmost, non-overlapping, and
// an empty match that starts where the previous match ended is skipped
// (the search then resumes one character further).
type matcher interface {
	findAll(s string, fn func(start, end int) error) error
}

// compilePattern builds the matcher of a Split/Replace pattern: a String
// pattern matches literally, a Regex pattern with the format's regex
// semantics. The pre-tokenization patterns of the common model families
// run on built-in scanners that are exact and linear; any other regex runs
// on a backtracking engine bounded by matchTimeout.
func compilePattern(literal bool, pat string) (matcher, error) {
	if literal {
		return literalMatcher{pat}, nil
	}
	if m := builtinScanner(pat); m != nil {
		return m, nil
	}
	tr, err := translateRegex(pat)
	if err != nil {
		return nil, err
	}
	re, err := regexp2.Compile(tr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pat, err)
	}
	re.MatchTimeout = matchTimeout
	return &regexMatcher{re: re, src: pat}, nil
}

// patternJSON is {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p *patternJSON) matcher(kind string) (matcher, error) {
	switch {
	case p == nil:
		return nil, missing(kind, "pattern")
	case p.String != nil && p.Regex == nil:
		return compilePattern(true, *p.String)
	case p.Regex != nil && p.String == nil:
		m, err := compilePattern(false, *p.Regex)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", kind)
}

// translateRegex rewrites the constructs whose meaning differs between
// the format's regexes and the engine used here: `\w` and `\W`, whose word
// characters are the Alphabetic ones, marks, decimal numbers and connector
// punctuation (outside a character class, also the Latin-1 superscripts
// and fractions).
func translateRegex(p string) (string, error) {
	var b strings.Builder
	inClass := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			n := p[i+1]
			switch {
			case n == 'w' && inClass == 0:
				b.WriteString("[" + wordClass(true) + "]")
			case n == 'W' && inClass == 0:
				b.WriteString("[^" + wordClass(true) + "]")
			case n == 'w':
				b.WriteString(wordClass(false))
			case n == 'W':
				return "", fmt.Errorf("regex %q: \\W inside a character class is not supported", p)
			default:
				b.WriteByte(c)
				b.WriteByte(n)
			}
			i++
			continue
		case c == '[':
			if inClass > 0 && i+1 < len(p) && p[i+1] == ':' {
				return "", fmt.Errorf("regex %q: POSIX bracket expressions are not supported", p)
			}
			inClass++
			b.WriteByte(c)
			// A ']' right after '[' or '[^' is a literal.
			if i+1 < len(p) && p[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				b.WriteByte(']')
				i++
			}
			continue
		case c == ']' && inClass > 0:
			inClass--
		case c == '&' && inClass > 0 && i+1 < len(p) && p[i+1] == '&':
			return "", fmt.Errorf("regex %q: character class intersection is not supported", p)
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

var (
	wordClassOnce          sync.Once
	wordInClass, wordAlone string
)

// wordClass is the body of a character class of the word characters.
func wordClass(alone bool) string {
	wordClassOnce.Do(func() {
		inClass := func(r rune) bool {
			return isAlphabetic(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r)
		}
		wordInClass = classBody(inClass)
		wordAlone = classBody(func(r rune) bool {
			return inClass(r) || r == 0xB2 || r == 0xB3 || r == 0xB9 || r == 0xBC || r == 0xBD || r == 0xBE
		})
	})
	if alone {
		return wordAlone
	}
	return wordInClass
}

func classBody(pred func(rune) bool) string {
	var b strings.Builder
	esc := func(r rune) {
		if r < 0x10000 {
			fmt.Fprintf(&b, "\\u%04X", r)
		} else {
			b.WriteRune(r)
		}
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !pred(r) {
			continue
		}
		lo := r
		for r+1 <= unicode.MaxRune && pred(r+1) {
			r++
		}
		esc(lo)
		if r > lo {
			b.WriteByte('-')
			esc(r)
		}
	}
	return b.String()
}

// matchLoop drives next (the first match at or after a byte offset) with
// the iteration rules documented on matcher.
func matchLoop(s string, next func(from int) (int, int, bool, error), fn func(start, end int) error) error {
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(s) {
		st, en, ok, err := next(lastEnd)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if st == en && en == lastMatchEnd {
			if lastEnd < len(s) {
				_, w := utf8.DecodeRuneInString(s[lastEnd:])
				lastEnd += w
			} else {
				lastEnd++
			}
			continue
		}
		lastEnd, lastMatchEnd = en, en
		if err := fn(st, en); err != nil {
			return err
		}
	}
	return nil
}

type literalMatcher struct{ lit string }

func (m literalMatcher) findAll(s string, fn func(start, end int) error) error {
	if m.lit != "" {
		for from := 0; ; {
			i := strings.Index(s[from:], m.lit)
			if i < 0 {
				return nil
			}
			st := from + i
			from = st + len(m.lit)
			if err := fn(st, from); err != nil {
				return err
			}
		}
	}
	// The empty pattern matches at every character boundary.
	return matchLoop(s, func(from int) (int, int, bool, error) { return from, from, true, nil }, fn)
}

type regexMatcher struct {
	re  *regexp2.Regexp
	src string
}

var errRegexTimeout = errors.New("regex match timed out")

func (m *regexMatcher) findAll(s string, fn func(start, end int) error) error {
	runes := []rune(s)
	// byteAt converts rune indices to byte offsets; queries only move forward
	// (or repeat), so a cursor suffices.
	ri, bi := 0, 0
	byteAt := func(r int) int {
		if r < ri {
			ri, bi = 0, 0
		}
		for ri < r {
			bi += utf8.RuneLen(runes[ri])
			ri++
		}
		return bi
	}
	lastEnd, lastMatchEnd := 0, -1
	for lastEnd <= len(runes) {
		mt, err := m.re.FindRunesMatchStartingAt(runes, lastEnd)
		if err != nil {
			return fmt.Errorf("pattern %q: %w", m.src, errRegexTimeout)
		}
		if mt == nil {
			return nil
		}
		st, en := mt.Index, mt.Index+mt.Length
		if st == en && en == lastMatchEnd {
			lastEnd++
			continue
		}
		lastEnd, lastMatchEnd = en, en
		bs := byteAt(st)
		be := byteAt(en)
		if err := fn(bs, be); err != nil {
			return err
		}
	}
	return nil
}

// charMatcher matches every single character pred accepts.
type charMatcher struct{ pred func(rune) bool }

func (m charMatcher) findAll(s string, fn func(start, end int) error) error {
	for i := 0; i < len(s); {
		r, w := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, w = utf8.DecodeRuneInString(s[i:])
		}
		if m.pred(r) {
			if err := fn(i, i+w); err != nil {
				return err
			}
		}
		i += w
	}
	return nil
}

// behavior is how a Split turns matches into pieces.
type behavior uint8

const (
	behRemoved behavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("unsupported split behavior %q", s)
}

// splitWith emits, in order, the byte ranges of s that splitting it on the
// matches of m with behavior b produces (empty ranges included; callers
// drop them). invert swaps matches and the text between them.
func splitWith(s string, m matcher, invert bool, b behavior, emit func(start, end int) error) error {
	if s == "" {
		return nil
	}
	g := segmenter{b: b, emit: emit}
	prev := 0
	err := m.findAll(s, func(st, en int) error {
		if prev != st {
			if err := g.add(prev, st, invert); err != nil {
				return err
			}
		}
		prev = en
		return g.add(st, en, !invert)
	})
	if err != nil {
		return err
	}
	if prev != len(s) {
		if err := g.add(prev, len(s), invert); err != nil {
			return err
		}
	}
	return g.flush()
}

// segmenter applies a behavior to the stream of (range, is-match)
// segments that cover a string, holding back at most one piece.
type segmenter struct {
	b         behavior
	emit      func(start, end int) error
	has       bool // a piece is held back
	ps, pe    int
	prevMatch bool
}

func (g *segmenter) flush() error {
	if !g.has {
		return nil
	}
	g.has = false
	return g.emit(g.ps, g.pe)
}

func (g *segmenter) hold(st, en int) error {
	err := g.flush()
	g.has, g.ps, g.pe = true, st, en
	return err
}

func (g *segmenter) add(st, en int, match bool) error {
	switch g.b {
	case behRemoved:
		if match {
			return nil
		}
		return g.emit(st, en)
	case behIsolated:
		return g.emit(st, en)
	case behContiguous:
		defer func() { g.prevMatch = match }()
		if g.has && match == g.prevMatch {
			g.pe = en
			return nil
		}
		return g.hold(st, en)
	case behMergedWithPrevious:
		defer func() { g.prevMatch = match }()
		if match && !g.prevMatch && g.has {
			g.pe = en
			return nil
		}
		return g.hold(st, en)
	default: // behMergedWithNext: a match joins the non-match after it
		if g.has {
			if !match {
				g.has = false
				return g.emit(g.ps, en)
			}
			return g.hold(st, en)
		}
		if match {
			g.has, g.ps, g.pe = true, st, en
			return nil
		}
		return g.emit(st, en)
	}
}
