package tokenizer

import (
	"encoding/json"
	"math"
)

type stripDecoder struct {
	content     rune
	start, stop int
}

// parseStripDecoder parses a "Strip" decoder.
func parseStripDecoder(kind string, raw json.RawMessage) (decoder, error) {
	var v struct {
		Content *string `json:"content"`
		Start   *uint64 `json:"start"`
		Stop    *uint64 `json:"stop"`
	}
	if err := decodeInto(kind, raw, &v); err != nil {
		return nil, err
	}
	c, err := oneRune(kind, "content", v.Content)
	if err != nil {
		return nil, err
	}
	if v.Start == nil || v.Stop == nil {
		return nil, missing(kind, "start/stop")
	}
	return stripDecoder{c, int(min(*v.Start, math.MaxInt32)), int(min(*v.Stop, math.MaxInt32))}, nil
}

func (d stripDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(_ int, t string) string {
		rs := []rune(t)
		lo := 0
		for lo < len(rs) && lo < d.start && rs[lo] == d.content {
			lo++
		}
		hi := len(rs)
		for k := 0; k < d.stop && hi > lo && rs[hi-1] == d.content; k++ {
			hi--
		}
		return string(rs[lo:hi])
	})
}
