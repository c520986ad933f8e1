package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"
)

// encoding/json matches an object's keys to fields without regard to case,
// with Unicode folding (the Kelvin sign matches k, the long s matches s),
// and the last of several matches wins. A gateway in front of the frontend
// that enforces a policy with an exact-key parser (most are) would read
// {"max_tokens": 1, "MAX_TOKENS": 7} as max_tokens 1 and the frontend as 7.
// checkKeys refuses such bodies: a key that is not one of the request's
// field names but folds to one, and a field name given twice in one object.

// requestKeys are the field names of the request types, at every depth, and
// of the chat content parts (read from a json.RawMessage in chatText).
var requestKeys = func() map[string]int {
	keys := map[string]int{}
	add := func(name string) {
		if _, ok := keys[name]; !ok {
			keys[name] = len(keys)
		}
	}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			add(name)
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[completionRequest]())
	add("type") // content parts: {"type": "text", "text": ...}
	add("text")
	if len(keys) > 64*len(keySet{}) {
		panic("frontend: more request keys than keySet holds")
	}
	return keys
}()

// foldedKeys maps each request key's folded form (foldASCII) to the key.
var foldedKeys, maxKeyLen = func() (map[string]string, int) {
	m, longest := map[string]string{}, 0
	for k := range requestKeys {
		f, _ := foldASCII(nil, []byte(k))
		m[string(f)] = k
		longest = max(longest, len(k))
	}
	return m, longest
}()

// foldASCII appends key in upper case, and reports whether it may fold
// (strings.EqualFold) to an ASCII name at all: the only runes outside ASCII
// that fold to ASCII ones are the Kelvin sign (k) and the long s (s).
func foldASCII(out, key []byte) ([]byte, bool) {
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(key[i:])
		switch r {
		case '\u212a':
			out = append(out, 'K')
		case '\u017f':
			out = append(out, 'S')
		default:
			return out, false
		}
		i += size
	}
	return out, true
}

// keySet is a set of requestKeys, by index.
type keySet [2]uint64

// checkKeys returns a 400 for the first key of body (valid JSON)
// that a reader matching keys exactly would read differently from
// encoding/json, else nil.
func checkKeys(body []byte) *requestError {
	type frame struct {
		object, wantKey bool
		seen            keySet
	}
	stack := make([]frame, 0, 8)
	var fold [64]byte // 3*maxKeyLen, allocated past it
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '{':
			stack = append(stack, frame{object: true, wantKey: true})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.wantKey = true
			}
		case '"':
			end, escaped := stringEnd(body, i+1)
			if top := len(stack) - 1; top >= 0 && stack[top].wantKey {
				stack[top].wantKey = false
				key := body[i+1 : end]
				if escaped {
					var s string
					if json.Unmarshal(body[i:end+1], &s) != nil {
						return nil // not valid JSON after all: json.Unmarshal says so
					}
					key = []byte(s)
				}
				if err := checkKey(key, &stack[top].seen, fold[:0]); err != nil {
					return err
				}
			}
			i = end
		}
	}
	return nil
}

// stringEnd returns the index of the quote that closes the string whose
// contents start at body[from], and whether the string has escapes.
func stringEnd(body []byte, from int) (int, bool) {
	q := bytes.IndexByte(body[from:], '"')
	if q < 0 {
		return len(body) - 1, true // not valid JSON: json.Unmarshal said otherwise
	}
	b := bytes.IndexByte(body[from:from+q], '\\')
	if b < 0 {
		return from + q, false
	}
	for i := from + b; i < len(body); i++ {
		switch body[i] {
		case '\\':
			i++ // the escaped byte (a \uXXXX's digits are no quotes)
		case '"':
			return i, true
		}
	}
	return len(body) - 1, true
}

func checkKey(key []byte, seen *keySet, fold []byte) *requestError {
	if idx, ok := requestKeys[string(key)]; ok {
		if seen[idx/64]&(1<<(idx%64)) != 0 {
			return invalid(string(key), "duplicate_key", "the key %q appears more than once in one object", key)
		}
		seen[idx/64] |= 1 << (idx % 64)
		return nil
	}
	// A rune that folds to an ASCII letter is at most 3 bytes long.
	if len(key) > 3*maxKeyLen {
		return nil
	}
	if f, ok := foldASCII(fold, key); !ok {
		return nil
	} else if name, ok := foldedKeys[string(f)]; ok {
		return invalid(name, "ambiguous_key", "the key %s differs from %q only in case: name each field exactly", quoteKey(key), name)
	}
	return nil
}

// quoteKey quotes a key for a message, showing non-ASCII runes as \u
// escapes (the Kelvin sign is not a K).
func quoteKey(key []byte) string { return fmt.Sprintf("%+q", key) }
