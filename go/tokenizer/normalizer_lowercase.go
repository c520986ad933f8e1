package tokenizer

import "unicode/utf8"

type lowercaseNormalizer struct{}

func (lowercaseNormalizer) normalize(s string) (string, error) {
	i := 0
	for i < len(s) && s[i] < utf8.RuneSelf && (s[i] < 'A' || s[i] > 'Z') {
		i++
	}
	if i == len(s) {
		return s, nil
	}
	b := make([]byte, 0, len(s)+8)
	b = append(b, s[:i]...)
	for _, r := range s[i:] {
		b = appendLower(b, r)
	}
	return string(b), nil
}
