package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

type metaspacePre struct {
	rep         rune
	repStr      string
	scheme      prependScheme
	splitPieces bool
}

// parseMetaspacePre parses a "Metaspace" pre-tokenizer.
func parseMetaspacePre(kind string, raw json.RawMessage) (preTokenizer, error) {
	m, err := parseMetaspace(kind, raw)
	if err != nil {
		return nil, err
	}
	return metaspacePre{rep: m.rep, repStr: string(m.rep), scheme: m.scheme, splitPieces: m.split}, nil
}

type metaspaceConf struct {
	rep    rune
	scheme prependScheme
	split  bool
}

// parseMetaspace parses the fields the Metaspace pre-tokenizer and decoder
// share.
func parseMetaspace(kind string, raw json.RawMessage) (metaspaceConf, error) {
	var v struct {
		Replacement    *string `json:"replacement"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		PrependScheme  *string `json:"prepend_scheme"`
		Split          *bool   `json:"split"`
	}
	var c metaspaceConf
	if err := decodeInto(kind, raw, &v); err != nil {
		return c, err
	}
	r, err := oneRune(kind, "replacement", v.Replacement)
	if err != nil {
		return c, err
	}
	c.rep, c.scheme, c.split = r, prependAlways, true
	if v.PrependScheme != nil {
		switch *v.PrependScheme {
		case "always":
			c.scheme = prependAlways
		case "first":
			c.scheme = prependFirst
		case "never":
			c.scheme = prependNever
		default:
			return c, fmt.Errorf("%s: unsupported prepend_scheme %q", kind, *v.PrependScheme)
		}
	}
	if v.AddPrefixSpace != nil && !*v.AddPrefixSpace {
		if c.scheme != prependNever {
			return c, fmt.Errorf("%s: add_prefix_space does not match declared prepend_scheme", kind)
		}
	}
	if v.Split != nil {
		c.split = *v.Split
	}
	return c, nil
}

func (t metaspacePre) split(p piece, out sink) error {
	p = textOf(p)
	if strings.IndexByte(p.s, ' ') >= 0 {
		if p.lead > 0 {
			p.lead = len(strings.ReplaceAll(p.s[:p.lead], " ", t.repStr))
		}
		p.s = strings.ReplaceAll(p.s, " ", t.repStr)
	}
	if !strings.HasPrefix(p.s, t.repStr) && (t.scheme == prependAlways || t.scheme == prependFirst && p.lead > 0) {
		p.s = t.repStr + p.s
		if p.lead > 0 {
			p.lead += len(t.repStr)
		}
	}
	if !t.splitPieces {
		if p.s == "" {
			return nil
		}
		return out.put(p)
	}
	rep := t.rep
	return splitWith(p.s, charMatcher{func(r rune) bool { return r == rep }}, false, behMergedWithNext, emitRanges(p, out))
}
