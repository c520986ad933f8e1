package tokenizer

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Huge single words, runs of whitespace and near-misses of special tokens
// encode in linear (or n log n) time: about a second at most for 4 MiB
// (1 MiB under the race detector).
func TestHostileInputsAreFast(t *testing.T) {
	if testing.Short() {
		t.Skip("encodes 4 MiB inputs")
	}
	const size = hostileSize
	inputs := map[string]string{
		"one word":        strings.Repeat("a", size),
		"spaces":          strings.Repeat(" ", size),
		"newlines":        strings.Repeat("\n", size),
		"space tab":       strings.Repeat(" \t", size/2),
		"digits":          strings.Repeat("7", size),
		"punctuation":     strings.Repeat("!", size),
		"emoji":           strings.Repeat("🙂", size/4),
		"special prefix":  strings.Repeat("<|eot_i", size/7),
		"apostrophes":     strings.Repeat("'", size),
		"words":           strings.Repeat("ab ", size/3),
		"combining marks": "a" + strings.Repeat("\u0301", size/2),
	}
	budget := 10 * time.Second // generous: the machine may be busy
	// Every shape for the Llama-3 family; the shapes that stress each
	// other model or pre-tokenizer for the rest.
	shapes := map[string][]string{
		"gpt2_prefix": {"one word", "spaces", "apostrophes"},
		"llama2":      {"one word", "spaces", "newlines"},
		"metaspace":   {"one word", "spaces"},
		"wordpiece":   {"one word", "punctuation"},
		"unigram":     {"one word", "combining marks"},
		"wordlevel":   {"words"},
		"split_regex": {"one word", "spaces"},
	}
	for _, fam := range []string{"llama3", "gpt2_prefix", "llama2", "metaspace", "wordpiece", "unigram", "wordlevel", "split_regex"} {
		data, err := os.ReadFile(filepath.Join("testdata", fam, "tokenizer.json"))
		require.NoError(t, err)
		tk, err := FromJSON(data)
		require.NoError(t, err)
		for name, text := range inputs {
			if fam != "llama3" && !slices.Contains(shapes[fam], name) {
				continue
			}
			start := time.Now()
			ids, err := tk.Encode(text, true)
			el := time.Since(start)
			if err != nil {
				// The only acceptable failure: the regex engine's timeout.
				assert.ErrorIs(t, err, errRegexTimeout, "%s/%s", fam, name)
			}
			assert.Less(t, el, budget, "%s/%s", fam, name)
			t.Logf("%-12s %-16s %8.0f ms, %d ids", fam, name, el.Seconds()*1000, len(ids))
		}
	}
}
