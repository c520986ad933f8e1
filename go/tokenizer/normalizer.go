package tokenizer

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
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

type sequenceNormalizer []normalizer

// parseSequenceNormalizer parses a "Sequence" of normalizers.
func parseSequenceNormalizer(kind string, raw json.RawMessage) (normalizer, error) {
	var v struct {
		Normalizers *[]json.RawMessage `json:"normalizers"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Normalizers == nil {
		return nil, orMissing(err, kind, "normalizers")
	}
	return parseSequence[sequenceNormalizer](kind, *v.Normalizers, parseNormalizer)
}

func (n sequenceNormalizer) normalize(s string) (string, error) {
	for _, m := range n {
		var err error
		if s, err = m.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}
