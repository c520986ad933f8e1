package tokenizer

import (
	"encoding/json"
	"fmt"
)

// charSplitPre splits on the characters pred accepts: the behaviour of the
// WhitespaceSplit, Digits, Punctuation and CharDelimiterSplit
// pre-tokenizers (and, two of them in sequence, of BertPreTokenizer).
type charSplitPre struct {
	pred func(rune) bool
	b    behavior
}

// parseDigitsPre parses a "Digits" pre-tokenizer.
func parseDigitsPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		Individual *bool `json:"individual_digits"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Individual == nil {
		return nil, orMissing(err, kind, "individual_digits")
	}
	if *v.Individual {
		return charSplitPre{isNumber, behIsolated}, nil
	}
	return charSplitPre{isNumber, behContiguous}, nil
}

// parsePunctuationPre parses a "Punctuation" pre-tokenizer.
func parsePunctuationPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		Behavior *string `json:"behavior"`
	}
	if err := decodeInto(kind, raw, &v); err != nil {
		return nil, err
	}
	b := behIsolated
	if v.Behavior != nil {
		var err error
		if b, err = parseBehavior(*v.Behavior); err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
	}
	return charSplitPre{isPunct, b}, nil
}

// parseCharDelimiterSplitPre parses a "CharDelimiterSplit" pre-tokenizer.
func parseCharDelimiterSplitPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		Delimiter *string `json:"delimiter"`
	}
	if err := decodeInto(kind, raw, &v); err != nil {
		return nil, err
	}
	d, err := oneRune(kind, "delimiter", v.Delimiter)
	if err != nil {
		return nil, err
	}
	return charSplitPre{func(r rune) bool { return r == d }, behRemoved}, nil
}

func (t charSplitPre) split(p piece, out sink) error {
	p = textOf(p)
	return splitWith(p.s, charMatcher{t.pred}, false, t.b, emitRanges(p, out))
}
