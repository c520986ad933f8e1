package tokenizer

import "unicode/utf8"

// Built-in scanners for the pre-tokenization regexes of the common model
// families. Each is an exact, linear-time re-statement of how the regex
// engine resolves its alternation (first alternative that matches, greedy
// quantifiers with backtracking), so they need no timeout. Every position
// of the input starts a non-empty match, so the matches tile the input.

// The GPT-2 pattern, also the one the ByteLevel pre-tokenizer applies.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// The Llama-3 pattern, and the Qwen2 one (single digits).
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

func builtinScanner(pat string) matcher {
	switch pat {
	case gpt2Pattern:
		return scanMatcher{gpt2Next}
	case llama3Pattern:
		return scanMatcher{func(s string, i int) int { return llamaNext(s, i, 3) }}
	case qwen2Pattern:
		return scanMatcher{func(s string, i int) int { return llamaNext(s, i, 1) }}
	}
	return nil
}

type scanMatcher struct {
	next func(s string, i int) int // end of the match starting at i (> i)
}

func (m scanMatcher) findAll(s string, fn func(start, end int) error) error {
	for i := 0; i < len(s); {
		e := m.next(s, i)
		if err := fn(i, e); err != nil {
			return err
		}
		i = e
	}
	return nil
}

func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// isOtherClass is [^\s\p{L}\p{N}].
func isOtherClass(r rune) bool { return !isWhitespace(r) && !isLetter(r) && !isNumber(r) }

// runEnd is the end of the run of characters accepted by pred from i.
func runEnd(s string, i int, pred func(rune) bool) int {
	for i < len(s) {
		r, w := runeAt(s, i)
		if !pred(r) {
			break
		}
		i += w
	}
	return i
}

// spaceEnd resolves `\s+(?!\S)|\s+` at i, where s[i] is whitespace.
func spaceEnd(s string, i int) int {
	j := runEnd(s, i, isWhitespace)
	if j == len(s) {
		return j
	}
	// Give back the last whitespace character, if that leaves one.
	_, w := utf8.DecodeLastRuneInString(s[:j])
	if j-w > i {
		return j - w
	}
	return j
}

func gpt2Next(s string, i int) int {
	c, w := runeAt(s, i)
	if c == '\'' && i+1 < len(s) {
		switch s[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(s) && s[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(s) && s[i+2] == 'l' {
				return i + 3
			}
		}
	}
	// ` ?X+` for X = \p{L}, \p{N}, [^\s\p{L}\p{N}], in that order.
	for _, class := range [...]func(rune) bool{isLetter, isNumber, isOtherClass} {
		j := i
		if c == ' ' {
			j = i + 1
		}
		if j < len(s) {
			if r, _ := runeAt(s, j); class(r) {
				return runEnd(s, j, class)
			}
		}
	}
	if isWhitespace(c) {
		return spaceEnd(s, i)
	}
	return i + w // unreachable: every character is in one class
}

// foldASCII is the case folding of the contraction letters: their ASCII
// cases, and U+017F (long s), which folds to s.
func foldASCII(r rune) rune {
	switch {
	case 'A' <= r && r <= 'Z':
		return r + 'a' - 'A'
	case r == 0x17F:
		return 's'
	}
	return r
}

func llamaNext(s string, i, maxDigits int) int {
	c, w := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if c == '\'' && i+1 < len(s) {
		r1, w1 := runeAt(s, i+1)
		switch foldASCII(r1) {
		case 's', 't', 'm', 'd':
			return i + 1 + w1
		case 'r', 'v':
			if j := i + 1 + w1; j < len(s) {
				if r2, w2 := runeAt(s, j); foldASCII(r2) == 'e' {
					return j + w2
				}
			}
		case 'l':
			if j := i + 1 + w1; j < len(s) {
				if r2, w2 := runeAt(s, j); foldASCII(r2) == 'l' {
					return j + w2
				}
			}
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isLetter(c) {
		return runEnd(s, i+w, isLetter)
	}
	num := isNumber(c)
	if c != '\r' && c != '\n' && !num && i+w < len(s) {
		if r, _ := runeAt(s, i+w); isLetter(r) {
			return runEnd(s, i+w, isLetter)
		}
	}
	// \p{N}{1,maxDigits}
	if num {
		j := i + w
		for n := 1; n < maxDigits && j < len(s); n++ {
			r, w2 := runeAt(s, j)
			if !isNumber(r) {
				break
			}
			j += w2
		}
		return j
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if c == ' ' {
		j = i + 1
	}
	if j < len(s) {
		if r, _ := runeAt(s, j); isOtherClass(r) {
			k := runEnd(s, j, isOtherClass)
			for k < len(s) && (s[k] == '\r' || s[k] == '\n') {
				k++
			}
			return k
		}
	}
	// \s*[\r\n]+ : up to the last CR/LF of the whitespace run.
	if isWhitespace(c) {
		e := runEnd(s, i, isWhitespace)
		for k := e - 1; k >= i; k-- {
			if s[k] == '\r' || s[k] == '\n' {
				return k + 1
			}
		}
		return spaceEnd(s, i)
	}
	return i + w // unreachable
}

// Word-class runs of the Whitespace pre-tokenizer (`\w+|[^\w\s]+`, the
// whitespace between them removed).
func whitespaceSplit(s string, emit func(start, end int) error) error {
	for i := 0; i < len(s); {
		r, w := runeAt(s, i)
		var e int
		switch {
		case isWordChar(r):
			e = runEnd(s, i+w, isWordChar)
		case !isWhitespace(r):
			e = runEnd(s, i+w, func(r rune) bool { return !isWordChar(r) && !isWhitespace(r) })
		default:
			i += w
			continue
		}
		if err := emit(i, e); err != nil {
			return err
		}
		i = e
	}
	return nil
}
