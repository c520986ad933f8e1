package tokenizer

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// One *Tokenizer shared by many goroutines (run with -race): every
// result is the one the vectors expect, while the word cache fills, is
// read and is reset concurrently.
func TestConcurrentUse(t *testing.T) {
	for _, fam := range []string{"llama3", "llama2", "gpt2", "unigram", "wordpiece"} {
		tk, v := loadFamily(t, fam)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range v.Cases {
					c := v.Cases[(i+g*17)%len(v.Cases)]
					ids, err := tk.Encode(c.Text, true)
					if !assert.NoError(t, err) || !assert.Equal(t, c.IDs, nonNil(ids), "%s: %s", fam, short(c.Text)) {
						return
					}
					assert.Equal(t, c.Decode, tk.Decode(ids, true))
					d := tk.NewStreamDecoder(true, nil)
					for _, id := range ids {
						d.Next(id)
					}
				}
			}()
		}
		wg.Wait()
	}
}

// The word cache stays bounded whatever the number of distinct words.
func TestWordCacheIsBounded(t *testing.T) {
	c := newWordCache()
	for i := range 100000 {
		w := []byte{byte(i), byte(i >> 8), byte(i >> 16), 'x'}
		c.put(string(w), []int{i})
		if ids, ok := c.get(w); assert.True(t, ok) {
			assert.Equal(t, []int{i}, ids)
		}
	}
	n := 0
	for i := range c.shards {
		n += len(c.shards[i].m)
	}
	assert.LessOrEqual(t, n, cacheShards*cacheShardCapacity)
}
