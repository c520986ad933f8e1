package tokenizer

import "unicode/utf8"

type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(toks []string, pending *bool) []string {
	n := 0
	for _, t := range toks {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for _, t := range toks {
		mark := len(b)
		ok := true
		for _, r := range t {
			c, in := byteOf(r)
			if !in {
				ok = false
				break
			}
			b = append(b, c)
		}
		if !ok { // not byte-level text: taken as it is
			b = append(b[:mark], t...)
		}
	}
	*pending = incompleteTail(b)
	if utf8.Valid(b) {
		return []string{string(b)}
	}
	return []string{string(appendLossy(make([]byte, 0, len(b)+8), b))}
}
