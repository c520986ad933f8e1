package reasoning

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The vectors are vLLM's own parsers run by testdata/gen.py.
type vectors struct {
	Parser    string         `json:"parser"`
	Tokenizer string         `json:"tokenizer"`
	Vocab     map[string]int `json:"vocab"`
	Special   []string       `json:"special"`
	Cases     []vector       `json:"cases"`
}

type vector struct {
	Name        string              `json:"name"`
	Kwargs      map[string]any      `json:"kwargs"`
	PromptIDs   []int               `json:"prompt_ids"`
	IDs         []int               `json:"ids"`
	Steps       [][]json.RawMessage `json:"steps"`
	Text        string              `json:"text"`
	Extract     [2]*string          `json:"extract"`
	CountStream int                 `json:"count_stream"`
	CountFull   int                 `json:"count_full"`
	EndPrompt   bool                `json:"end_prompt"`
	EndAll      bool                `json:"end_all"`
}

func loadVectors(t *testing.T) []vectors {
	files, err := filepath.Glob("testdata/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var all []vectors
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var v vectors
		require.NoError(t, json.Unmarshal(b, &v), f)
		require.NotEmpty(t, v.Cases, f)
		all = append(all, v)
	}
	return all
}

func (v vectors) options(c vector) Options {
	return Options{
		TokenID: func(s string) (int, bool) {
			id, ok := v.Vocab[s]
			return id, ok
		},
		Vars:          c.Kwargs,
		PromptIDs:     c.PromptIDs,
		SpecialTokens: v.Special,
	}
}

func name(v vectors, c vector) string {
	kw, _ := json.Marshal(c.Kwargs)
	return v.Parser + "/" + v.Tokenizer + "/" + c.Name + "/" + string(kw)
}

func TestVectorsStreamed(t *testing.T) {
	for _, v := range loadVectors(t) {
		for _, c := range v.Cases {
			t.Run(name(v, c), func(t *testing.T) {
				p, err := New(v.Parser, v.options(c))
				require.NoError(t, err)
				at := 0
				for i, raw := range c.Steps {
					var text string
					var n int
					var want map[string]*string
					var ended bool
					require.Len(t, raw, 4)
					require.NoError(t, json.Unmarshal(raw[0], &text))
					require.NoError(t, json.Unmarshal(raw[1], &n))
					require.NoError(t, json.Unmarshal(raw[2], &want))
					require.NoError(t, json.Unmarshal(raw[3], &ended))
					ids := c.IDs[at : at+n]
					at += n
					next := p.Next
					if i == len(c.Steps)-1 {
						next = p.Final
					}
					r, ct, ok := next(text, ids)
					require.Equal(t, want != nil, ok, "step %d %q", i, text)
					hr, hc := p.Keys()
					wr, wantR := want["reasoning"]
					wc, wantC := want["content"]
					if ok {
						require.Equal(t, wantR, hr, "step %d %q: reasoning key", i, text)
						require.Equal(t, wantC, hc, "step %d %q: content key", i, text)
					}
					require.Equal(t, wr, r, "step %d %q: reasoning", i, text)
					require.Equal(t, wc, ct, "step %d %q: content", i, text)
					require.Equal(t, ended, p.Ended(), "step %d %q: ended", i, text)
				}
				require.Equal(t, len(c.IDs), at)
				assert.Equal(t, c.CountStream, p.CountReasoningTokens(c.IDs), "streamed count")
				assert.Equal(t, c.EndPrompt, p.IsReasoningEnd(c.PromptIDs))
				all := append(append([]int(nil), c.PromptIDs...), c.IDs...)
				assert.Equal(t, c.EndAll, p.IsReasoningEnd(all))
			})
		}
	}
}

func TestVectorsWhole(t *testing.T) {
	for _, v := range loadVectors(t) {
		for _, c := range v.Cases {
			t.Run(name(v, c), func(t *testing.T) {
				p, err := New(v.Parser, v.options(c))
				require.NoError(t, err)
				r, ct := p.Extract(c.Text, c.IDs)
				assert.Equal(t, c.Extract[0], r, "reasoning")
				assert.Equal(t, c.Extract[1], ct, "content")
				assert.Equal(t, c.CountFull, p.CountReasoningTokens(c.IDs), "count")
			})
		}
	}
}
