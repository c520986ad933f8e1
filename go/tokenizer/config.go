package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// The tokenizer.json document. FromJSON reads its top level (version,
// added_tokens, truncation, padding and the five components); each
// component is dispatched by its "type" to the parser that sits beside its
// behaviour, in a file named by stage and component (model_bpe.go,
// normalizer_bert.go, pretokenizer_metaspace.go, postprocessor_template.go,
// decoder_ctc.go, ...). A type this package does not implement is an error
// naming it, and so is a field the format requires that is missing; the
// rules every component's parser follows are at the end of this file.

// FromJSON parses a tokenizer.json. An unsupported component (model,
// normalizer, pre-tokenizer, post-processor or decoder type) is an error
// that names it, never a silent mis-tokenization.
func FromJSON(data []byte) (*Tokenizer, error) {
	t, err := fromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	return t, nil
}

func fromJSON(data []byte) (*Tokenizer, error) {
	var f struct {
		Version       *string           `json:"version"`
		Truncation    json.RawMessage   `json:"truncation"`
		Padding       json.RawMessage   `json:"padding"`
		AddedTokens   []json.RawMessage `json:"added_tokens"`
		Normalizer    json.RawMessage   `json:"normalizer"`
		PreTokenizer  json.RawMessage   `json:"pre_tokenizer"`
		PostProcessor json.RawMessage   `json:"post_processor"`
		Decoder       json.RawMessage   `json:"decoder"`
		Model         json.RawMessage   `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if f.Version != nil && *f.Version != "1.0" {
		return nil, fmt.Errorf("unknown version %q", *f.Version)
	}
	t := &Tokenizer{}
	var err error
	parseStep(&err, &t.model, parseModel, f.Model)
	parseStep(&err, &t.normalizer, parseNormalizer, f.Normalizer)
	parseStep(&err, &t.pre, parsePreTokenizer, f.PreTokenizer)
	parseStep(&err, &t.post, parsePostProcessor, f.PostProcessor)
	parseStep(&err, &t.decoder, parseDecoder, f.Decoder)
	parseStep(&err, &t.trunc, parseTruncation, f.Truncation)
	parseStep(&err, &t.pad, parsePadding, f.Padding)
	if err != nil {
		return nil, err
	}
	if err := t.addTokens(f.AddedTokens); err != nil {
		return nil, err
	}
	t.vocabSize = t.model.maxID() + 1
	maxAdded := -1
	for id := range t.addedByID {
		t.vocabSize = max(t.vocabSize, id+1)
		maxAdded = max(maxAdded, id)
	}
	if maxAdded < 1<<24 {
		t.addedDense = make([]*addedToken, maxAdded+1)
		for id, a := range t.addedByID {
			t.addedDense[id] = a
		}
	}
	// Decoding skips, with special tokens, any id whose text is the
	// content of a special token.
	t.skipIDs = map[int]bool{}
	for c := range t.specialContent {
		if id, ok := t.model.tokenToID(c); ok {
			if tok, _ := t.IDToToken(id); tok == c {
				t.skipIDs[id] = true
			}
		}
	}
	for id, a := range t.addedByID {
		if t.specialContent[a.form] {
			t.skipIDs[id] = true
		}
	}
	return t, nil
}

// parseStep sets *dst to parse(raw), unless an earlier step failed: the
// first error (*err) is the one reported, and nothing parses after it.
func parseStep[T any](err *error, dst *T, parse func(json.RawMessage) (T, error), raw json.RawMessage) {
	if *err == nil {
		*dst, *err = parse(raw)
	}
}

type truncationConf struct {
	maxLength int
	left      bool
	onlyFirst bool
	second    bool // OnlySecond: an error once truncation is needed
}

func parseTruncation(raw json.RawMessage) (*truncationConf, error) {
	if jsonscan.IsNull(raw) {
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
	if jsonscan.IsNull(raw) {
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
	if err := decodeInto("padding", raw, &v); err != nil || v.Direction == nil || v.PadID == nil || v.PadType == nil || v.PadToken == nil || jsonscan.IsNull(v.Strategy) {
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

func parseModel(raw json.RawMessage) (model, error) {
	if jsonscan.IsNull(raw) {
		return nil, errors.New("model: missing")
	}
	typ, err := componentType("model", raw)
	if err != nil {
		legacy, ok := legacyModelType(raw)
		if !ok {
			return nil, err
		}
		typ = legacy
	}
	kind := "model " + typ
	switch typ {
	case "BPE":
		return parseBPEModel(kind, raw)
	case "WordLevel":
		return parseWordLevelModel(kind, raw)
	case "WordPiece":
		return parseWordPieceModel(kind, raw)
	case "Unigram":
		return parseUnigramModel(kind, raw)
	}
	return nil, fmt.Errorf("unsupported model type %q", typ)
}

// legacyModelType recognises the model of a file from before models had a
// "type" (bert-base-uncased's, for one) by the fields it has, as the
// tokenizers library does, trying each model in its order: BPE (vocab and
// merges), WordPiece (vocab, unk_token, continuing_subword_prefix and
// max_input_chars_per_word), WordLevel (vocab and unk_token), Unigram (a
// vocab that is a list of pieces and scores).
func legacyModelType(raw json.RawMessage) (string, bool) {
	var f map[string]json.RawMessage
	if json.Unmarshal(raw, &f) != nil {
		return "", false
	}
	has := func(name string) bool { return !jsonscan.IsNull(f[name]) }
	vocab := jsonscan.Trim(f["vocab"])
	vocabMap := len(vocab) > 0 && vocab[0] == '{'
	switch {
	case vocabMap && has("merges"):
		return "BPE", true
	case vocabMap && has("unk_token") && has("continuing_subword_prefix") && has("max_input_chars_per_word"):
		return "WordPiece", true
	case vocabMap && has("unk_token"):
		return "WordLevel", true
	case len(vocab) > 0 && vocab[0] == '[':
		return "Unigram", true
	}
	return "", false
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
		return parseStripNormalizer(kind, raw)
	case "Replace":
		return parseReplaceNormalizer(kind, raw)
	case "Prepend":
		return parsePrependNormalizer(kind, raw)
	case "BertNormalizer", "Bert":
		return parseBertNormalizer(kind, raw)
	case "Sequence":
		return parseSequenceNormalizer(kind, raw)
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
		return parseByteLevelPre(kind, raw)
	case "Split":
		return parseSplitPre(kind, raw)
	case "Metaspace":
		return parseMetaspacePre(kind, raw)
	case "Whitespace":
		return whitespacePre{}, nil
	case "WhitespaceSplit":
		return charSplitPre{isWhitespace, behRemoved}, nil
	case "Digits":
		return parseDigitsPre(kind, raw)
	case "Punctuation":
		return parsePunctuationPre(kind, raw)
	case "BertPreTokenizer":
		return sequencePre{charSplitPre{isWhitespace, behRemoved}, charSplitPre{isPunct, behIsolated}}, nil
	case "CharDelimiterSplit", "Delimiter":
		return parseCharDelimiterSplitPre(kind, raw)
	case "FixedLength":
		return parseFixedLengthPre(kind, raw)
	case "Sequence":
		return parseSequencePre(kind, raw)
	}
	return nil, fmt.Errorf("unsupported pre_tokenizer type %q", typ)
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
		return parseBertPost(kind, raw)
	case "Sequence":
		return parseSequencePost(kind, raw)
	}
	return nil, fmt.Errorf("unsupported post_processor type %q", typ)
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
		return parseMetaspaceDecoder(kind, raw)
	case "Replace":
		return parseReplaceDecoder(kind, raw)
	case "ByteFallback":
		return byteFallbackDecoder{}, nil
	case "Fuse":
		return fuseDecoder{}, nil
	case "Strip":
		return parseStripDecoder(kind, raw)
	case "WordPiece":
		return parseWordPieceDecoder(kind, raw)
	case "BPEDecoder":
		return parseBPEDecoder(kind, raw)
	case "CTC":
		return parseCTCDecoder(kind, raw)
	case "Sequence":
		return parseSequenceDecoder(kind, raw)
	}
	return nil, fmt.Errorf("unsupported decoder type %q", typ)
}

type typed struct {
	Type *string `json:"type"`
}

// componentType returns the "type" of a component, "" for JSON null.
func componentType(kind string, raw json.RawMessage) (string, error) {
	if jsonscan.IsNull(raw) {
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
