package frontend

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// encoding/json matches an object's keys to fields without regard to case,
// and the last of several matches wins, so a gateway in front of the
// frontend that enforces a policy with an exact-key parser would read
// {"max_tokens": 1, "MAX_TOKENS": 7} as max_tokens 1 and the frontend as 7.
// checkKeys refuses such bodies (go/jsonscan finds them): a key that is not
// one of the request's field names but folds to one, and a field name given
// twice in one object.

// requestKeys are the field names of the request types, at every depth, and
// of the chat content parts (read from a json.RawMessage in chatText).
var requestKeys = func() []string {
	var keys []string
	seen := map[string]bool{}
	add := func(name string) {
		if !seen[name] {
			seen[name] = true
			keys = append(keys, name)
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
			if f.Anonymous && name == "" { // its fields are the request's
				walk(f.Type)
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
	return keys
}()

// requestKeySet is requestKeys, for jsonscan.
var requestKeySet = jsonscan.NewKeys(requestKeys...)

// checkKeys returns a 400 for the first key of body (valid JSON)
// that a reader matching keys exactly would read differently from
// encoding/json, else nil.
func checkKeys(body []byte) *requestError {
	p, found := requestKeySet.Check(body)
	if !found {
		return nil
	}
	name := requestKeySet.Name(p.Key)
	if p.Match == jsonscan.Duplicate {
		return invalid(name, "duplicate_key", "the key %q appears more than once in one object", name)
	}
	return invalid(name, "ambiguous_key", "the key %s differs from %q only in case: name each field exactly", quoteKey(p.Name), name)
}

// quoteKey quotes a key for a message, showing non-ASCII runes as \u
// escapes (the Kelvin sign is not a K).
func quoteKey(key []byte) string { return fmt.Sprintf("%+q", key) }
