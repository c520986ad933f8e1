package toolcall

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

var testVocab = map[string]int{
	llamaBot: 128010, dsCallsBegin: 1, dsCallsEnd: 2, dsCallBegin: 3, dsCallEnd: 4,
}

func TestNamesAndNew(t *testing.T) {
	assert.Equal(t, []string{"deepseek_v3", "hermes", "llama3_json"}, Names())
	_, err := New("nope", Options{})
	assert.Error(t, err)
	_, err = New("llama3_json", Options{})
	assert.Error(t, err, "no <|python_tag|> in the vocabulary")
	_, err = New("deepseek_v3", Options{})
	assert.Error(t, err)
	for _, n := range Names() {
		_, err := New(n, vocabOptions(testVocab))
		assert.NoError(t, err, n)
	}
}

// feed streams text in pieces of size bytes, the ids faked from the
// special tokens it contains, and finishes.
func feed(t testing.TB, name, text string, size int) {
	p, err := New(name, vocabOptions(testVocab))
	require.NoError(t, err)
	var d Delta
	var ok bool
	for len(text) > 0 {
		n := min(size, len(text))
		piece := text[:n]
		text = text[n:]
		var ids []int
		for tok, id := range testVocab {
			for range strings.Count(piece, tok) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			ids = []int{7}
		}
		d, ok = p.Next(piece, ids)
	}
	p.FinalDelta(d, ok)
	p.Called()
}

func hostileTexts() []string {
	deep := strings.Repeat(`{"a": [`, 5000)
	return []string{
		"",
		"\xff\xfe<tool_call>\n{\"name\": \"f\xc3\", \"arguments\": {\"a\": \"\xed\xa0\x80\"}}\n</tool_call>",
		"<tool_call>" + deep,
		deep,
		"<|python_tag|>" + deep,
		strings.Repeat("[", 20000),
		strings.Repeat(`"\\`, 3000),
		`{"name": "f", "parameters": ` + strings.Repeat(`"\u`, 2000),
		strings.Repeat("<tool_call>{}</tool_call>", 500),
		strings.Repeat(`{"name": "a", "parameters": {}}; `, 200),
		dsCallsBegin + strings.Repeat(dsCallBegin+"function"+dsSep+"f\n```json\n{}\n```"+dsCallEnd, 300) + dsCallsEnd,
		dsCallsBegin + strings.Repeat(dsCallEnd, 100) + strings.Repeat(dsCallBegin, 100),
		`{"name": 5, "parameters": 1}`,
		`[1, 2]; "parameters"; 7`,
		`{"x": -e1, "y": 1.e5, "z": -., "w": 1e999, "v": -0.0}`,
	}
}

func TestHostileInputsNeverPanic(t *testing.T) {
	for _, name := range Names() {
		for i, text := range hostileTexts() {
			start := time.Now()
			p, err := New(name, vocabOptions(testVocab))
			require.NoError(t, err)
			assert.NotPanics(t, func() { p.Extract(text) }, "%s #%d", name, i)
			assert.NotPanics(t, func() { feed(t, name, text, 4096) }, "%s #%d", name, i)
			assert.Less(t, time.Since(start), 10*time.Second, "%s #%d", name, i)
		}
	}
}

func TestHugeOutputIsLinear(t *testing.T) {
	big := strings.Repeat("plain text without any call, ", 40000) // ~1.2 MB
	call := `{"name": "f", "parameters": {"s": "` + strings.Repeat("x", 1<<20) + `"}}`
	for _, name := range Names() {
		p, err := New(name, vocabOptions(testVocab))
		require.NoError(t, err)
		start := time.Now()
		p.Extract(big)
		p.Extract("<tool_call>" + call + "</tool_call>")
		p.Extract(call)
		assert.Less(t, time.Since(start), 5*time.Second, name)
	}
}

func TestDeepNesting(t *testing.T) {
	deep := []rune(strings.Repeat("[", 100000) + strings.Repeat("]", 100000))
	_, e := pyLoads(deep)
	assert.Equal(t, decBad, e, "deeper than Python's recursion limit")
	_, _, ok := partialLoads(deep[:150000], true)
	assert.False(t, ok)
	v, e := pyLoads([]rune(`[[[[1]]]]`))
	require.Equal(t, decOK, e)
	assert.Equal(t, "[[[[1]]]]", v.dumps())
}

func TestPyFloatRepr(t *testing.T) {
	for in, want := range map[float64]string{
		1: "1.0", 1e5: "100000.0", 1e16: "1e+16", 1.5e-5: "1.5e-05", 0.0001: "0.0001",
		-2.5: "-2.5", 123456789012345680: "1.2345678901234568e+17", 0.1: "0.1",
	} {
		assert.Equal(t, want, jsonscan.PyFloat(in))
	}
}

func FuzzParsers(f *testing.F) {
	for _, s := range hostileTexts()[:3] {
		f.Add(s, 3)
	}
	f.Add(`<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>`, 2)
	f.Add(`{"name": "f", "parameters": {"a": [1, "b"]}}; {"name": "g"}`, 5)
	f.Add(dsCallsBegin+dsCallBegin+"function"+dsSep+"f\n```json\n{\"a\": 1}\n```"+dsCallEnd+dsCallsEnd, 7)
	f.Fuzz(func(t *testing.T, text string, size int) {
		if size < 1 || size > 64 || len(text) > 4096 {
			return
		}
		for _, name := range Names() {
			p, err := New(name, vocabOptions(testVocab))
			require.NoError(t, err)
			p.Extract(text)
			feed(t, name, text, size)
		}
	})
}
