package tokenizer

import "encoding/json"

type replaceDecoder struct {
	m       matcher
	content string
}

// parseReplaceDecoder parses a "Replace" decoder (its fields are the Replace
// normalizer's).
func parseReplaceDecoder(kind string, raw json.RawMessage) (decoder, error) {
	m, content, err := parseReplace(kind, raw)
	if err != nil {
		return nil, err
	}
	return replaceDecoder{m, content}, nil
}

func (d replaceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(_ int, t string) string {
		// A literal or built-in pattern cannot fail; a regex that times
		// out leaves the token as it is.
		r, err := replaceAll(t, d.m, d.content)
		if err != nil {
			return t
		}
		return r
	})
}
