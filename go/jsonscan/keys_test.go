package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testKeys are names as a request type's fields might be.
var testKeys = NewKeys("model", "max_tokens", "stream", "stream_options", "include_usage", "messages", "role",
	"content", "type", "text", "top_p", "n")

func TestMatch(t *testing.T) {
	var seen Seen
	for _, c := range []struct {
		name  string
		match Match
		key   string
	}{
		{"model", Exact, "model"},
		{"max_tokens", Exact, "max_tokens"},
		{"MAX_TOKENS", Folded, "max_tokens"},
		{"max_to\u212aens", Folded, "max_tokens"},
		{"\u017ftream", Folded, "stream"},
		{"model", Duplicate, "model"},
		{"Model", Folded, "model"},
		{"models", Other, ""},
		{"N", Folded, "n"},
		{"n", Exact, "n"},
		{"\xff", Other, ""},
		{strings.Repeat("a", 100), Other, ""},
	} {
		m, key := testKeys.Match([]byte(c.name), &seen)
		assert.Equal(t, c.match, m, "%q", c.name)
		if c.key == "" {
			assert.Equal(t, -1, key, "%q", c.name)
		} else {
			assert.Equal(t, c.key, testKeys.Name(key), "%q", c.name)
		}
	}
	var fresh Seen
	m, _ := testKeys.Match([]byte("model"), &fresh)
	assert.Equal(t, Exact, m, "each object has its own Seen")
}

func TestNewKeysRefusesWhatItCannotHold(t *testing.T) {
	assert.Panics(t, func() { NewKeys("a", "a") })
	assert.Panics(t, func() { NewKeys("\u212a") })
	assert.Panics(t, func() { NewKeys("é") })
	many := make([]string, MaxKeys+1)
	for i := range many {
		many[i] = strings.Repeat("k", i+1)
	}
	assert.Panics(t, func() { NewKeys(many...) })
	k := NewKeys(many[:MaxKeys]...)
	var seen Seen
	for i := range MaxKeys { // every index has its own bit
		m, key := k.Match([]byte(many[i]), &seen)
		require.Equal(t, Exact, m, i)
		require.Equal(t, i, key)
	}
	for i := range MaxKeys {
		m, _ := k.Match([]byte(many[i]), &seen)
		require.Equal(t, Duplicate, m, i)
	}
}

func TestCheck(t *testing.T) {
	refused := map[string]struct {
		match Match
		key   string
	}{
		`{"model":"m","max_tokens":1,"MAX_TOKENS":7}`:                              {Folded, "max_tokens"},
		`{"model":"m","max_tokens":1,"max_to` + "\u212a" + `ens":7}`:               {Folded, "max_tokens"},
		`{"model":"m","max_tokens":1,"max_to\u212aens":7}`:                         {Folded, "max_tokens"},
		`{"model":"m","` + "\u017f" + `tream":true}`:                               {Folded, "stream"},
		`{"model":"m","max_tokens":1,"max_tok\u0065ns":7}`:                         {Duplicate, "max_tokens"},
		`{"model":"m","messages":[{"role":"user","Content":"x"}]}`:                 {Folded, "content"},
		`{"messages":[{"role":"user","content":[{"type":"text","TEXT":"x"}]}]}`:    {Folded, "text"},
		`{"stream_options":{"include_usage":true,"Include_Usage":false}}`:          {Folded, "include_usage"},
		`{"model":"m","messages":[{"role":"user","role":"system","content":"x"}]}`: {Duplicate, "role"},
		`[{"n":1},{"n":2,"N":3}]`:                                                  {Folded, "n"},
	}
	for body, want := range refused {
		require.True(t, json.Valid([]byte(body)), body)
		p, ok := testKeys.Check([]byte(body))
		if assert.True(t, ok, body) {
			assert.Equal(t, want.match, p.Match, body)
			assert.Equal(t, want.key, testKeys.Name(p.Key), body)
		}
	}
	p, _ := testKeys.Check([]byte(`{"max_to\u212aens":7}`))
	assert.Equal(t, "max_to\u212aens", string(p.Name), "the name as given, decoded")
	for _, body := range []string{
		`{"model":"m","max_tokens":1}`,
		`{"model":"m","prompt":"{\"MODEL\":\"x\",\"max_tokens\":9,\"max_tokens\":1}","max_tokens":1}`,
		`{"model":"m","prompt":"a\\","max_tokens":1}`,
		`{"model":"m","prompt":"\\\"MODEL\\\"","Mod":1,"user":"u","user":"v"}`,
		`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`,
		` { "model" : "m" , "n" : 1 } `,
		`{"model":"m","x":{"model":"n","model2":{}},"prompt":"x"}`,
		`["MODEL","MODEL",{"model":1}]`,
	} {
		require.True(t, json.Valid([]byte(body)), body)
		p, ok := testKeys.Check([]byte(body))
		assert.False(t, ok, "%s: %+v", body, p)
	}
}

// A name folds to a key (foldASCII, Keys.folded) exactly when
// strings.EqualFold says it matches one.
func TestFoldMatchesEqualFold(t *testing.T) {
	words := []string{"max_tokens", "MAX_TOKENS", "max_to\u212aens", "\u017ftream", "STREAM", "model", "Mode", "\u212a", "k", "K",
		"\u00df", "SS", "\xff", "\ufffd", "", "Stream_Options", "\u0130nclude_usage", "\u0131nclude_usage", "TOP_P", "top_\u03c1"}
	for _, w := range words {
		want := -1
		for i, k := range testKeys.names {
			if strings.EqualFold(w, k) {
				want = i
			}
		}
		got := -1
		if f, ok := foldASCII(nil, []byte(w)); ok {
			if i, ok := testKeys.folded[string(f)]; ok {
				got = i
			}
		}
		assert.Equal(t, want, got, "%q", w)
	}
}

// foldASCII's premise: the only runes outside ASCII whose fold orbit holds
// an ASCII rune are U+017F and U+212A.
func TestOnlyTwoRunesFoldToASCII(t *testing.T) {
	var found []rune
	for r := rune(utf8.RuneSelf); r <= unicode.MaxRune; r++ {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < utf8.RuneSelf {
				found = append(found, r)
				break
			}
		}
	}
	assert.Equal(t, []rune{'\u017f', '\u212a'}, found)
}

// checkByTokens is Keys.Check written on json.Decoder.Token: the reference
// the hand scan is checked against.
func checkByTokens(k *Keys, b []byte) (m Match, key string) {
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		object, wantName bool
		seen             map[string]bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return Other, ""
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantName {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantName = true
				}
				continue
			}
			name := tok.(string)
			top.wantName = false
			if _, ok := k.index[name]; ok {
				if top.seen[name] {
					return Duplicate, name
				}
				top.seen[name] = true
			} else {
				for _, key := range k.names {
					if strings.EqualFold(name, key) {
						return Folded, key
					}
				}
			}
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantName: true, seen: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object wants a name next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantName = true
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":1,"MAX_TOKENS":7}`,
		`{"model":"m","prompt":"a\\\"b","max_to\u212aens":7}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream_options":{"include_usage":true}}`,
		`{"a":{"model":1},"model":2,"b":[{"text":1,"TEXT":2}]}`,
		`{"x\"y":1,"mo\u0064el":"m","model":"n"}`,
		`[{"n":1},{"n":2,"N":3}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		m, key := checkByTokens(testKeys, b)
		p, ok := testKeys.Check(b)
		if m == Other {
			if ok {
				t.Fatalf("%q: Check refused (%v %s), the reference accepts", b, p.Match, testKeys.Name(p.Key))
			}
			return
		}
		if !ok || p.Match != m || testKeys.Name(p.Key) != key {
			t.Fatalf("%q: Check %+v, the reference %v %s", b, p, m, key)
		}
	})
}
