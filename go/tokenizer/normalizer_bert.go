package tokenizer

import (
	"encoding/json"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

type bertNormalizer struct {
	cleanText, chineseChars, stripAccents, lowercase bool
}

// parseBertNormalizer parses a "BertNormalizer" (or "Bert") normalizer.
func parseBertNormalizer(kind string, raw json.RawMessage) (normalizer, error) {
	var v struct {
		CleanText    *bool `json:"clean_text"`
		ChineseChars *bool `json:"handle_chinese_chars"`
		StripAccents *bool `json:"strip_accents"`
		Lowercase    *bool `json:"lowercase"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.CleanText == nil || v.ChineseChars == nil || v.Lowercase == nil {
		return nil, orMissing(err, kind, "clean_text/handle_chinese_chars/lowercase")
	}
	n := bertNormalizer{cleanText: *v.CleanText, chineseChars: *v.ChineseChars, lowercase: *v.Lowercase}
	n.stripAccents = n.lowercase
	if v.StripAccents != nil {
		n.stripAccents = *v.StripAccents
	}
	return n, nil
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
