package tokenizer

import (
	"strings"
	"unicode/utf8"
)

type byteFallbackDecoder struct{}

// byteToken parses a "<0xXX>" token.
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	h := t[3:5]
	if h[0] == '+' { // an unsigned integer parse also accepts a plus sign
		h = h[1:]
	}
	var v byte
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

func (byteFallbackDecoder) decodeChain(toks []string, pending *bool) []string {
	out := make([]string, 0, len(toks))
	var bytes []byte
	flush := func(last bool) {
		if len(bytes) == 0 {
			return
		}
		if utf8.Valid(bytes) {
			out = append(out, string(bytes))
		} else {
			for range bytes {
				out = append(out, "\uFFFD")
			}
			if last && validUpToIncompleteTail(bytes) {
				*pending = true
			}
		}
		bytes = bytes[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			bytes = append(bytes, b)
			continue
		}
		flush(false)
		out = append(out, t)
	}
	flush(true)
	return out
}
