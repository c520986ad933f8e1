package tokenizer

import (
	"encoding/json"
	"strings"
)

type bpeDecoder struct{ suffix string }

// parseBPEDecoder parses a "BPEDecoder".
func parseBPEDecoder(kind string, raw json.RawMessage) (decoder, error) {
	var v struct {
		Suffix *string `json:"suffix"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Suffix == nil {
		return nil, orMissing(err, kind, "suffix")
	}
	return bpeDecoder{*v.Suffix}, nil
}

func (d bpeDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		rep := " "
		if i == len(toks)-1 {
			rep = ""
		}
		if d.suffix != "" {
			t = strings.ReplaceAll(t, d.suffix, rep)
		}
		return t
	})
}
