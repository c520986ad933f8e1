package reasoning

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A small vocabulary with Qwen3's ids.
var qwenVocab = map[string]int{
	"<think>": 151667, "</think>": 151668, "<tool_call>": 151657, "</tool_call>": 151658,
	"<|im_start|>": 151644, "<|im_end|>": 151645, "<|endoftext|>": 151643,
}

func qwenOptions(vars map[string]any, prompt []int) Options {
	return Options{
		TokenID: func(s string) (int, bool) {
			id, ok := qwenVocab[s]
			return id, ok
		},
		Vars:          vars,
		PromptIDs:     prompt,
		SpecialTokens: []string{"<|im_end|>", "<|endoftext|>", "<|im_start|>"},
	}
}

func TestNames(t *testing.T) {
	assert.Equal(t, []string{"deepseek_r1", "qwen3"}, Names())
}

func TestNewRefuses(t *testing.T) {
	_, err := New("nope", qwenOptions(nil, nil))
	assert.ErrorContains(t, err, "no parser")
	// deepseek_r1 needs both tokens, as vLLM's constructor does.
	_, err = New("deepseek_r1", Options{})
	assert.ErrorContains(t, err, "no <think>")
	// vLLM's qwen3 parser does not check the vocabulary.
	_, err = New("qwen3", Options{})
	assert.NoError(t, err)
	_, err = New("qwen3", qwenOptions(map[string]any{"enable_thinking": map[string]any{}}, nil))
	assert.ErrorContains(t, err, "hashable")
}

func TestEnableThinkingTruthiness(t *testing.T) {
	for v, want := range map[any]bool{nil: false, false: false, true: true, "": false, "no": true, 0.0: false, 1.0: true} {
		p, err := New("qwen3", qwenOptions(map[string]any{"enable_thinking": v}, nil))
		require.NoError(t, err)
		r, c := p.Extract("x", nil)
		if want {
			assert.Equal(t, "x", *r, "%v", v)
			assert.Nil(t, c)
		} else {
			assert.Nil(t, r, "%v", v)
			assert.Equal(t, "x", *c)
		}
	}
}

func TestPySlice(t *testing.T) {
	s := "aé🤔b"
	assert.Equal(t, "aé🤔", pySlice(s, 0, -1, false))
	assert.Equal(t, "", pySlice(s, 7, 0, true))
	assert.Equal(t, "é🤔b", pySlice(s, 1, 0, true))
	assert.Equal(t, "", pySlice(s, 3, 1, false))
	assert.Equal(t, 2, pyFind(s, "🤔"))
	assert.Equal(t, -1, pyFind(s, "x"))
	assert.Equal(t, "", pyStrip("\x1c \u3000\n"))
}

// vLLM slices with find's -1 when the end token's text is not in the piece.
func TestDeepseekEndTextMissing(t *testing.T) {
	p, err := New("deepseek_r1", qwenOptions(nil, nil))
	require.NoError(t, err)
	r, c, ok := p.Next("abcdefghij", []int{1, 151668})
	require.True(t, ok)
	assert.Equal(t, "abcdefghi", *r)
	assert.Equal(t, "hij", *c)
	assert.True(t, p.Ended())
}

func TestCountDeepseek(t *testing.T) {
	p, err := New("deepseek_r1", qwenOptions(nil, nil))
	require.NoError(t, err)
	assert.Equal(t, 3, p.CountReasoningTokens([]int{151667, 1, 2, 151668, 3, 151668, 151667, 4}))
}

// Whatever comes in, the parsers neither panic nor lose their footing.
func TestHostile(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	huge := strings.Repeat("<thi</think><tool_call>\xff\xfe<|im_", 20000)
	pieces := []string{"", "<", "</", "think>", "\xff", "\xc3", "<think>", "</think>", "<|im_end|>", ">", "é", huge[:1000]}
	ids := []int{151667, 151668, 151657, 151645, 151644, -1, 0, 1 << 40, 5}
	for _, name := range Names() {
		for _, vars := range []map[string]any{nil, {"enable_thinking": false}} {
			for trial := 0; trial < 100; trial++ {
				p, err := New(name, qwenOptions(vars, []int{151644, 5}))
				require.NoError(t, err)
				var all []int
				for i := 0; i < 30; i++ {
					text := pieces[rng.Intn(len(pieces))]
					var step []int
					for j := rng.Intn(4); j > 0; j-- {
						step = append(step, ids[rng.Intn(len(ids))])
					}
					all = append(all, step...)
					if i == 29 {
						p.Final(text, step)
					} else {
						p.Next(text, step)
					}
				}
				p.Ended()
				p.IsReasoningEnd(all)
				p.CountReasoningTokens(all)
				p.Extract(huge[:5000], all)
			}
			p, err := New(name, qwenOptions(vars, nil))
			require.NoError(t, err)
			r, c, _ := p.Next(huge, []int{151667, 151668, 151645})
			_, _ = r, c
			p.Final(huge, nil)
			p.Extract(huge, nil)
			p.Extract("\xff<think>\xfe</think>\xfd", nil)
		}
	}
}
