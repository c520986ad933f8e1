// Package jsonscan reads JSON text by hand where encoding/json would cost a
// second pass, and matches object member names exactly: the one scanner of
// the request envelope (go/plane) and of the OpenAI request bodies
// (go/frontend), the whitespace skipper and literal matcher of the token
// schema's fast path (go/tokens), the one test of a value absent or
// null (IsNull), and the one writer of a float as Python writes it
// (PyFloat), for the text that must read as a Python server's.
//
// encoding/json matches a member's name to a field without regard to case,
// with Unicode folding (the Kelvin sign matches k, the long s matches s), and
// the last of several matches wins. A reader in front of ours that matches
// names exactly (most do) would read {"max_tokens": 1, "MAX_TOKENS": 7} as
// max_tokens 1 and encoding/json as 7. Keys finds the names on which the two
// readers disagree.
//
// Guarantees:
//
//   - SkipSpace, StringEnd, HasAt, Expect and IsNull are defined on any
//     input: they never index outside b.
//   - SkipValue, Object (and Members.Next) and Keys.Check require valid
//     JSON (json.Valid); on it they split values exactly where
//     encoding/json does, and they never allocate (Check, only to decode a
//     name written with escapes).
//   - Keys.Match and Keys.Check report every member name that a reader
//     matching names exactly reads differently from encoding/json: a name
//     that is not a key but equals one up to case (strings.EqualFold), and
//     a key named twice in one object. Names that are neither are ignored,
//     as encoding/json ignores them.
//
// It imports nothing of this project's: it sits at the bottom of the layers
// (docs/architecture.md).
package jsonscan

import "bytes"

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace (len(b) if there is none).
func SkipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// Trim returns b without the JSON whitespace at either end.
func Trim(b []byte) []byte {
	b = b[SkipSpace(b, 0):]
	j := len(b)
	for j > 0 && isSpace(b[j-1]) {
		j--
	}
	return b[:j]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// HasAt reports whether b holds lit at index i.
func HasAt(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

// Expect reads each of lits in turn from i, with JSON whitespace around
// each: the index after the last (and the whitespace after it), or false.
func Expect(b []byte, i int, lits ...string) (int, bool) {
	for _, s := range lits {
		i = SkipSpace(b, i)
		if !HasAt(b, i, s) {
			return i, false
		}
		i = SkipSpace(b, i+len(s))
	}
	return i, true
}

// IsNull reports whether b, a JSON value as encoding/json hands it over
// (json.RawMessage), is absent or null: nothing but JSON whitespace, or
// null with JSON whitespace around it.
func IsNull(b []byte) bool {
	i := SkipSpace(b, 0)
	return i == len(b) || (HasAt(b, i, "null") && SkipSpace(b, i+len("null")) == len(b))
}

// StringEnd returns the index of the quote that closes the string whose
// contents start at b[from] (just after its opening quote), and whether the
// string holds escapes. Where b is not valid JSON and no quote closes the
// string, it returns len(b)-1 and true.
func StringEnd(b []byte, from int) (end int, escaped bool) {
	q := bytes.IndexByte(b[from:], '"')
	if q < 0 {
		return len(b) - 1, true
	}
	e := bytes.IndexByte(b[from:from+q], '\\')
	if e < 0 {
		return from + q, false
	}
	for i := from + e; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++ // the escaped byte (a \uXXXX's digits are no quotes)
		case '"':
			return i, true
		}
	}
	return len(b) - 1, true
}

// SkipValue returns the index just past the JSON value that starts at b[i],
// b being valid JSON (json.Valid).
func SkipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		end, _ := StringEnd(b, i+1)
		return end + 1
	case '{', '[':
		depth := 0
		for ; ; i++ {
			c := b[i]
			if !structural[c] {
				continue
			}
			switch c {
			case '"':
				i, _ = StringEnd(b, i+1) // the closing quote
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	default: // a number, true, false or null
		for ; i < len(b); i++ {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
		}
		return i
	}
}

// structural marks the bytes that SkipValue looks for inside an object or
// an array (a table lookup costs less than a switch on each byte).
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// Members walks the members of one JSON object, in order (Object).
type Members struct {
	b []byte
	i int // the next member's name, or the object's closing brace
}

// Member is one member of an object, as written.
type Member struct {
	// Name is the bytes between the name's quotes, escapes as written.
	Name []byte
	// Escaped says whether Name holds escapes (then it is not the name
	// itself, which only decoding it gives).
	Escaped bool
	// Value is the member's value, without the whitespace around it.
	Value []byte
}

// Object returns the members of the object that b holds, b being valid JSON
// (json.Valid); false if b holds another value.
func Object(b []byte) (Members, bool) {
	i := SkipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return Members{}, false
	}
	return Members{b: b, i: SkipSpace(b, i+1)}, true
}

// Next returns the next member, or false after the last.
func (m *Members) Next() (Member, bool) {
	b, i := m.b, m.i
	if i >= len(b) || b[i] != '"' {
		return Member{}, false // '}', or the zero Members
	}
	end, escaped := StringEnd(b, i+1)
	name := b[i+1 : end]
	i = SkipSpace(b, SkipSpace(b, end+1)+1) // past ':'
	end = SkipValue(b, i)
	value := b[i:end]
	i = SkipSpace(b, end)
	if b[i] == ',' {
		i = SkipSpace(b, i+1)
	}
	m.i = i
	return Member{Name: name, Escaped: escaped, Value: value}, true
}
