package tokenizer

import (
	"encoding/json"
	"strings"
)

type stripNormalizer struct{ left, right bool }

// parseStripNormalizer parses a "Strip" normalizer.
func parseStripNormalizer(kind string, raw json.RawMessage) (normalizer, error) {
	var v struct {
		Left  *bool `json:"strip_left"`
		Right *bool `json:"strip_right"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Left == nil || v.Right == nil {
		return nil, orMissing(err, kind, "strip_left/strip_right")
	}
	return stripNormalizer{*v.Left, *v.Right}, nil
}

func (n stripNormalizer) normalize(s string) (string, error) {
	if n.left {
		s = strings.TrimLeftFunc(s, isWhitespace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isWhitespace)
	}
	return s, nil
}
