package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Parsing of the tokenizer.json components. Each component is selected by
// its "type"; a type this package does not implement is an error naming
// it, and so is a field the format requires that is missing.

type typed struct {
	Type *string `json:"type"`
}

// componentType returns the "type" of a component, "" for JSON null.
func componentType(kind string, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", fmt.Errorf("%s: %w", kind, err)
	}
	if t.Type == nil {
		return "", fmt.Errorf("%s: no \"type\" (components without one are not supported)", kind)
	}
	return *t.Type, nil
}

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func decodeInto(kind string, raw json.RawMessage, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	return nil
}

func missing(kind, field string) error { return fmt.Errorf("%s: missing field %q", kind, field) }

// orMissing is the error of a component that failed to decode (err) or,
// if it decoded, lacks a field it requires (fields: "a" or "a/b/c").
func orMissing(err error, kind, fields string) error {
	if err != nil {
		return err
	}
	return missing(kind, fields)
}

// parseSequence parses the elements of a Sequence component (S, a []T)
// with parse; an element that parses to nil (null, or a "type" of "") is
// an error.
func parseSequence[S ~[]T, T any](kind string, elems []json.RawMessage, parse func(json.RawMessage) (T, error)) (S, error) {
	seq := make(S, 0, len(elems))
	for _, r := range elems {
		x, err := parse(r)
		if err != nil {
			return nil, err
		}
		if any(x) == nil {
			return nil, errors.New(kind + ": null element")
		}
		seq = append(seq, x)
	}
	return seq, nil
}

// parseReplace parses a Replace normalizer or decoder.
func parseReplace(kind string, raw json.RawMessage) (matcher, string, error) {
	var v struct {
		Pattern *patternJSON `json:"pattern"`
		Content *string      `json:"content"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Content == nil {
		return nil, "", orMissing(err, kind, "content")
	}
	m, err := v.Pattern.matcher(kind)
	return m, *v.Content, err
}

// patternJSON is {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func (p *patternJSON) matcher(kind string) (matcher, error) {
	switch {
	case p == nil:
		return nil, missing(kind, "pattern")
	case p.String != nil && p.Regex == nil:
		return compilePattern(true, *p.String)
	case p.Regex != nil && p.String == nil:
		m, err := compilePattern(false, *p.Regex)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", kind)
}

// oneRune parses a JSON string holding exactly one character.
func oneRune(kind, field string, s *string) (rune, error) {
	if s == nil {
		return 0, missing(kind, field)
	}
	r, n := utf8.DecodeRuneInString(*s)
	if n == 0 || n != len(*s) {
		return 0, fmt.Errorf("%s: %q must be a single character", kind, field)
	}
	return r, nil
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	typ, err := componentType("normalizer", raw)
	if err != nil || typ == "" {
		return nil, err
	}
	kind := "normalizer " + typ
	switch typ {
	case "NFC":
		return unicodeNormalizer{norm.NFC}, nil
	case "NFD":
		return unicodeNormalizer{norm.NFD}, nil
	case "NFKC":
		return unicodeNormalizer{norm.NFKC}, nil
	case "NFKD":
		return unicodeNormalizer{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNormalizer{}, nil
	case "Nmt":
		return nmtNormalizer{}, nil
	case "StripAccents":
		return stripAccentsNormalizer{}, nil
	case "ByteLevel":
		return byteLevelNormalizer{}, nil
	case "Strip":
		var v struct {
			Left  *bool `json:"strip_left"`
			Right *bool `json:"strip_right"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Left == nil || v.Right == nil {
			return nil, orMissing(err, kind, "strip_left/strip_right")
		}
		return stripNormalizer{*v.Left, *v.Right}, nil
	case "Replace":
		m, content, err := parseReplace(kind, raw)
		if err != nil {
			return nil, err
		}
		return replaceNormalizer{m, content}, nil
	case "Prepend":
		var v struct {
			Prepend *string `json:"prepend"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Prepend == nil {
			return nil, orMissing(err, kind, "prepend")
		}
		return prependNormalizer{*v.Prepend}, nil
	case "BertNormalizer", "Bert":
		var v struct {
			CleanText    *bool `json:"clean_text"`
			ChineseChars *bool `json:"handle_chinese_chars"`
			StripAccents *bool `json:"strip_accents"`
			Lowercase    *bool `json:"lowercase"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.CleanText == nil || v.ChineseChars == nil || v.Lowercase == nil {
			return nil, orMissing(err, kind, "clean_text/handle_chinese_chars/lowercase")
		}
		n := bertNormalizer{cleanText: *v.CleanText, chineseChars: *v.ChineseChars, lowercase: *v.Lowercase}
		n.stripAccents = n.lowercase
		if v.StripAccents != nil {
			n.stripAccents = *v.StripAccents
		}
		return n, nil
	case "Sequence":
		var v struct {
			Normalizers *[]json.RawMessage `json:"normalizers"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Normalizers == nil {
			return nil, orMissing(err, kind, "normalizers")
		}
		return parseSequence[sequenceNormalizer](kind, *v.Normalizers, parseNormalizer)
	}
	return nil, fmt.Errorf("unsupported normalizer type %q", typ)
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	typ, err := componentType("pre_tokenizer", raw)
	if err != nil || typ == "" {
		return nil, err
	}
	kind := "pre_tokenizer " + typ
	switch typ {
	case "ByteLevel":
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
	case "Split":
		var v struct {
			Pattern  *patternJSON `json:"pattern"`
			Behavior *string      `json:"behavior"`
			Invert   *bool        `json:"invert"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Behavior == nil || v.Invert == nil {
			return nil, orMissing(err, kind, "behavior/invert")
		}
		b, err := parseBehavior(*v.Behavior)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind, err)
		}
		m, err := v.Pattern.matcher(kind)
		if err != nil {
			return nil, err
		}
		return splitPre{m: m, b: b, invert: *v.Invert}, nil
	case "Metaspace":
		m, err := parseMetaspace(kind, raw)
		if err != nil {
			return nil, err
		}
		return metaspacePre{rep: m.rep, repStr: string(m.rep), scheme: m.scheme, splitPieces: m.split}, nil
	case "Whitespace":
		return whitespacePre{}, nil
	case "WhitespaceSplit":
		return charSplitPre{isWhitespace, behRemoved}, nil
	case "Digits":
		var v struct {
			Individual *bool `json:"individual_digits"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Individual == nil {
			return nil, orMissing(err, kind, "individual_digits")
		}
		if *v.Individual {
			return charSplitPre{isNumber, behIsolated}, nil
		}
		return charSplitPre{isNumber, behContiguous}, nil
	case "Punctuation":
		var v struct {
			Behavior *string `json:"behavior"`
		}
		if err := decodeInto(kind, raw, &v); err != nil {
			return nil, err
		}
		b := behIsolated
		if v.Behavior != nil {
			if b, err = parseBehavior(*v.Behavior); err != nil {
				return nil, fmt.Errorf("%s: %w", kind, err)
			}
		}
		return charSplitPre{isPunct, b}, nil
	case "BertPreTokenizer":
		return sequencePre{charSplitPre{isWhitespace, behRemoved}, charSplitPre{isPunct, behIsolated}}, nil
	case "CharDelimiterSplit", "Delimiter":
		var v struct {
			Delimiter *string `json:"delimiter"`
		}
		if err := decodeInto(kind, raw, &v); err != nil {
			return nil, err
		}
		d, err := oneRune(kind, "delimiter", v.Delimiter)
		if err != nil {
			return nil, err
		}
		return charSplitPre{func(r rune) bool { return r == d }, behRemoved}, nil
	case "FixedLength":
		var v struct {
			Length *uint64 `json:"length"`
		}
		if err := decodeInto(kind, raw, &v); err != nil {
			return nil, err
		}
		n := uint64(5)
		if v.Length != nil {
			n = *v.Length
		}
		if n == 0 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%s: length must be in 1..%d", kind, math.MaxInt32)
		}
		return fixedLengthPre{int(n)}, nil
	case "Sequence":
		var v struct {
			PreTokenizers *[]json.RawMessage `json:"pretokenizers"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.PreTokenizers == nil {
			return nil, orMissing(err, kind, "pretokenizers")
		}
		return parseSequence[sequencePre](kind, *v.PreTokenizers, parsePreTokenizer)
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer type %q", typ)
}

type metaspaceConf struct {
	rep    rune
	scheme prependScheme
	split  bool
}

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
	if isNull(raw) {
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

type truncationConf struct {
	maxLength int
	left      bool
	onlyFirst bool
	second    bool // OnlySecond: an error once truncation is needed
}

func parseTruncation(raw json.RawMessage) (*truncationConf, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v struct {
		Direction *string `json:"direction"`
		MaxLength *uint64 `json:"max_length"`
		Strategy  *string `json:"strategy"`
		Stride    *uint64 `json:"stride"`
	}
	if err := decodeInto("truncation", raw, &v); err != nil || v.MaxLength == nil || v.Strategy == nil || v.Stride == nil {
		return nil, orMissing(err, "truncation", "max_length/strategy/stride")
	}
	c := &truncationConf{maxLength: int(min(*v.MaxLength, math.MaxInt32))}
	if v.Direction != nil {
		switch *v.Direction {
		case "Left":
			c.left = true
		case "Right":
		default:
			return nil, fmt.Errorf("truncation: unsupported direction %q", *v.Direction)
		}
	}
	switch *v.Strategy {
	case "LongestFirst":
	case "OnlyFirst":
		c.onlyFirst = true
	case "OnlySecond":
		c.second = true
	default:
		return nil, fmt.Errorf("truncation: unsupported strategy %q", *v.Strategy)
	}
	return c, nil
}

type paddingConf struct {
	fixed    int // -1: BatchLongest
	multiple int
	left     bool
	padID    int
}

func parsePadding(raw json.RawMessage) (*paddingConf, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v struct {
		Strategy  json.RawMessage `json:"strategy"`
		Direction *string         `json:"direction"`
		Multiple  *uint64         `json:"pad_to_multiple_of"`
		PadID     *uint32         `json:"pad_id"`
		PadType   *uint32         `json:"pad_type_id"`
		PadToken  *string         `json:"pad_token"`
	}
	if err := decodeInto("padding", raw, &v); err != nil || v.Direction == nil || v.PadID == nil || v.PadType == nil || v.PadToken == nil || isNull(v.Strategy) {
		return nil, orMissing(err, "padding", "strategy/direction/pad_id/pad_type_id/pad_token")
	}
	c := &paddingConf{fixed: -1, padID: int(*v.PadID)}
	var s string
	var fixed struct {
		Fixed *uint64 `json:"Fixed"`
	}
	switch {
	case json.Unmarshal(v.Strategy, &s) == nil && s == "BatchLongest":
	case json.Unmarshal(v.Strategy, &fixed) == nil && fixed.Fixed != nil:
		if *fixed.Fixed > 1<<24 {
			return nil, errors.New("padding: fixed length too large")
		}
		c.fixed = int(*fixed.Fixed)
	default:
		return nil, fmt.Errorf("padding: unsupported strategy %s", strings.TrimSpace(string(v.Strategy)))
	}
	switch *v.Direction {
	case "Left":
		c.left = true
	case "Right":
	default:
		return nil, fmt.Errorf("padding: unsupported direction %q", *v.Direction)
	}
	if v.Multiple != nil {
		if *v.Multiple > 1<<24 {
			return nil, errors.New("padding: pad_to_multiple_of too large")
		}
		c.multiple = int(*v.Multiple)
	}
	return c, nil
}

// parseMerges accepts both spellings of BPE merges: [["a", "b"], ...] and
// ["a b", ...] (lines of a merges.txt; "#version" lines are skipped).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	b := bytes.TrimLeft(raw, " \t\r\n")
	if len(b) > 0 && b[0] == '[' {
		b = bytes.TrimLeft(b[1:], " \t\r\n")
	}
	if len(b) == 0 || b[0] != '"' {
		var pairs [][]string
		if err := json.Unmarshal(raw, &pairs); err != nil {
			return nil, errors.New("model BPE: merges must be a list of [a, b] pairs or of \"a b\" strings")
		}
		out := make([][2]string, len(pairs))
		for i, p := range pairs {
			if len(p) != 2 {
				return nil, fmt.Errorf("model BPE: merge %d is not a pair", i)
			}
			out[i] = [2]string{p[0], p[1]}
		}
		return out, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, errors.New("model BPE: merges must be a list of [a, b] pairs or of \"a b\" strings")
	}
	out := make([][2]string, 0, len(lines))
	for _, l := range lines {
		if strings.HasPrefix(l, "#version") {
			continue
		}
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("model BPE: merge %d (%q) is not two tokens separated by a space", len(out)+1, l)
		}
		out = append(out, [2]string{a, b})
	}
	return out, nil
}

func parseModel(raw json.RawMessage) (model, error) {
	if isNull(raw) {
		return nil, errors.New("model: missing")
	}
	typ, err := componentType("model", raw)
	if err != nil {
		// Files from before components had a "type": a BPE is recognised
		// by its merges.
		var probe struct {
			Merges json.RawMessage `json:"merges"`
		}
		if json.Unmarshal(raw, &probe) != nil || isNull(probe.Merges) {
			return nil, err
		}
		typ = "BPE"
	}
	kind := "model " + typ
	switch typ {
	case "BPE":
		var v struct {
			Dropout      *float64           `json:"dropout"`
			Unk          *string            `json:"unk_token"`
			Prefix       *string            `json:"continuing_subword_prefix"`
			Suffix       *string            `json:"end_of_word_suffix"`
			FuseUnk      *bool              `json:"fuse_unk"`
			ByteFallback *bool              `json:"byte_fallback"`
			IgnoreMerges *bool              `json:"ignore_merges"`
			Vocab        *map[string]uint32 `json:"vocab"`
			Merges       json.RawMessage    `json:"merges"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil || isNull(v.Merges) {
			return nil, orMissing(err, kind, "vocab/merges")
		}
		if v.Dropout != nil && *v.Dropout != 0 {
			if *v.Dropout < 0 || *v.Dropout > 1 {
				return nil, fmt.Errorf("%s: dropout must be in [0, 1]", kind)
			}
			return nil, fmt.Errorf("%s: dropout %v is not supported (it makes encoding random)", kind, *v.Dropout)
		}
		merges, err := parseMerges(v.Merges)
		if err != nil {
			return nil, err
		}
		str := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		flag := func(p *bool) bool { return p != nil && *p }
		return newBPE(*v.Vocab, merges, v.Unk, str(v.Prefix), str(v.Suffix), flag(v.FuseUnk), flag(v.ByteFallback), flag(v.IgnoreMerges))
	case "WordLevel":
		var v struct {
			Vocab *map[string]uint32 `json:"vocab"`
			Unk   *string            `json:"unk_token"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil || v.Unk == nil {
			return nil, orMissing(err, kind, "vocab/unk_token")
		}
		return &wordLevelModel{vocabulary: newVocabulary(*v.Vocab), unk: *v.Unk}, nil
	case "WordPiece":
		var v struct {
			Vocab    *map[string]uint32 `json:"vocab"`
			Unk      *string            `json:"unk_token"`
			Prefix   *string            `json:"continuing_subword_prefix"`
			MaxChars *uint64            `json:"max_input_chars_per_word"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil || v.Unk == nil || v.Prefix == nil || v.MaxChars == nil {
			return nil, orMissing(err, kind, "vocab/unk_token/continuing_subword_prefix/max_input_chars_per_word")
		}
		return newWordPiece(*v.Vocab, *v.Unk, *v.Prefix, int(min(*v.MaxChars, math.MaxInt32))), nil
	case "Unigram":
		var v struct {
			Vocab        *[][]json.RawMessage `json:"vocab"`
			UnkID        *uint64              `json:"unk_id"`
			ByteFallback *bool                `json:"byte_fallback"`
		}
		if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil {
			return nil, orMissing(err, kind, "vocab")
		}
		pieces := make([]unigramPiece, len(*v.Vocab))
		for i, e := range *v.Vocab {
			if len(e) != 2 || json.Unmarshal(e[0], &pieces[i].tok) != nil || json.Unmarshal(e[1], &pieces[i].score) != nil {
				return nil, fmt.Errorf("%s: vocab entry %d must be [token, score]", kind, i)
			}
		}
		var unk *int
		if v.UnkID != nil {
			u := int(min(*v.UnkID, math.MaxInt32))
			unk = &u
		}
		return newUnigram(pieces, unk, v.ByteFallback != nil && *v.ByteFallback)
	}
	return nil, fmt.Errorf("unsupported model type %q", typ)
}
