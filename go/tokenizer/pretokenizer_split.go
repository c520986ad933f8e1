package tokenizer

import (
	"encoding/json"
	"fmt"
)

type splitPre struct {
	m      matcher
	b      behavior
	invert bool
}

// parseSplitPre parses a "Split" pre-tokenizer.
func parseSplitPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		Pattern  *patternJSON `json:"pattern"`
		Behavior *string      `json:"behavior"`
		Invert   *bool        `json:"invert"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Behavior == nil || v.Invert == nil {
		return nil, orMissing(err, kind, "behavior/invert")
	}
	b, err := parseBehavior(*v.Behavior)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kind, err)
	}
	m, err := v.Pattern.matcher(kind)
	if err != nil {
		return nil, err
	}
	return splitPre{m: m, b: b, invert: *v.Invert}, nil
}

func (t splitPre) split(p piece, out sink) error {
	p = textOf(p)
	return splitWith(p.s, t.m, t.invert, t.b, emitRanges(p, out))
}
