package tokenizer

import "encoding/json"

type prependNormalizer struct{ prefix string }

// parsePrependNormalizer parses a "Prepend" normalizer.
func parsePrependNormalizer(kind string, raw json.RawMessage) (normalizer, error) {
	var v struct {
		Prepend *string `json:"prepend"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Prepend == nil {
		return nil, orMissing(err, kind, "prepend")
	}
	return prependNormalizer{*v.Prepend}, nil
}

func (n prependNormalizer) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return n.prefix + s, nil
}
