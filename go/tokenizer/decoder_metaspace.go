package tokenizer

import (
	"encoding/json"
	"strings"
)

type metaspaceDecoder struct {
	rep    rune
	scheme prependScheme
}

// parseMetaspaceDecoder parses a "Metaspace" decoder.
func parseMetaspaceDecoder(kind string, raw json.RawMessage) (decoder, error) {
	m, err := parseMetaspace(kind, raw)
	if err != nil {
		return nil, err
	}
	return metaspaceDecoder{rep: m.rep, scheme: m.scheme}, nil
}

func (d metaspaceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		var b strings.Builder
		for _, r := range t {
			switch {
			case r != d.rep:
				b.WriteRune(r)
			case i == 0 && d.scheme != prependNever:
			default:
				b.WriteByte(' ')
			}
		}
		return b.String()
	})
}
