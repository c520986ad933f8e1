package toolcall

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The vectors are what vLLM 0.32's own parsers did (testdata/gen.py).

type vecFile struct {
	Parser      string         `json:"parser"`
	KeepSpecial bool           `json:"keep_special_tokens"`
	Vocab       map[string]int `json:"vocab"`
	Cases       []vecCase      `json:"cases"`
}

type vecCase struct {
	Name    string `json:"name"`
	Output  string `json:"output"`
	Extract struct {
		Content *string `json:"content"`
		Calls   []Call  `json:"calls"`
	} `json:"extract"`
	Streams []struct {
		Chunk  int       `json:"chunk"`
		Steps  []vecStep `json:"steps"`
		Called bool      `json:"called"`
	} `json:"streams"`
}

type vecStep struct {
	Text  string    `json:"text"`
	IDs   []int     `json:"ids"`
	Delta *vecDelta `json:"delta"`
	Final *vecDelta `json:"final"`
}

type vecDelta struct {
	Content *string `json:"content"`
	Calls   []struct {
		Index     int     `json:"index"`
		Opens     bool    `json:"opens"`
		Name      *string `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"calls"`
}

func (c *Call) UnmarshalJSON(b []byte) error {
	var v struct{ Name, Arguments string }
	err := json.Unmarshal(b, &v)
	c.Name, c.Arguments = v.Name, v.Arguments
	return err
}

func (v *vecDelta) toDelta() (Delta, bool) {
	if v == nil {
		return Delta{}, false
	}
	d := Delta{Content: v.Content}
	for _, c := range v.Calls {
		d.Calls = append(d.Calls, CallDelta{Index: c.Index, Opens: c.Opens, Name: c.Name, Arguments: c.Arguments})
	}
	return d, true
}

func loadVectors(t *testing.T) []vecFile {
	files, err := filepath.Glob("testdata/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out []vecFile
	for _, f := range files {
		if b := filepath.Base(f); b == "partial_json.json" || b == "ijson_events.json" {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var v vecFile
		require.NoError(t, json.Unmarshal(b, &v), f)
		out = append(out, v)
	}
	return out
}

// genTools are gen.py's TOOLS.
var genTools = []Tool{
	{Name: "get_weather", Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}}`)},
	{Name: "search"},
}

func vocabOptions(vocab map[string]int) Options {
	return Options{Tools: genTools, TokenID: func(tok string) (int, bool) {
		id, ok := vocab[tok]
		return id, ok
	}}
}

func TestVectors(t *testing.T) {
	for _, f := range loadVectors(t) {
		for _, c := range f.Cases {
			t.Run(f.Parser+"/"+c.Name, func(t *testing.T) {
				p, err := New(f.Parser, vocabOptions(f.Vocab))
				require.NoError(t, err)
				content, calls := p.Extract(c.Output)
				assert.Equal(t, c.Extract.Content, content, "extract content")
				if len(c.Extract.Calls) == 0 {
					assert.Empty(t, calls, "extract calls")
				} else {
					assert.Equal(t, c.Extract.Calls, calls, "extract calls")
				}
				for _, s := range c.Streams {
					replay(t, f, s.Chunk, s.Steps, s.Called)
				}
			})
		}
	}
}

func replay(t *testing.T, f vecFile, chunk int, steps []vecStep, called bool) {
	t.Helper()
	p, err := New(f.Parser, vocabOptions(f.Vocab))
	require.NoError(t, err)
	assert.Equal(t, f.KeepSpecial, p.KeepSpecialTokens())
	assert.Equal(t, f.KeepSpecial, KeepsSpecialTokens(f.Parser))
	text := ""
	for i, s := range steps {
		got, ok := p.Next(s.Text, s.IDs)
		text += s.Text
		want, wantOK := s.Delta.toDelta()
		if !assert.Equal(t, wantOK, ok, "chunk %d step %d (%q): ok", chunk, i, text) ||
			!assert.Equal(t, want, got, "chunk %d step %d (%q)", chunk, i, text) {
			return
		}
		if i == len(steps)-1 {
			fin, finOK := p.FinalDelta(got, ok)
			want, wantOK := s.Final.toDelta()
			assert.Equal(t, wantOK, finOK, "chunk %d final: ok", chunk)
			assert.Equal(t, want, fin, "chunk %d final", chunk)
		}
	}
	assert.Equal(t, called, p.Called(), "chunk %d: called", chunk)
}

// TestPartialJSON checks the partial JSON reader against vLLM's
// partial_json_loads on every prefix of some texts.
func TestPartialJSON(t *testing.T) {
	b, err := os.ReadFile("testdata/partial_json.json")
	require.NoError(t, err)
	var texts []struct {
		Text     string              `json:"text"`
		Prefixes [][]json.RawMessage `json:"prefixes"`
	}
	require.NoError(t, json.Unmarshal(b, &texts))
	for _, tx := range texts {
		r := []rune(tx.Text)
		for n, row := range tx.Prefixes {
			for k, allowStr := range []bool{true, false} {
				v, end, ok := partialLoads(r[:n+1], allowStr)
				var want []any
				if json.Unmarshal(row[k], &want) != nil {
					assert.False(t, ok, "%q allowStr=%v: want %s", string(r[:n+1]), allowStr, row[k])
					continue
				}
				if assert.True(t, ok, "%q allowStr=%v", string(r[:n+1]), allowStr) {
					assert.Equal(t, want[0], v.dumps(), "%q allowStr=%v", string(r[:n+1]), allowStr)
					assert.EqualValues(t, want[1], end, "%q allowStr=%v", string(r[:n+1]), allowStr)
				}
			}
		}
	}
}
