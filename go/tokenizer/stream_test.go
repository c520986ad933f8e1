package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// feed gives ids to d in random-sized calls and returns each call's text.
func feed(r *rand.Rand, d *StreamDecoder, ids []int) []string {
	var out []string
	for len(ids) > 0 {
		n := min(len(ids), r.IntN(4)) // 0 ids is a valid call too
		out = append(out, d.Next(ids[:n]...))
		ids = ids[n:]
	}
	return out
}

// assertChunks: every chunk is valid UTF-8.
func assertChunks(t *testing.T, chunks []string, msg ...any) {
	t.Helper()
	for _, c := range chunks {
		assert.True(t, utf8.ValidString(c), msg...)
	}
}

// For every family and many texts, split at random points: the chunks
// concatenate to Decode(output) (no prompt), or to Decode(context+output)
// less Decode(context) (with a prompt), and no chunk carries part of a
// character.
func TestStreamConcatenationProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, fam := range families(t) {
		tk, v := loadFamily(t, fam)
		prompt, err := tk.Encode("User: say something\nAssistant:", true)
		require.NoError(t, err)
		for _, c := range v.Cases {
			out := c.IDsNoSpecial
			if out == nil {
				out = &c.IDs
			}
			for _, skip := range []bool{true, false} {
				full, pending := tk.decode(*out, skip)
				if pending {
					continue
				}
				for range 3 {
					d := tk.NewStreamDecoder(skip, nil)
					chunks := feed(r, d, *out)
					assertChunks(t, chunks, fam, c.Text)
					assert.Equal(t, full, strings.Join(chunks, ""), "%s: stream of %s (skip %v)", fam, short(c.Text), skip)

					d = tk.NewStreamDecoder(skip, prompt)
					ctx := append([]int(nil), d.ids...)
					chunks = feed(r, d, *out)
					assertChunks(t, chunks, fam, c.Text)
					before, _ := tk.decode(ctx, skip)
					after, _ := tk.decode(append(ctx, *out...), skip)
					if assert.True(t, strings.HasPrefix(after, before)) {
						assert.Equal(t, after[len(before):], strings.Join(chunks, ""), "%s: stream of %s after the prompt (skip %v)", fam, short(c.Text), skip)
					}
				}
			}
		}
	}
}

// Random ids, valid or not, in random calls: chunks are always valid
// UTF-8, nothing panics, and when the final decoding has no incomplete
// character or invalid byte-fallback run, the chunks add up to it.
func TestStreamRandomIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, fam := range families(t) {
		tk, _ := loadFamily(t, fam)
		n := tk.VocabSize()
		for range 200 {
			ids := make([]int, r.IntN(20))
			for i := range ids {
				ids[i] = r.IntN(n+4) - 2
			}
			skip := r.IntN(2) == 0
			d := tk.NewStreamDecoder(skip, nil)
			chunks := feed(r, d, ids)
			assertChunks(t, chunks, fam, ids)
			full, pending := tk.decode(ids, skip)
			if !pending && !strings.Contains(full, "\uFFFD") {
				assert.Equal(t, full, strings.Join(chunks, ""), "%s: %v", fam, ids)
			}
		}
	}
}

// Bytes of a character split over tokens are held back until complete.
func TestStreamHoldsPartialCharacters(t *testing.T) {
	tk, _ := loadFamily(t, "llama2")
	ids, err := tk.Encode("🙂", false) // byte-fallback tokens
	require.NoError(t, err)
	require.Greater(t, len(ids), 2)
	d := tk.NewStreamDecoder(true, nil)
	var got []string
	for _, id := range ids {
		got = append(got, d.Next(id))
	}
	assert.Equal(t, "🙂", strings.Join(got, ""))
	for _, c := range got[:len(got)-1] {
		assert.NotContains(t, c, "\uFFFD")
	}

	tk, _ = loadFamily(t, "llama3")
	ids, err = tk.Encode("x 你好🙂", false)
	require.NoError(t, err)
	d = tk.NewStreamDecoder(false, nil)
	var all strings.Builder
	for _, id := range ids {
		c := d.Next(id)
		assert.NotContains(t, c, "\uFFFD")
		all.WriteString(c)
	}
	assert.Equal(t, "x 你好🙂", all.String())
}

// The prompt's last tokens give the first output token its context: a
// leading space the decoder strips at the start of a sequence is kept.
func TestStreamKeepsLeadingSpaceAfterPrompt(t *testing.T) {
	for _, fam := range []string{"llama2", "metaspace"} {
		tk, _ := loadFamily(t, fam)
		prompt, err := tk.Encode("Question: why?", true)
		require.NoError(t, err)
		// In the middle of a text, "Because" starts with a space token.
		whole, err := tk.Encode("Question: why? Because it is.", true)
		require.NoError(t, err)
		out := whole[len(prompt):]
		d := tk.NewStreamDecoder(true, prompt)
		var got strings.Builder
		for _, id := range out {
			got.WriteString(d.Next(id))
		}
		assert.Equal(t, " Because it is.", got.String(), fam)
		assert.Equal(t, "Because it is.", tk.Decode(out, true), fam)
	}
}

// A literal U+FFFD in the output is text like any other: it is returned,
// not held back as if it were an incomplete character.
func TestStreamReturnsLiteralReplacementCharacter(t *testing.T) {
	tk, _ := loadFamily(t, "llama3")
	ids, err := tk.Encode("ok \uFFFD", false)
	require.NoError(t, err)
	d := tk.NewStreamDecoder(true, nil)
	var got strings.Builder
	for _, id := range ids {
		got.WriteString(d.Next(id))
	}
	assert.Equal(t, "ok \uFFFD", got.String())
}

// The window stays small however long the stream.
func TestStreamWindowIsBounded(t *testing.T) {
	tk, prompt, ids := loadBench(t)
	d := tk.NewStreamDecoder(true, ids[:100])
	var got strings.Builder
	for _, id := range ids {
		got.WriteString(d.Next(id))
		assert.LessOrEqual(t, len(d.ids), 16)
	}
	assert.Equal(t, prompt, got.String()[len(got.String())-len(prompt):])
}
