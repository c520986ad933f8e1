package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	fuzzOnce sync.Once
	fuzzToks map[string]*Tokenizer
)

func fuzzTokenizers(t testing.TB) map[string]*Tokenizer {
	fuzzOnce.Do(func() {
		fuzzToks = map[string]*Tokenizer{}
		for _, fam := range families(t) {
			data, err := os.ReadFile(filepath.Join("testdata", fam, "tokenizer.json"))
			require.NoError(t, err)
			tk, err := FromJSON(data)
			require.NoError(t, err)
			fuzzToks[fam] = tk
		}
	})
	return fuzzToks
}

// Encode and Decode never panic, whatever the text (invalid UTF-8
// included) and whatever the ids; a byte-level tokenizer without a
// normalizer decodes its encoding back to the text.
func FuzzEncodeDecode(f *testing.F) {
	for _, s := range []string{"", " ", "hello world", "  \n\n\t x", "<|eot_id|>a<|eot_id", "\xff\xfe invalid \xc3",
		"'s 'S 'ſ x'll", "你好🙂👍🏽", "e\u0301\u0301", "<s>[INST] hi [/INST]", "1234567 ½ ²"} {
		f.Add(s, []byte{1, 2, 3, 200, 255})
	}
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, text string, raw []byte) {
		for fam, tk := range toks {
			ids, err := tk.Encode(text, true)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", fam, text, err)
			}
			for _, id := range ids {
				if id < 0 || id >= tk.VocabSize() {
					t.Fatalf("%s: id %d out of range", fam, id)
				}
			}
			out := tk.Decode(ids, false)
			if !utf8.ValidString(out) {
				t.Fatalf("%s: Decode gave invalid UTF-8", fam)
			}
			if fam == "llama3" {
				back, err := tk.Encode(text, false)
				if err != nil || tk.Decode(back, false) != lossyString(text) {
					t.Fatalf("llama3: %q does not round-trip: %q", text, tk.Decode(back, false))
				}
			}
			// Arbitrary ids, some out of range.
			rid := make([]int, len(raw))
			for i, b := range raw {
				rid[i] = int(b)*tk.VocabSize()/200 - 3
			}
			_ = tk.Decode(rid, true)
			d := tk.NewStreamDecoder(len(raw)%2 == 0, ids)
			for i := 0; i < len(rid); i += 3 {
				if c := d.Next(rid[i:min(i+3, len(rid))]...); !utf8.ValidString(c) {
					t.Fatalf("%s: stream chunk %q is not valid UTF-8", fam, c)
				}
			}
		}
	})
}

// FromJSON never panics: malformed or hostile files are errors, and a
// file it accepts can be used.
func FuzzFromJSON(f *testing.F) {
	// Every family's pipeline, with its vocabulary cut down so that the
	// fuzzer's mutations and minimizations stay quick.
	for _, fam := range families(f) {
		data, err := os.ReadFile(filepath.Join("testdata", fam, "tokenizer.json"))
		require.NoError(f, err)
		f.Add(shrinkVocab(f, data))
	}
	for _, h := range hostileJSON {
		f.Add([]byte(h))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tk, err := FromJSON(data)
		if err != nil {
			return
		}
		for _, s := range []string{"", "a b", " hello  world\n", "<s>x</s>"} {
			ids, err := tk.Encode(s, true)
			if err == nil {
				_ = tk.Decode(ids, false)
			}
		}
		_ = tk.Decode([]int{0, 1, 2, -1, 1 << 40}, true)
		d := tk.NewStreamDecoder(false, []int{0, 1})
		_ = d.Next(2, 3, 4)
		_ = tk.VocabSize()
	})
}

// shrinkVocab keeps the first entries of a tokenizer.json's vocabulary
// (and the merges among them).
func shrinkVocab(t testing.TB, data []byte) []byte {
	var f map[string]any
	require.NoError(t, json.Unmarshal(data, &f))
	m := f["model"].(map[string]any)
	switch v := m["vocab"].(type) {
	case map[string]any:
		for k, id := range v {
			if id.(float64) >= 40 {
				delete(v, k)
			}
		}
		if merges, ok := m["merges"].([]any); ok {
			var kept []any
			for _, mg := range merges {
				p := mg.([]any)
				a, b := p[0].(string), p[1].(string)
				if _, ok := v[a]; ok {
					if _, ok := v[b]; ok {
						if _, ok := v[a+b]; ok {
							kept = append(kept, mg)
						}
					}
				}
			}
			m["merges"] = kept
		}
	case []any:
		m["vocab"] = v[:min(len(v), 40)]
	}
	out, err := json.Marshal(f)
	require.NoError(t, err)
	return out
}

const wlModel = `"model":{"type":"WordLevel","vocab":{"a":0,"[UNK]":1},"unk_token":"[UNK]"}`

// Files that must be refused (each is an error, none a panic).
var hostileJSON = []string{
	``, `null`, `[]`, `{}`, `{"model":null}`, `{"model":{}}`, `{"model":{"type":42}}`,
	`{"version":"2.0",` + wlModel + `}`,
	`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","b"]]}}`,
	`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a"]]}}`,
	`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b c"]}}`,
	`{"model":{"type":"BPE","vocab":{"a":-1},"merges":[]}}`,
	`{"model":{"type":"BPE","vocab":{"a":4294967296},"merges":[]}}`,
	`{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.5}}`,
	`{"model":{"type":"BPE","vocab":{"a":0,"##a":1},"merges":[["a","a"]],"continuing_subword_prefix":"###"}}`,
	`{"model":{"type":"Unigram","vocab":[["a"]]}}`,
	`{"model":{"type":"Unigram","vocab":[],"unk_id":0}}`,
	`{"model":{"type":"Unigram","vocab":[["a",0]],"unk_id":5}}`,
	`{"model":{"type":"WordPiece","vocab":{"a":0}}}`,
	`{"model":{"type":"WordLevel","vocab":{"a":0}}}`,
	`{"normalizer":{"type":"Replace","pattern":{"Regex":"("},"content":""},` + wlModel + `}`,
	`{"normalizer":{"type":"Replace","pattern":{"String":"a","Regex":"b"},"content":""},` + wlModel + `}`,
	`{"normalizer":{"type":"Sequence","normalizers":[null]},` + wlModel + `}`,
	`{"normalizer":{"type":"Strip"},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"[[:alpha:]]"},"behavior":"Isolated","invert":false},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"a"},"behavior":"Sideways","invert":false},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"Metaspace","replacement":"ab"},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"Metaspace","replacement":"_","add_prefix_space":false},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"FixedLength","length":0},` + wlModel + `}`,
	`{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Sequence"}]},` + wlModel + `}`,
	`{"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}}],"pair":[],"special_tokens":{}},` + wlModel + `}`,
	`{"post_processor":{"type":"TemplateProcessing","single":[{"Sequence":{"id":"B","type_id":0}}],"pair":[],"special_tokens":{}},` + wlModel + `}`,
	`{"post_processor":{"type":"BertProcessing","sep":["x"],"cls":["y",1]},` + wlModel + `}`,
	`{"decoder":{"type":"Strip","content":"","start":1,"stop":0},` + wlModel + `}`,
	`{"decoder":{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Nope"}]},` + wlModel + `}`,
	`{"truncation":{"max_length":1,"strategy":"Middle","stride":0},` + wlModel + `}`,
	`{"padding":{"strategy":{"Fixed":100000000000},"direction":"Right","pad_id":0,"pad_type_id":0,"pad_token":"x"},` + wlModel + `}`,
	`{"added_tokens":[{"id":0,"content":"x"}],` + wlModel + `}`,
	`{"added_tokens":[{"id":0,"content":1,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],` + wlModel + `}`,
	`{"normalizer":"NFC",` + wlModel + `}`,
}

func TestHostileJSONIsRefused(t *testing.T) {
	for _, h := range hostileJSON {
		_, err := FromJSON([]byte(h))
		assert.Error(t, err, h)
	}
}

// Files that load: odd but valid settings behave, and a pathological
// regex times out instead of hanging.
func TestOddButValidFiles(t *testing.T) {
	tk, err := FromJSON([]byte(`{"pre_tokenizer":{"type":"Whitespace"},"model":{"type":"WordLevel","vocab":{"a":0,"b":1,"[UNK]":2},"unk_token":"[UNK]"},` +
		`"decoder":{"type":"Strip","content":"a","start":99999999999999,"stop":99999999999999}}`))
	require.NoError(t, err)
	ids, err := tk.Encode("a b c", false)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, ids)
	assert.Equal(t, "b[UNK]", tk.Decode(ids, false))

	// Missing unk token: an error at encode time, as in `tokenizers`.
	tk, err = FromJSON([]byte(`{"pre_tokenizer":{"type":"Whitespace"},"model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"[UNK]"}}`))
	require.NoError(t, err)
	_, err = tk.Encode("a z", false)
	assert.Error(t, err)

	if testing.Short() {
		return
	}
	tk, err = FromJSON([]byte(`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a|aa)+$"},"behavior":"Isolated","invert":false},` +
		`"model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}}`))
	require.NoError(t, err)
	_, err = tk.Encode(strings.Repeat("a", 60)+"b", false)
	assert.ErrorIs(t, err, errRegexTimeout)
}
