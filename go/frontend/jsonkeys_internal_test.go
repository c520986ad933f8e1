package frontend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckKeys(t *testing.T) {
	refused := map[string]string{ // body: the code
		`{"model":"m","prompt":"hi","max_tokens":1,"MAX_TOKENS":7}`:                                 "ambiguous_key",
		`{"model":"m","prompt":"hi","max_tokens":1,"max_to` + "\u212a" + `ens":7}`:                  "ambiguous_key",
		`{"model":"m","prompt":"hi","max_tokens":1,"max_to\u212aens":7}`:                            "ambiguous_key",
		`{"model":"m","MODEL":"other","prompt":"hi"}`:                                               "ambiguous_key",
		`{"Model":"m","prompt":"hi"}`:                                                               "ambiguous_key",
		`{"model":"m","prompt":"hi","` + "\u017f" + `tream":true}`:                                  "ambiguous_key",
		`{"model":"m","prompt":"hi","max_tokens":1,"max_tokens":7}`:                                 "duplicate_key",
		`{"model":"m","prompt":"hi","max_tokens":1,"max_tok\u0065ns":7}`:                            "duplicate_key",
		`{"model":"m","messages":[{"role":"user","Content":"x"}]}`:                                  "ambiguous_key",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","TEXT":"x"}]}]}`:         "ambiguous_key",
		`{"model":"m","stream":true,"stream_options":{"include_usage":true,"Include_Usage":false}}`: "ambiguous_key",
		`{"model":"m","messages":[{"role":"user","role":"system","content":"x"}]}`:                  "duplicate_key",
	}
	for body, code := range refused {
		require.True(t, json.Valid([]byte(body)), body)
		re := checkKeys([]byte(body))
		if assert.NotNil(t, re, body) {
			assert.Equal(t, code, re.code, body)
			t.Log(re.param, ": ", re.msg)
		}
	}
	accepted := []string{
		`{"model":"m","prompt":"hi","max_tokens":1}`,
		`{"model":"m","prompt":"{\"MODEL\":\"x\",\"max_tokens\":9,\"max_tokens\":1}","max_tokens":1}`,
		`{"model":"m","prompt":"a\\","max_tokens":1}`,
		`{"model":"m","prompt":"\\\"MODEL\\\"","Mod":1,"user":"u","user":"v"}`,
		`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"},{"type":"text","text":"c"}]}]}`,
		`{"model":"m","stream_options":{"include_usage":true},"response_format":{"type":"text"},"prompt":[1,2,3]}`,
		`{"model":"m","logit_bias":{"50256":-100},"prompt":[[1,2],[3]],"stop":["MODEL","\"max_tokens\":"]}`,
		` { "model" : "m" , "prompt" : "x" } `,
		`{"model":"m","x":{"model":"n","model2":{}},"prompt":"x"}`,
	}
	for _, body := range accepted {
		require.True(t, json.Valid([]byte(body)), body)
		assert.Nil(t, checkKeys([]byte(body)), body)
	}
	// Every field name of the request types is a key.
	for _, k := range []string{"model", "max_tokens", "include_usage", "role", "content", "type", "text", "stop_token_ids"} {
		assert.Contains(t, requestKeys, k)
	}
}

// A key folds to a request key (foldASCII, foldedKeys) exactly when
// strings.EqualFold says it matches one.
func TestFoldMatchesEqualFold(t *testing.T) {
	words := []string{"max_tokens", "MAX_TOKENS", "max_to\u212aens", "\u017ftream", "STREAM", "model", "Mode", "\u212a", "k", "K",
		"\u00df", "SS", "\xff", "\ufffd", "", "Stream_Options", "\u0130nclude_usage", "\u0131nclude_usage", "TOP_P", "top_\u03c1"}
	for _, w := range words {
		var want string
		for k := range requestKeys {
			if strings.EqualFold(w, k) {
				want = k
			}
		}
		f, ok := foldASCII(nil, []byte(w))
		got := ""
		if ok {
			got = foldedKeys[string(f)]
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

func benchBodies() map[string][]byte {
	const size = 4 << 20
	var parts strings.Builder
	parts.WriteString(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[`)
	for parts.Len() < size-100 {
		parts.WriteString(`{"type":"text","text":"aaaaaaaaaaaa"},`)
	}
	parts.WriteString(`{"type":"text","text":"a"}]}]}`)
	ids := strings.TrimSuffix(strings.Repeat("12345,", (size-60)/6), ",")
	var keys strings.Builder // unknown keys as long as are folded, of non-ASCII runes
	keys.WriteString(`{"model":"m","max_tokens":1,"prompt":"x"`)
	for i := 0; keys.Len() < size-100; i++ {
		fmt.Fprintf(&keys, `,"%s%06d":1`, strings.Repeat("\u00e9", 28), i)
	}
	keys.WriteString(`}`)
	return map[string][]byte{
		"4MiB-unknown-keys": []byte(keys.String()),
		"small-chat":        []byte(`{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hello there, how are you?"}],"max_tokens":64,"temperature":0.7,"stream":true,"stream_options":{"include_usage":true}}`),
		"4MiB-string":       []byte(`{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat("a", size-60) + `"}`),
		"4MiB-escapes":      []byte(`{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat(`\"`, (size-60)/2) + `"}`),
		"4MiB-token-ids":    []byte(`{"model":"m","max_tokens":1,"prompt":[` + ids + `]}`),
		"4MiB-parts":        []byte(parts.String()),
	}
}

// go test -run X -bench 'CheckKeys|Unmarshal' ./go/frontend: checkKeys
// against the json.Unmarshal every request already pays.
func BenchmarkCheckKeys(b *testing.B) {
	for name, body := range benchBodies() {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if re := checkKeys(body); re != nil {
					b.Fatal(re.msg)
				}
			}
		})
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	for name, body := range benchBodies() {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var req completionRequest
				if err := json.Unmarshal(body, &req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// checkKeysByTokens is checkKeys written on json.Decoder.Token: the
// reference the hand scan is checked against.
func checkKeysByTokens(body []byte) (code, param string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type frame struct {
		object, wantKey bool
		seen            map[string]bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", ""
		}
		top := (*frame)(nil)
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantKey = true
				}
				continue
			}
			key := tok.(string)
			top.wantKey = false
			if _, ok := requestKeys[key]; ok {
				if top.seen[key] {
					return "duplicate_key", key
				}
				top.seen[key] = true
			} else {
				for k := range requestKeys {
					if strings.EqualFold(key, k) {
						return "ambiguous_key", k
					}
				}
			}
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, wantKey: true, seen: map[string]bool{}})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object wants a key next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].wantKey = true
		}
	}
}

func FuzzCheckKeys(f *testing.F) {
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
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		code, param := checkKeysByTokens(body)
		re := checkKeys(body)
		if code == "" {
			if re != nil {
				t.Fatalf("%q: checkKeys refused (%s %s), the reference accepts", body, re.code, re.param)
			}
			return
		}
		if re == nil || re.code != code || re.param != param {
			t.Fatalf("%q: checkKeys %+v, the reference %s %s", body, re, code, param)
		}
	})
}
