package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The regex engine's timeout clock runs for a second after the last match
// of a pattern without a built-in scanner, then exits by itself.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/dlclark/regexp2.runClock"))
}

// vectors is a testdata/<family>/cases.json, written by testdata/gen.py
// with the Python `tokenizers` package.
type vectors struct {
	Meta struct {
		MaxID     int                `json:"max_id"`
		Specials  []int              `json:"specials"`
		Added     map[string]string  `json:"-"`
		IDToToken map[string]*string `json:"id_to_token"`
	} `json:"meta"`
	// Absent ids_no_special and decode_keep equal ids and decode.
	Cases []struct {
		Text         string  `json:"text"`
		IDs          []int   `json:"ids"`
		IDsNoSpecial *[]int  `json:"ids_no_special"`
		Decode       string  `json:"decode"`
		DecodeKeep   *string `json:"decode_keep"`
		// The normalizer's output and the pre-tokenizer's pieces of text.
		Normalized *string   `json:"normalized"`
		Pieces     *[]string `json:"pieces"`
	} `json:"cases"`
	Decodes []struct {
		IDs        []int   `json:"ids"`
		Decode     string  `json:"decode"`
		DecodeKeep *string `json:"decode_keep"`
	} `json:"decodes"`
	Streams []struct {
		Prompt  []int    `json:"prompt"`
		Context []int    `json:"context"`
		IDs     []int    `json:"ids"`
		Skip    bool     `json:"skip"`
		Chunks  []string `json:"chunks"`
	} `json:"streams"`
}

func families(t testing.TB) []string {
	dirs, err := filepath.Glob("testdata/*/cases.json")
	require.NoError(t, err)
	require.NotEmpty(t, dirs)
	var out []string
	for _, d := range dirs {
		out = append(out, filepath.Base(filepath.Dir(d)))
	}
	return out
}

func loadFamily(t testing.TB, name string) (*Tokenizer, *vectors) {
	data, err := os.ReadFile(filepath.Join("testdata", name, "tokenizer.json"))
	require.NoError(t, err)
	tk, err := FromJSON(data)
	require.NoError(t, err, name)
	raw, err := os.ReadFile(filepath.Join("testdata", name, "cases.json"))
	require.NoError(t, err)
	var v vectors
	require.NoError(t, json.Unmarshal(raw, &v), name)
	return tk, &v
}

func short(s string) string {
	if len(s) > 60 {
		return strconv.Quote(s[:60]) + "..."
	}
	return strconv.Quote(s)
}

// Every case of every family: ids with and without special tokens, and
// decoding, exactly as `tokenizers`.
func TestVectors(t *testing.T) {
	for _, fam := range families(t) {
		t.Run(fam, func(t *testing.T) {
			tk, v := loadFamily(t, fam)
			for _, c := range v.Cases {
				ids, err := tk.Encode(c.Text, true)
				require.NoError(t, err, short(c.Text))
				assert.Equal(t, c.IDs, nonNil(ids), "Encode(%s, true)", short(c.Text))
				raw, err := tk.Encode(c.Text, false)
				require.NoError(t, err, short(c.Text))
				assert.Equal(t, or(c.IDsNoSpecial, c.IDs), nonNil(raw), "Encode(%s, false)", short(c.Text))
				assert.Equal(t, c.Decode, tk.Decode(c.IDs, true), "Decode(ids of %s, skip)", short(c.Text))
				assert.Equal(t, or(c.DecodeKeep, c.Decode), tk.Decode(c.IDs, false), "Decode(ids of %s, keep)", short(c.Text))
			}
			for _, c := range v.Cases {
				if c.Normalized != nil {
					got, err := tk.normalizer.normalize(c.Text)
					require.NoError(t, err)
					assert.Equal(t, *c.Normalized, got, "normalize(%s)", short(c.Text))
				}
				if c.Pieces != nil {
					got := []string{}
					if c.Text != "" {
						err := tk.pre.split(piece{s: c.Text, lead: firstRuneLen(c.Text)}, sinkFunc(func(p piece) error {
							got = append(got, p.text())
							return nil
						}))
						require.NoError(t, err)
					}
					assert.Equal(t, *c.Pieces, got, "pre-tokenize(%s)", short(c.Text))
				}
			}
			for _, c := range v.Decodes {
				assert.Equal(t, c.Decode, tk.Decode(c.IDs, true), "Decode(%v, skip)", c.IDs)
				assert.Equal(t, or(c.DecodeKeep, c.Decode), tk.Decode(c.IDs, false), "Decode(%v, keep)", c.IDs)
			}
			assert.Equal(t, v.Meta.MaxID+1, tk.VocabSize())
			var specials []int
			for id := 0; id < tk.VocabSize(); id++ {
				if tk.IsSpecial(id) {
					specials = append(specials, id)
				}
			}
			assert.Equal(t, v.Meta.Specials, nonNil(specials))
			for k, want := range v.Meta.IDToToken {
				id, _ := strconv.Atoi(k)
				got, ok := tk.IDToToken(id)
				if want == nil {
					assert.False(t, ok, "IDToToken(%d)", id)
					continue
				}
				assert.True(t, ok, "IDToToken(%d)", id)
				assert.Equal(t, *want, got, "IDToToken(%d)", id)
				back, ok := tk.TokenToID(got)
				assert.True(t, ok, "TokenToID(%q)", got)
				if !tk.IsSpecial(id) {
					assert.Equal(t, id, back, "TokenToID(%q)", got)
				}
			}
		})
	}
}

func or[T any](p *T, def T) T {
	if p != nil {
		return *p
	}
	return def
}

func nonNil(ids []int) []int {
	if ids == nil {
		return []int{}
	}
	return ids
}

// The StreamDecoder's chunks are the ones `tokenizers`' DecodeStream
// returns when primed with the same context, one id per call.
func TestStreamVectors(t *testing.T) {
	for _, fam := range families(t) {
		t.Run(fam, func(t *testing.T) {
			tk, v := loadFamily(t, fam)
			for _, s := range v.Streams {
				d := tk.NewStreamDecoder(s.Skip, s.Prompt)
				require.Equal(t, nonNil(s.Context), nonNil(d.ids), "context of %v", s.Prompt)
				var got []string
				for _, id := range s.IDs {
					got = append(got, d.Next(id))
				}
				assert.Equal(t, s.Chunks, got, "stream of %v (skip %v, prompt %v)", s.IDs, s.Skip, s.Prompt)
			}
		})
	}
}

func TestUnsupportedComponentsAreNamed(t *testing.T) {
	base := `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,` +
		`"model":{"type":"WordLevel","vocab":{"a":0,"[UNK]":1},"unk_token":"[UNK]"}}`
	for field, comp := range map[string]string{
		"normalizer":     `{"type":"Precompiled","precompiled_charsmap":"AAAA"}`,
		"pre_tokenizer":  `{"type":"UnicodeScripts"}`,
		"decoder":        `{"type":"Mystery"}`,
		"post_processor": `{"type":"Weird"}`,
		"model":          `{"type":"Magic","vocab":{}}`,
	} {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(base), &m))
		var c any
		require.NoError(t, json.Unmarshal([]byte(comp), &c))
		m[field] = c
		data, _ := json.Marshal(m)
		_, err := FromJSON(data)
		require.Error(t, err, field)
		var typ struct{ Type string }
		_ = json.Unmarshal([]byte(comp), &typ)
		assert.Contains(t, err.Error(), typ.Type, field)
		assert.Contains(t, err.Error(), strings.ReplaceAll(field, "model", "model"), field)
	}
	// The base itself loads, and WordLevel without a decoder joins with spaces.
	tk, err := FromJSON([]byte(base))
	require.NoError(t, err)
	assert.Equal(t, "a [UNK] a", tk.Decode([]int{0, 1, 0, 7}, false))
}

// Older files spell merges as "a b" lines (possibly after a "#version"
// line) and may leave out the model's "type": same tokenizer.
func TestLegacyMergesSpelling(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "gpt2", "tokenizer.json"))
	require.NoError(t, err)
	var f map[string]any
	require.NoError(t, json.Unmarshal(data, &f))
	m := f["model"].(map[string]any)
	lines := []any{"#version: 0.2"}
	for _, mg := range m["merges"].([]any) {
		p := mg.([]any)
		lines = append(lines, p[0].(string)+" "+p[1].(string))
	}
	m["merges"] = lines
	delete(m, "type")
	legacy, err := json.Marshal(f)
	require.NoError(t, err)
	tk, v := loadFamily(t, "gpt2")
	old, err := FromJSON(legacy)
	require.NoError(t, err)
	for _, c := range v.Cases {
		want, err := tk.Encode(c.Text, true)
		require.NoError(t, err)
		got, err := old.Encode(c.Text, true)
		require.NoError(t, err)
		assert.Equal(t, want, got, short(c.Text))
	}
}

// WithoutTruncationAndPadding encodes the whole text, unpadded, as the
// truncpad family's tokenizer without those settings would (its plain
// word-level encoding), and leaves the original as it was.
func TestWithoutTruncationAndPadding(t *testing.T) {
	tk, v := loadFamily(t, "truncpad")
	plain := tk.WithoutTruncationAndPadding()
	long := strings.Repeat("a b c ", 20)
	ids, err := plain.Encode(long, false)
	require.NoError(t, err)
	words := strings.Fields(long)
	require.Len(t, ids, len(words), "every word, none cut, no padding")
	cut, err := tk.Encode(long, false)
	require.NoError(t, err)
	require.Len(t, cut, 15, "the original still truncates (to 9 ids) and pads (to 12, rounded up to a multiple of 5)")
	require.Equal(t, ids[len(ids)-9:], cut[6:], "the same ids, the last 9 of them (truncation from the left)")
	_ = v
}

// A file from before models had a "type" (bert-base-uncased's) is read as
// the tokenizers library reads it: the model is recognised by its fields,
// and every family's file without its model's "type" encodes as with it.
func TestModelWithoutType(t *testing.T) {
	for _, fam := range families(t) {
		data, err := os.ReadFile(filepath.Join("testdata", fam, "tokenizer.json"))
		require.NoError(t, err)
		var f map[string]any
		require.NoError(t, json.Unmarshal(data, &f))
		m, ok := f["model"].(map[string]any)
		require.True(t, ok, fam)
		typ := m["type"]
		delete(m, "type")
		untyped, err := json.Marshal(f)
		require.NoError(t, err)
		got, ok := legacyModelType(mustJSON(t, m))
		require.True(t, ok, fam)
		require.Equal(t, typ, got, "%s: recognised as another model", fam)
		tk, v := loadFamily(t, fam)
		old, err := FromJSON(untyped)
		require.NoError(t, err, fam)
		assert.Equal(t, typ, tk.ModelType(), fam)
		assert.Equal(t, typ, old.ModelType(), "%s: the type of a file that names none", fam)
		for _, c := range v.Cases {
			want, err := tk.Encode(c.Text, true)
			require.NoError(t, err)
			have, err := old.Encode(c.Text, true)
			require.NoError(t, err)
			assert.Equal(t, want, have, "%s: %s", fam, short(c.Text))
		}
	}
	// The library's order and required fields (checked with tokenizers 0.22).
	for want, model := range map[string]string{
		"BPE":       `{"vocab":{"a":0},"merges":[],"unk_token":"a","continuing_subword_prefix":"##","max_input_chars_per_word":9}`,
		"WordPiece": `{"vocab":{"a":0},"unk_token":"a","continuing_subword_prefix":"##","max_input_chars_per_word":9}`,
		"WordLevel": `{"vocab":{"a":0},"unk_token":"a","max_input_chars_per_word":9}`,
		"Unigram":   `{"vocab":[["a",0.0]],"unk_id":0}`,
		"":          `{"vocab":{"a":0},"continuing_subword_prefix":"##","max_input_chars_per_word":9}`,
	} {
		got, ok := legacyModelType(json.RawMessage(model))
		assert.Equal(t, want, got, model)
		assert.Equal(t, want != "", ok, model)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// SpaceMarker is the Metaspace pre-tokenizer's replacement, alone or in a
// Sequence; byte-level files have none, and neither has Llama 2's, whose
// marker a normalizer writes (Prepend and Replace).
func TestSpaceMarker(t *testing.T) {
	for fam, want := range map[string]string{"metaspace": "\u2581", "llama2": "", "gpt2": "", "llama3": "", "wordpiece": ""} {
		tk, _ := loadFamily(t, fam)
		assert.Equal(t, want, tk.SpaceMarker(), fam)
	}
}
