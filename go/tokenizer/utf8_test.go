package tokenizer

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Each maximal ill-formed subsequence becomes one U+FFFD; a proper prefix
// of a sequence at the end is an incomplete tail.
func TestLossyUTF8(t *testing.T) {
	for in, want := range map[string]string{
		"\xe2\x82A":            "\uFFFDA",
		"\xf0\x80\x80":         "\uFFFD\uFFFD\uFFFD",
		"\xed\xa0\x80":         "\uFFFD\uFFFD\uFFFD",
		"\xf4\x90":             "\uFFFD\uFFFD",
		"\xc0\x80":             "\uFFFD\uFFFD",
		"\xe2\x82":             "\uFFFD",
		"a\xff\xfeb":           "a\uFFFD\uFFFDb",
		"\xf0\x9f\x98":         "\uFFFD",
		"\xf0\x9f\x98\x80\x80": "😀\uFFFD",
		"\xe0\xa0\x80":         "\u0800",
		"plain ascii, é, 你好":   "plain ascii, é, 你好",
	} {
		assert.Equal(t, want, lossyString(in), "%q", in)
	}
	for in, want := range map[string]bool{
		"": false, "a": false, "\xe2": true, "\xe2\x82": true, "\xe2\x82\xac": false, "\xf0\x9f\x98": true,
		"\xf0\x80": false, "\xed\xa0": false, "\x80": false, "a\xc3": true, "\xff": false, "\xc3\x41": false,
	} {
		assert.Equal(t, want, incompleteTail([]byte(in)), "%q", in)
	}
	assert.True(t, validUpToIncompleteTail([]byte("ok\xe2\x82")))
	assert.False(t, validUpToIncompleteTail([]byte("\xffok\xe2\x82")))
}
