package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites the text of a piece before pre-tokenization.
type normalizer interface {
	normalize(s string) (string, error)
}

// normalizeLead returns what normalization makes of the leading part of a
// string (the bytes that stem from the input's first character): how the
// format tracks whether a piece still starts at the beginning of the
// input, which Metaspace's "first" prepend scheme depends on.
func normalizeLead(n normalizer, lead string) string {
	switch n := n.(type) {
	case stripNormalizer:
		if n.left {
			return strings.TrimLeftFunc(lead, isWhitespace)
		}
		return lead
	case sequenceNormalizer:
		for _, m := range n {
			lead = normalizeLead(m, lead)
		}
		return lead
	}
	out, err := n.normalize(lead)
	if err != nil {
		return lead
	}
	return out
}

type unicodeNormalizer struct{ form norm.Form }

func (n unicodeNormalizer) normalize(s string) (string, error) { return n.form.String(s), nil }

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

type stripNormalizer struct{ left, right bool }

func (n stripNormalizer) normalize(s string) (string, error) {
	if n.left {
		s = strings.TrimLeftFunc(s, isWhitespace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isWhitespace)
	}
	return s, nil
}

type replaceNormalizer struct {
	m       matcher
	content string
}

func (n replaceNormalizer) normalize(s string) (string, error) {
	return replaceAll(s, n.m, n.content)
}

func replaceAll(s string, m matcher, content string) (string, error) {
	if s == "" {
		return s, nil
	}
	var b []byte
	last := 0
	err := m.findAll(s, func(st, en int) error {
		if b == nil {
			b = make([]byte, 0, len(s)+len(content))
		}
		b = append(b, s[last:st]...)
		b = append(b, content...)
		last = en
		return nil
	})
	if err != nil || b == nil {
		return s, err
	}
	b = append(b, s[last:]...)
	return string(b), nil
}

type prependNormalizer struct{ prefix string }

func (n prependNormalizer) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return n.prefix + s, nil
}

type byteLevelNormalizer struct{}

func (byteLevelNormalizer) normalize(s string) (string, error) { return byteLevelMap(s), nil }

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

// mapRunes maps and filters the characters of s.
func mapRunes(s string, f func(rune) (rune, bool)) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if m, keep := f(r); keep {
			b = utf8.AppendRune(b, m)
		}
	}
	return string(b)
}

type stripAccentsNormalizer struct{}

func (stripAccentsNormalizer) normalize(s string) (string, error) {
	return mapRunes(s, func(r rune) (rune, bool) { return r, !unicode.IsMark(r) }), nil
}

type bertNormalizer struct {
	cleanText, chineseChars, stripAccents, lowercase bool
}

func isChineseChar(r rune) bool {
	return r >= 0x4E00 && r <= 0x9FFF || r >= 0x3400 && r <= 0x4DBF || r >= 0x20000 && r <= 0x2A6DF ||
		r >= 0x2A700 && r <= 0x2B73F || r >= 0x2B740 && r <= 0x2B81F || r >= 0x2B920 && r <= 0x2CEAF ||
		r >= 0xF900 && r <= 0xFAFF || r >= 0x2F800 && r <= 0x2FA1F
}

func (n bertNormalizer) normalize(s string) (string, error) {
	if n.cleanText {
		s = mapRunes(s, func(r rune) (rune, bool) {
			if r == '\t' || r == '\n' || r == '\r' {
				return ' ', true
			}
			if r == 0 || r == 0xFFFD || isOther(r) {
				return 0, false
			}
			if isWhitespace(r) {
				return ' ', true
			}
			return r, true
		})
	}
	if n.chineseChars {
		var b []byte
		for _, r := range s {
			if isChineseChar(r) {
				b = append(b, ' ')
				b = utf8.AppendRune(b, r)
				b = append(b, ' ')
			} else {
				b = utf8.AppendRune(b, r)
			}
		}
		s = string(b)
	}
	if n.stripAccents {
		s = mapRunes(norm.NFD.String(s), func(r rune) (rune, bool) { return r, !unicode.Is(unicode.Mn, r) })
	}
	if n.lowercase {
		s, _ = lowercaseNormalizer{}.normalize(s)
	}
	return s, nil
}

type sequenceNormalizer []normalizer

func (n sequenceNormalizer) normalize(s string) (string, error) {
	for _, m := range n {
		var err error
		if s, err = m.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}
