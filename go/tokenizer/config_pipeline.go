package tokenizer

// Parsing of the pipeline's components in tokenizer.json: the normalizer,
// the pre-tokenizer, the decoder and the post-processor (config.go holds
// the rules every component follows, the model and the file's settings).

import (
	"encoding/json"
	"fmt"
	"math"
)

func parseDecoder(raw json.RawMessage) (decoder, error) {
	typ, err := componentType("decoder", raw)
	if err != nil || typ == "" {
		return nil, err
	}
	kind := "decoder " + typ
	switch typ {
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "Metaspace":
		m, err := parseMetaspace(kind, raw)
		if err != nil {
			return nil, err
		}
		return metaspaceDecoder{rep: m.rep, scheme: m.scheme}, nil
	case "Replace":
		m, content, err := parseReplace(kind, raw)
		if err != nil {
			return nil, err
		}
		return replaceDecoder{m, content}, nil
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
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
	case "WordPiece":
		var v struct {
			Prefix  *string `json:"prefix"`
			Cleanup *bool   `json:"cleanup"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Prefix == nil || v.Cleanup == nil {
			return nil, orMissing(err, kind, "prefix/cleanup")
		}
		return wordPieceDecoder{*v.Prefix, *v.Cleanup}, nil
	case "BPEDecoder":
		var v struct {
			Suffix *string `json:"suffix"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Suffix == nil {
			return nil, orMissing(err, kind, "suffix")
		}
		return bpeDecoder{*v.Suffix}, nil
	case "CTC":
		var v struct {
			Pad     *string `json:"pad_token"`
			Delim   *string `json:"word_delimiter_token"`
			Cleanup *bool   `json:"cleanup"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Pad == nil || v.Delim == nil || v.Cleanup == nil {
			return nil, orMissing(err, kind, "pad_token/word_delimiter_token/cleanup")
		}
		return ctcDecoder{*v.Pad, *v.Delim, *v.Cleanup}, nil
	case "Sequence":
		var v struct {
			Decoders *[]json.RawMessage `json:"decoders"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Decoders == nil {
			return nil, orMissing(err, kind, "decoders")
		}
		return parseSequence[sequenceDecoder](kind, *v.Decoders, parseDecoder)
	}
	return nil, fmt.Errorf("unsupported decoder type %q", typ)
}
