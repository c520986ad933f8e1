package tokenizer

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Texts whose characters take several bytes, so that byte-fallback and
// byte-level tokenizers code some of them as bytes.
var multibyteTexts = []string{
	"안녕하세요! 오늘",
	"Не пей вина, Гертруда... выпей чаю.",
	"१२३४५ and ३४५",
	"你好，世界🙂🙂 👩‍👩‍👧 end",
	"naïve café — ½ ∑ 𝔘𝔫𝔦",
}

// oneByOne is the stream's text after each id when ids come one at a time,
// in the manner of Hugging Face's DecodeStream.step: text[m] is everything
// returned for ids[:m].
func oneByOne(tk *Tokenizer, prompt, ids []int) []string {
	d := tk.NewStreamDecoder(true, prompt)
	text := make([]string, len(ids)+1)
	for i, id := range ids {
		text[i+1] = text[i] + d.Next(id)
	}
	return text
}

// Ids given in calls of 1 to 8 return, by the end of each call, all the
// text that is complete: the same as one id at a time, whatever the call
// sizes, so a stream that ends after any call has returned everything
// complete. Before, a call whose last id left a character incomplete
// returned nothing, and a stream ending there lost the text of the whole
// call ("안녕하세요" from "안녕하세요! 오늘").
func TestStreamBatchesReturnWhatIsComplete(t *testing.T) {
	for _, fam := range families(t) {
		tk, _ := loadFamily(t, fam)
		for _, text := range multibyteTexts {
			ids, err := tk.Encode(text, false)
			require.NoError(t, err)
			want := oneByOne(tk, nil, ids)
			for size := 1; size <= 8; size++ {
				d := tk.NewStreamDecoder(true, nil)
				got := ""
				for i := 0; i < len(ids); i += size {
					end := min(i+size, len(ids))
					got += d.Next(ids[i:end]...)
					require.Equal(t, want[end], got, "%s: %q in calls of %d, after %d ids", fam, text, size, end)
				}
			}
		}
	}
}

// A prompt that ends in characters coded as bytes does not spoil the
// output: its decoding context starts at a character, so the output's
// first characters are not taken for the rest of a broken byte run
// ("१२" then "३४५" streamed as "�४�" with Llama 2's byte fallback).
func TestStreamAfterPromptEndingInBytes(t *testing.T) {
	for _, fam := range families(t) {
		tk, _ := loadFamily(t, fam)
		for _, text := range multibyteTexts {
			ids, err := tk.Encode(text, false)
			require.NoError(t, err)
			whole := tk.Decode(ids, true)
			for k := 1; k < len(ids); k++ {
				prompt := tk.Decode(ids[:k], true)
				if strings.ContainsRune(prompt, 0xFFFD) || !strings.HasPrefix(whole, prompt) {
					continue // the prompt ends inside a character, or the decoder joins across k
				}
				for _, size := range []int{1, 3, 8} {
					d := tk.NewStreamDecoder(true, ids[:k])
					got := ""
					for i := k; i < len(ids); i += size {
						got += d.Next(ids[i:min(i+size, len(ids))]...)
					}
					assert.Equal(t, whole[len(prompt):], got, "%s: %q after %d prompt ids, calls of %d", fam, text, k, size)
				}
			}
		}
	}
}
