package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// loadBench is the benchmark tokenizer (Llama-3 style: the Llama-3 split
// pattern, byte-level BPE with ignore_merges, 16k vocabulary) and its
// ~4k-token prompt with the ids `tokenizers` gives it.
func loadBench(t testing.TB) (*Tokenizer, string, []int) {
	f, err := os.Open("testdata/bench/tokenizer.json.gz")
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	data, err := io.ReadAll(zr)
	require.NoError(t, err)
	tk, err := FromJSON(data)
	require.NoError(t, err)
	prompt, err := os.ReadFile("testdata/bench/prompt.txt")
	require.NoError(t, err)
	raw, err := os.ReadFile("testdata/bench/expect.json")
	require.NoError(t, err)
	var want struct{ IDs []int }
	require.NoError(t, json.NewDecoder(bytes.NewReader(raw)).Decode(&want))
	return tk, string(prompt), want.IDs
}

func TestBenchVector(t *testing.T) {
	tk, prompt, want := loadBench(t)
	got, err := tk.Encode(prompt, true)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, prompt, tk.Decode(got, true))
}

// BenchmarkEncode4k encodes a ~4,000-token prompt with a Llama-3-style
// tokenizer. The word cache is warm after the first iteration, as it is in
// a server.
func BenchmarkEncode4k(b *testing.B) {
	tk, prompt, want := loadBench(b)
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	for b.Loop() {
		ids, err := tk.Encode(prompt, true)
		if err != nil || len(ids) != len(want) {
			b.Fatal(err, len(ids))
		}
	}
}

// BenchmarkEncode4kCold is the same with an empty word cache each time.
func BenchmarkEncode4kCold(b *testing.B) {
	tk, prompt, _ := loadBench(b)
	m := tk.model.(*bpeModel)
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	for b.Loop() {
		m.cache = newWordCache()
		if _, err := tk.Encode(prompt, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode4k(b *testing.B) {
	tk, _, want := loadBench(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = tk.Decode(want, true)
	}
}

// BenchmarkStream4k detokenizes the ~4k-token prompt one id at a time.
func BenchmarkStream4k(b *testing.B) {
	tk, _, want := loadBench(b)
	b.ReportAllocs()
	for b.Loop() {
		d := tk.NewStreamDecoder(true, want[:10])
		for _, id := range want {
			_ = d.Next(id)
		}
	}
}
