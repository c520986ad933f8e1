package tokenizer

import "strings"

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(toks []string, _ *bool) []string {
	return []string{strings.Join(toks, "")}
}
