package tokenizer

import "unicode"

type stripAccentsNormalizer struct{}

func (stripAccentsNormalizer) normalize(s string) (string, error) {
	return mapRunes(s, func(r rune) (rune, bool) { return r, !unicode.IsMark(r) }), nil
}
