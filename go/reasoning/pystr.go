package reasoning

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Python's str works in code points; these helpers index a Go string the
// same way (an invalid byte counts as one code point).

func runeLen(s string) int { return utf8.RuneCountInString(s) }

// pyFind is str.find: the code point index of sub in s, or -1.
func pyFind(s, sub string) int {
	i := strings.Index(s, sub)
	if i < 0 {
		return -1
	}
	return runeLen(s[:i])
}

// pySlice is s[i:j] (s[i:] when toEnd) with Python's negative indices and
// clamping.
func pySlice(s string, i, j int, toEnd bool) string {
	n := runeLen(s)
	if toEnd {
		j = n
	}
	norm := func(k int) int {
		if k < 0 {
			k += n
		}
		return max(0, min(k, n))
	}
	i, j = norm(i), norm(j)
	if i >= j {
		return ""
	}
	return s[byteAt(s, i):byteAt(s, j)]
}

// byteAt is the byte offset of code point k of s.
func byteAt(s string, k int) int {
	b := 0
	for ; k > 0 && b < len(s); k-- {
		_, w := utf8.DecodeRuneInString(s[b:])
		b += w
	}
	return b
}

// pyStrip is str.strip(): s without leading and trailing whitespace, as
// Python's str.isspace sees it.
func pyStrip(s string) string {
	return strings.TrimFunc(s, pySpace)
}

func pySpace(r rune) bool {
	switch {
	case r >= '\t' && r <= '\r', r >= 0x1c && r <= 0x20, r == 0x85, r == 0xa0,
		r == 0x1680, r >= 0x2000 && r <= 0x200a, r == 0x2028, r == 0x2029,
		r == 0x202f, r == 0x205f, r == 0x3000:
		return true
	}
	return false
}

// truthy is Python's bool() of a JSON value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case float64:
		return x != 0
	case float32:
		return x != 0
	case int:
		return x != 0
	case int64:
		return x != 0
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return err != nil || f != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
