package tokenizer

import (
	"encoding/json"
	"strings"
	"sync"
)

type byteLevelPre struct{ addPrefixSpace, useRegex bool }

// parseByteLevelPre parses a "ByteLevel" pre-tokenizer.
func parseByteLevelPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		AddPrefixSpace *bool `json:"add_prefix_space"`
		UseRegex       *bool `json:"use_regex"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.AddPrefixSpace == nil {
		return nil, orMissing(err, kind, "add_prefix_space")
	}
	p := byteLevelPre{addPrefixSpace: *v.AddPrefixSpace, useRegex: true}
	if v.UseRegex != nil {
		p.useRegex = *v.UseRegex
	}
	return p, nil
}

var gpt2Scanner = scanMatcher{gpt2Next}

var byteLevelBufs = sync.Pool{New: func() any { return new([]byte) }}

func (t byteLevelPre) split(p piece, out sink) error {
	p = textOf(p)
	if t.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
		if p.lead > 0 {
			p.lead++
		}
	}
	if !t.useRegex {
		if p.s == "" {
			return nil
		}
		return putByteLevel(p, out)
	}
	return splitWith(p.s, gpt2Scanner, false, behIsolated, func(start, end int) error {
		return putByteLevel(p.sub(start, end), out)
	})
}

// putByteLevel gives out p spelled in the byte-level alphabet.
func putByteLevel(p piece, out sink) error {
	bp := byteLevelBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<16 { // huge buffers are not kept
			byteLevelBufs.Put(bp)
		}
	}()
	if p.lead > 0 {
		p.lead = byteLevelLen(p.s[:p.lead])
	}
	*bp = appendByteLevel((*bp)[:0], p.s)
	p.b, p.s = *bp, ""
	return out.put(p)
}
