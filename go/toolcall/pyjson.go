package toolcall

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// This file models the parts of Python's json module and str type that
// vLLM's parsers lean on: json.loads / JSONDecoder.raw_decode (what it
// accepts, where it stops, which error it raises), json.dumps with
// ensure_ascii=False, truthiness, and str.isspace / strip. Indexes are code
// points, as Python's are.

type pyKind uint8

const (
	pyNull pyKind = iota
	pyBool
	pyInt   // text holds the canonical decimal form (Python ints are unbounded)
	pyFloat // f
	pyStr   // text
	pyList  // items
	pyDict  // keys (first-insertion order) and vals
)

// pyValue is a decoded JSON value as Python holds it.
type pyValue struct {
	kind  pyKind
	b     bool
	f     float64
	text  string
	items []*pyValue
	keys  []string
	vals  map[string]*pyValue
}

// get is dict.get: the value under key, or nil.
func (v *pyValue) get(key string) *pyValue {
	if v.kind != pyDict {
		return nil
	}
	return v.vals[key]
}

// has is Python's `key in v` for a dict, list or str; ok is false where
// Python raises TypeError.
func (v *pyValue) has(key string) (in bool, ok bool) {
	switch v.kind {
	case pyDict:
		_, in = v.vals[key]
		return in, true
	case pyList:
		for _, it := range v.items {
			if it.kind == pyStr && it.text == key {
				return true, true
			}
		}
		return false, true
	case pyStr:
		return strings.Contains(v.text, key), true
	}
	return false, false
}

// set is dict item assignment (a new key goes last).
func (v *pyValue) set(key string, val *pyValue) {
	if _, ok := v.vals[key]; !ok {
		v.keys = append(v.keys, key)
	}
	v.vals[key] = val
}

// truthy is Python's bool(v).
func (v *pyValue) truthy() bool {
	switch v.kind {
	case pyBool:
		return v.b
	case pyInt:
		return v.text != "0"
	case pyFloat:
		return v.f != 0
	case pyStr:
		return v.text != ""
	case pyList:
		return len(v.items) > 0
	case pyDict:
		return len(v.keys) > 0
	}
	return false
}

// dumps is json.dumps(v, ensure_ascii=False).
func (v *pyValue) dumps() string {
	var b strings.Builder
	v.dump(&b)
	return b.String()
}

func (v *pyValue) dump(b *strings.Builder) {
	switch v.kind {
	case pyNull:
		b.WriteString("null")
	case pyBool:
		if v.b {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case pyInt:
		b.WriteString(v.text)
	case pyFloat:
		b.WriteString(jsonscan.PyFloat(v.f))
	case pyStr:
		dumpString(b, v.text)
	case pyList:
		b.WriteByte('[')
		for i, it := range v.items {
			if i > 0 {
				b.WriteString(", ")
			}
			it.dump(b)
		}
		b.WriteByte(']')
	case pyDict:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			dumpString(b, k)
			b.WriteString(": ")
			v.vals[k].dump(b)
		}
		b.WriteByte('}')
	}
}

func dumpString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&15])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}

// pyIsSpace is str.isspace for one code point.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// pyStrip, pyRStrip, pyLStrip are str.strip() and friends.
func pyStrip(s string) string  { return strings.TrimFunc(s, pyIsSpace) }
func pyRStrip(s string) string { return strings.TrimRightFunc(s, pyIsSpace) }
func pyLStrip(s string) string { return strings.TrimLeftFunc(s, pyIsSpace) }

// clean makes s valid UTF-8, each bad byte becoming U+FFFD (as Python's
// detokenizer would have shown it).
func clean(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string([]rune(s))
}

// runeLen is len(s) in code points.
func runeLen(s string) int { return utf8.RuneCountInString(s) }

// runeFrom is s[n:] in code points ("" when n is past the end).
func runeFrom(s string, n int) string {
	if n <= 0 {
		return s
	}
	for i := range s {
		if n == 0 {
			return s[i:]
		}
		n--
	}
	return ""
}

// PyDumps is json.dumps(json.loads(text), ensure_ascii=False): the JSON
// text as Python's server writes the value (", " and ": " separators,
// members in their order, floats as Python's repr); ok is false when text
// is not one JSON value. The frontend writes the arguments of tool_choice
// "required" calls with it, as vLLM's server writes them.
func PyDumps(text string) (string, bool) {
	v, err := pyLoads([]rune(text))
	if err != decOK {
		return "", false
	}
	return v.dumps(), true
}
