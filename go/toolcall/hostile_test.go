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
	mistralBot: 9, "</s>": 5,
}

// argsVocab adds [ARGS]: mistral's v11 path.
var argsVocab = map[string]int{mistralBot: 9, mistralArgs: 32, "<s>": 6, "</s>": 5}

// testParser is one parser and the vocabulary it is made with.
type testParser struct {
	name  string
	vocab map[string]int
}

func testParsers() []testParser {
	var out []testParser
	for _, n := range Names() {
		out = append(out, testParser{n, testVocab})
	}
	return append(out, testParser{"mistral", argsVocab})
}

func TestNamesAndNew(t *testing.T) {
	assert.Equal(t, []string{"deepseek_v3", "hermes", "llama3_json", "mistral"}, Names())
	_, err := New("nope", Options{})
	assert.Error(t, err)
	_, err = New("llama3_json", Options{})
	assert.Error(t, err, "no <|python_tag|> in the vocabulary")
	_, err = New("deepseek_v3", Options{})
	assert.Error(t, err)
	_, err = New("mistral", vocabOptions(map[string]int{mistralArgs: 32}))
	assert.Error(t, err, "no [TOOL_CALLS] in the vocabulary")
	for _, n := range Names() {
		_, err := New(n, vocabOptions(testVocab))
		assert.NoError(t, err, n)
	}
}

// feed streams text in pieces of size bytes, the ids faked from the
// special tokens it contains, and finishes.
func feed(t testing.TB, tp testParser, text string, size int) {
	p, err := New(tp.name, vocabOptions(tp.vocab))
	require.NoError(t, err)
	var d Delta
	var ok bool
	for len(text) > 0 {
		n := min(size, len(text))
		piece := text[:n]
		text = text[n:]
		var ids []int
		for tok, id := range tp.vocab {
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
		mistralBot + deep,
		mistralBot + strings.Repeat("[", 20000),
		mistralBot + "f" + mistralArgs + deep,
		strings.Repeat(mistralBot+"f"+mistralArgs+`{"a": "\`, 300),
		mistralBot + `[{"name": "f\ud800\udc00\ud800", "arguments": "\u00"}]` + "\xff",
		mistralBot + strings.Repeat("[TOOL_CALLS", 2000) + strings.Repeat("<s", 2000),
		mistralBot + `{"": {"name": "x", "arguments": {"": {}}}, "name": 1e5` + strings.Repeat(" ", 5000),
	}
}

func TestHostileInputsNeverPanic(t *testing.T) {
	for _, tp := range testParsers() {
		for i, text := range hostileTexts() {
			start := time.Now()
			p, err := New(tp.name, vocabOptions(tp.vocab))
			require.NoError(t, err)
			assert.NotPanics(t, func() { p.Extract(text) }, "%s #%d", tp.name, i)
			sizes := []int{4096}
			if tp.name == "mistral" { // the others reread the whole text at each step
				sizes = append(sizes, 7)
			}
			for _, size := range sizes {
				assert.NotPanics(t, func() { feed(t, tp, text, size) }, "%s #%d", tp.name, i)
			}
			assert.Less(t, time.Since(start), 10*time.Second, "%s #%d", tp.name, i)
		}
	}
}

func TestHugeOutputIsLinear(t *testing.T) {
	big := strings.Repeat("plain text without any call, ", 40000) // ~1.2 MB
	call := `{"name": "f", "parameters": {"s": "` + strings.Repeat("x", 1<<20) + `"}}`
	for _, tp := range testParsers() {
		p, err := New(tp.name, vocabOptions(tp.vocab))
		require.NoError(t, err)
		start := time.Now()
		p.Extract(big)
		p.Extract("<tool_call>" + call + "</tool_call>")
		p.Extract(call)
		p.Extract(mistralBot + "[" + call + "]")
		p.Extract(mistralBot + "f" + mistralArgs + call)
		feed(t, tp, mistralBot+"["+call+"]", 4096)
		feed(t, tp, mistralBot+"f"+mistralArgs+call, 4096)
		assert.Less(t, time.Since(start), 5*time.Second, tp.name)
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
	f.Add(mistralBot+`[{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}, {"name": "g"}]`, 3)
	f.Add("x "+mistralBot+"f"+mistralArgs+`{"a": "[TOOL_CALLS]"} <s>`+mistralBot+"g{}", 2)
	f.Fuzz(func(t *testing.T, text string, size int) {
		if size < 1 || size > 64 || len(text) > 4096 {
			return
		}
		for _, tp := range testParsers() {
			p, err := New(tp.name, vocabOptions(tp.vocab))
			require.NoError(t, err)
			p.Extract(text)
			feed(t, tp, text, size)
		}
	})
}
