package tokenizer

// nmtNormalizer drops control characters and maps other separators to a space.
type nmtNormalizer struct{}

func (nmtNormalizer) normalize(s string) (string, error) {
	return mapRunes(s, func(r rune) (rune, bool) {
		switch {
		case r >= 0x1 && r <= 0x8, r == 0xB, r >= 0xE && r <= 0x1F, r == 0x7F, r == 0x8F, r == 0x9F:
			return 0, false
		case r == 0x9, r == 0xA, r == 0xC, r == 0xD, r == 0x1680, r >= 0x200B && r <= 0x200F,
			r == 0x2028, r == 0x2029, r == 0x2581, r == 0xFEFF, r == 0xFFFD:
			return ' ', true
		}
		return r, true
	}), nil
}
