package tokenizer

// Parsing of the pipeline's components in tokenizer.json: the normalizer,
// the pre-tokenizer, the decoder and the post-processor (config.go holds
// the rules every component follows, the model and the file's settings).

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
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

// tokenAndID is the ["token", id] pair of Bert/Roberta processing.
func tokenAndID(kind, field string, raw json.RawMessage) (int, error) {
	var pair []json.RawMessage
	if jsonscan.IsNull(raw) {
		return 0, missing(kind, field)
	}
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return 0, fmt.Errorf("%s: %q must be [token, id]", kind, field)
	}
	var tok string
	var id uint32
	if json.Unmarshal(pair[0], &tok) != nil || json.Unmarshal(pair[1], &id) != nil {
		return 0, fmt.Errorf("%s: %q must be [token, id]", kind, field)
	}
	return int(id), nil
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	typ, err := componentType("post_processor", raw)
	if err != nil || typ == "" {
		return nil, err
	}
	kind := "post_processor " + typ
	switch typ {
	case "ByteLevel":
		return byteLevelPost{}, nil
	case "TemplateProcessing":
		return parseTemplate(kind, raw)
	case "BertProcessing", "RobertaProcessing":
		var v struct {
			Sep json.RawMessage `json:"sep"`
			Cls json.RawMessage `json:"cls"`
		}
		if err := decodeInto(kind, raw, &v); err != nil {
			return nil, err
		}
		sep, err := tokenAndID(kind, "sep", v.Sep)
		if err != nil {
			return nil, err
		}
		cls, err := tokenAndID(kind, "cls", v.Cls)
		if err != nil {
			return nil, err
		}
		return clsSepPost{cls: cls, sep: sep}, nil
	case "Sequence":
		var v struct {
			Processors *[]json.RawMessage `json:"processors"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Processors == nil {
			return nil, orMissing(err, kind, "processors")
		}
		return parseSequence[sequencePost](kind, *v.Processors, parsePostProcessor)
	}
	return nil, fmt.Errorf("unsupported post_processor type %q", typ)
}

func parseTemplate(kind string, raw json.RawMessage) (postProcessor, error) {
	type pieceJSON struct {
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
	}
	var v struct {
		Single        *[]pieceJSON `json:"single"`
		Pair          *[]pieceJSON `json:"pair"`
		SpecialTokens *map[string]struct {
			ID     string   `json:"id"`
			IDs    []uint32 `json:"ids"`
			Tokens []string `json:"tokens"`
		} `json:"special_tokens"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Single == nil || v.Pair == nil || v.SpecialTokens == nil {
		return nil, orMissing(err, kind, "single/pair/special_tokens")
	}
	var t templatePost
	for _, p := range *v.Single {
		switch {
		case p.Sequence != nil && p.SpecialToken == nil:
			if p.Sequence.ID != "A" {
				return nil, fmt.Errorf("%s: the single template uses sequence %q", kind, p.Sequence.ID)
			}
			t = append(t, templatePiece{seq: true})
		case p.SpecialToken != nil && p.Sequence == nil:
			st, ok := (*v.SpecialTokens)[p.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("%s: missing special token %q", kind, p.SpecialToken.ID)
			}
			if len(st.IDs) != len(st.Tokens) {
				return nil, fmt.Errorf("%s: special token %q: ids and tokens differ in length", kind, p.SpecialToken.ID)
			}
			ids := make([]int, len(st.IDs))
			for i, id := range st.IDs {
				ids[i] = int(id)
			}
			t = append(t, templatePiece{ids: ids})
		default:
			return nil, fmt.Errorf("%s: template pieces must be {\"Sequence\": ...} or {\"SpecialToken\": ...}", kind)
		}
	}
	return t, nil
}
