package tokenizer

import (
	"encoding/json"
	"strings"
)

type ctcDecoder struct {
	pad, delim string
	cleanup    bool
}

// parseCTCDecoder parses a "CTC" decoder.
func parseCTCDecoder(kind string, raw json.RawMessage) (decoder, error) {
	var v struct {
		Pad     *string `json:"pad_token"`
		Delim   *string `json:"word_delimiter_token"`
		Cleanup *bool   `json:"cleanup"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Pad == nil || v.Delim == nil || v.Cleanup == nil {
		return nil, orMissing(err, kind, "pad_token/word_delimiter_token/cleanup")
	}
	return ctcDecoder{*v.Pad, *v.Delim, *v.Cleanup}, nil
}

func (d ctcDecoder) decodeChain(toks []string, _ *bool) []string {
	var out []string
	for i, t := range toks {
		if i > 0 && t == toks[i-1] {
			continue
		}
		if d.pad != "" {
			t = strings.ReplaceAll(t, d.pad, "")
		}
		if d.cleanup {
			t = cleanupText(t)
			if d.delim != "" {
				t = strings.ReplaceAll(t, d.delim, " ")
			}
		}
		if t != "" {
			out = append(out, t)
		}
	}
	return out
}
