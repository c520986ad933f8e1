package frontend

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

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
