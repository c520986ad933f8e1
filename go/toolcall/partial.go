package toolcall

// This file reproduces the partial_json_parser package (0.2.1.1.post7) that
// vLLM's llama3_json parser uses to read JSON still being generated: it
// closes what is open (strings, arrays, objects) and drops what cannot be
// closed, by the package's own heuristics, quirks included, so that what it
// yields is what vLLM streams. Only the two allowances vLLM passes are
// modelled: everything, and everything but partial strings.

type perr uint8

const (
	pOK      perr = iota
	pIndex        // Python's IndexError: caught by the enclosing array/object
	pBad          // MalformedJSON or AssertionError: fails the whole parse
	pPartial      // PartialJSON
)

// cres is a completion: the first n code points are kept and tail appended;
// done is Python's True (nothing to append). none is Python's False.
type cres struct {
	none bool
	n    int
	done bool
	tail string
}

type partialParser struct {
	allowStr bool
	depth    int
}

// at is s[k] with Python's negative indexes.
func at(s []rune, k int) (rune, bool) {
	if k < 0 {
		k += len(s)
	}
	if k < 0 || k >= len(s) {
		return 0, false
	}
	return s[k], true
}

// pyIdx turns a Python slice bound into a Go one.
func pyIdx(n, k int) int {
	if k < 0 {
		k += n
		if k < 0 {
			return 0
		}
	}
	if k > n {
		return n
	}
	return k
}

// rfind is s.rfind(sub, start, end) for a one- or two-rune sub.
func rfind(s []rune, sub string, start, end int) int {
	start, end = pyIdx(len(s), start), pyIdx(len(s), end)
	r := []rune(sub)
	for i := end - len(r); i >= start; i-- {
		if s[i] == r[0] && (len(r) == 1 || s[i+1] == r[1]) {
			return i
		}
	}
	return -1
}

func skipBlank(s []rune, i int) int {
	for i < len(s) && pyIsSpace(s[i]) {
		i++
	}
	return i
}

func hasPrefix(s []rune, p string) bool {
	r := []rune(p)
	if len(s) < len(r) {
		return false
	}
	for i := range r {
		if s[i] != r[i] {
			return false
		}
	}
	return true
}

// isPrefixOf is word.startswith(s).
func isPrefixOf(s []rune, word string) bool {
	w := []rune(word)
	if len(s) > len(w) {
		return false
	}
	for i := range s {
		if s[i] != w[i] {
			return false
		}
	}
	return true
}

func stripRunes(s []rune) []rune {
	i, j := 0, len(s)
	for i < j && pyIsSpace(s[i]) {
		i++
	}
	for j > i && pyIsSpace(s[j-1]) {
		j--
	}
	return s[i:j]
}

// escapedBefore counts the backslashes right before index i.
func escapedBefore(s []rune, i int) int {
	n := 0
	for k := i - 1; k >= 0 && s[k] == '\\'; k-- {
		n++
	}
	return n
}

// literals are checked in this order; a partial one is always allowed
// (only partial strings are ever disallowed).
var literals = []string{"null", "true", "false", "Infinity"}

func (p *partialParser) any(s []rune, top bool) (cres, perr) {
	i := skipBlank(s, 0)
	if i >= len(s) {
		return cres{}, pIndex
	}
	switch c := s[i]; {
	case c == '"':
		return p.str(s)
	case c >= '0' && c <= '9':
		return p.num(s, top)
	case c == '[':
		return p.nested(s, false)
	case c == '{':
		return p.nested(s, true)
	}
	for _, w := range literals {
		if hasPrefix(s, w) {
			return cres{n: len(w), done: true}, pOK
		}
		if isPrefixOf(s, w) {
			return cres{tail: w}, pOK
		}
	}
	if s[i] == '-' {
		if len(s) == 1 {
			return cres{none: true}, pOK
		} else if s[1] != 'I' {
			return p.num(s, top)
		}
	}
	for _, w := range []string{"-Infinity", "NaN"} {
		if hasPrefix(s, w) {
			return cres{n: len(w), done: true}, pOK
		}
		if isPrefixOf(s, w) {
			return cres{tail: w}, pOK
		}
	}
	return cres{}, pBad
}

func (p *partialParser) str(s []rune) (cres, perr) {
	if len(s) == 0 {
		return cres{}, pIndex
	}
	if s[0] != '"' {
		return cres{}, pBad
	}
	i := 1
	for i < len(s) {
		switch s[i] {
		case '\\':
			if i+1 == len(s) {
				goto partial
			}
			i += 2
			continue
		case '"':
			return cres{n: i + 1, done: true}, pOK
		}
		i++
	}
partial:
	if !p.allowStr {
		return cres{none: true}, pOK
	}
	for _, esc := range []struct {
		seq  string
		back int
	}{{`\u`, 5}, {`\U`, 9}, {`\x`, 3}} {
		lo := i - esc.back
		if lo < 0 {
			lo = 0
		}
		if k := rfind(s, esc.seq, lo, i); k != -1 && escapedBefore(s, k)%2 == 0 {
			return cres{n: k, tail: `"`}, pOK
		}
	}
	return cres{n: i, tail: `"`}, pOK
}

func inNumSet(r rune, withDigits bool) bool {
	switch r {
	case '.', '-', '+', 'e', 'E':
		return true
	}
	return withDigits && r >= '0' && r <= '9'
}

func (p *partialParser) num(s []rune, top bool) (cres, perr) {
	i := 1
	for i < len(s) && inNumSet(s[i], true) {
		i++
	}
	modified := false
	for {
		c, ok := at(s, i-1)
		if !ok {
			return cres{}, pIndex
		}
		if !inNumSet(c, false) {
			break
		}
		modified = true
		i--
	}
	if modified || (i == len(s) && !top) {
		return cres{n: i}, pOK // NUM is always allowed here
	}
	return cres{n: i, done: true}, pOK
}

// nested completes an array or an object.
func (p *partialParser) nested(s []rune, obj bool) (res cres, e perr) {
	if p.depth++; p.depth > maxDepth {
		return cres{}, pBad
	}
	defer func() { p.depth-- }()
	open, closer := '[', "]"
	if obj {
		open, closer = '{', "}"
	}
	if s[0] != open {
		return cres{}, pBad
	}
	res, e = p.members(s, obj, closer)
	if e == pIndex {
		return cres{n: res.n, tail: closer}, pOK
	}
	return res, e
}

// members walks a container's members; on pIndex, res.n is Python's i.
func (p *partialParser) members(s []rune, obj bool, closer string) (cres, perr) {
	i, j := 1, 1
	end := rune(closer[0])
	for {
		j = skipBlank(s, j)
		if j >= len(s) {
			return cres{n: i}, pIndex
		}
		if s[j] == end {
			return cres{n: j + 1, done: true}, pOK
		}
		if obj {
			k, e := p.str(s[j:])
			if e == pIndex {
				return cres{n: i}, pIndex
			} else if e != pOK {
				return cres{}, e
			}
			if k.none || !k.done {
				return cres{n: i, tail: closer}, pOK
			}
			j = skipBlank(s, j+k.n)
			if j >= len(s) {
				return cres{n: i}, pIndex
			}
			if s[j] != ':' {
				return cres{}, pBad
			}
			j = skipBlank(s, j+1)
		}
		r, e := p.any(s[j:], false)
		if e == pIndex {
			return cres{n: i}, pIndex
		} else if e != pOK {
			return cres{}, e
		}
		if r.none {
			return cres{n: i, tail: closer}, pOK
		}
		if !r.done {
			return cres{n: j + r.n, tail: r.tail + closer}, pOK
		}
		j += r.n
		i = j
		j = skipBlank(s, j)
		if j >= len(s) {
			return cres{n: i}, pIndex
		}
		switch s[j] {
		case ',':
			j++
		case end:
			return cres{n: j + 1, done: true}, pOK
		default:
			return cres{}, pBad
		}
	}
}

// fix is the package's _fix: complete the stripped text, slice the
// original (as it does). ok false is any failure.
func (p *partialParser) fix(s []rune, top bool) (head, tail []rune, ok bool) {
	r, e := p.any(stripRunes(s), top)
	if e != pOK || r.none {
		return nil, nil, false
	}
	n := pyIdx(len(s), r.n)
	return s[:n], []rune(r.tail), true
}
