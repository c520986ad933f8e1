package tokenizer

import "encoding/json"

// decoder turns the tokens of ids back into text pieces; Decode joins
// what the decoder chain returns. A decoder that reassembles bytes sets
// *pending when the text ends with bytes of a character that more tokens
// could complete (they are decoded as U+FFFD meanwhile).
type decoder interface {
	decodeChain(toks []string, pending *bool) []string
}

// mapTokens returns the result of f on each token (i is its index).
func mapTokens(toks []string, f func(i int, t string) string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = f(i, t)
	}
	return out
}

type sequenceDecoder []decoder

// parseSequenceDecoder parses a "Sequence" of decoders.
func parseSequenceDecoder(kind string, raw json.RawMessage) (decoder, error) {
	var v struct {
		Decoders *[]json.RawMessage `json:"decoders"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Decoders == nil {
		return nil, orMissing(err, kind, "decoders")
	}
	return parseSequence[sequenceDecoder](kind, *v.Decoders, parseDecoder)
}

func (d sequenceDecoder) decodeChain(toks []string, pending *bool) []string {
	for _, x := range d {
		toks = x.decodeChain(toks, pending)
	}
	return toks
}
