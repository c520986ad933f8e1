package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// Tokenizer is a loaded tokenizer.json.
type Tokenizer struct {
	normalizer normalizer
	pre        preTokenizer
	model      model
	post       postProcessor
	decoder    decoder
	trunc      *truncationConf
	pad        *paddingConf

	addedByID      map[int]*addedToken
	addedDense     []*addedToken // addedByID as a slice, when its ids allow
	addedByContent map[string]int
	specialContent map[string]bool
	skipIDs        map[int]bool  // ids whose text is a special token's content
	rawMatcher     *addedMatcher // tokens matched on the raw text
	normMatcher    *addedMatcher // tokens matched after normalization
	vocabSize      int
}

type addedTokenJSON struct {
	ID         *uint32 `json:"id"`
	Content    *string `json:"content"`
	SingleWord *bool   `json:"single_word"`
	LStrip     *bool   `json:"lstrip"`
	RStrip     *bool   `json:"rstrip"`
	Normalized *bool   `json:"normalized"`
	Special    *bool   `json:"special"`
}

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

// addTokens registers the added tokens as the format does: a token takes
// the id its content already has (added earlier, or in the model's
// vocabulary), else the next id after the model's vocabulary; the "id"
// the file records is not consulted.
func (t *Tokenizer) addTokens(raw []json.RawMessage) error {
	t.addedByID = map[int]*addedToken{}
	t.addedByContent = map[string]int{}
	t.specialContent = map[string]bool{}
	nextID := t.model.size()
	for i, r := range raw {
		var j addedTokenJSON
		if err := json.Unmarshal(r, &j); err != nil {
			return fmt.Errorf("added_tokens[%d]: %w", i, err)
		}
		if j.ID == nil || j.Content == nil || j.SingleWord == nil || j.LStrip == nil || j.RStrip == nil || j.Normalized == nil || j.Special == nil {
			return fmt.Errorf("added_tokens[%d]: missing field (id, content, single_word, lstrip, rstrip, normalized and special are required)", i)
		}
		tok := &addedToken{content: *j.Content, special: *j.Special, singleWord: *j.SingleWord,
			lstrip: *j.LStrip, rstrip: *j.RStrip, normalized: *j.Normalized}
		if tok.content == "" {
			continue
		}
		if id, ok := t.addedByContent[tok.content]; ok {
			if old := t.addedByID[id]; old != nil && old.content == tok.content && old.special == tok.special &&
				old.singleWord == tok.singleWord && old.lstrip == tok.lstrip && old.rstrip == tok.rstrip && old.normalized == tok.normalized {
				continue
			}
		}
		id, ok := t.addedByContent[tok.content]
		if !ok {
			if id, ok = t.model.tokenToID(tok.content); !ok {
				id = nextID
				nextID++
			}
		}
		tok.id = id
		tok.form = tok.content
		if tok.normalized && t.normalizer != nil {
			n, err := t.normalizer.normalize(tok.content)
			if err != nil {
				return fmt.Errorf("added_tokens[%d]: %w", i, err)
			}
			tok.form = n
		}
		t.addedByContent[tok.content] = id
		if tok.special {
			t.specialContent[tok.content] = true
		}
		t.addedByID[id] = tok
	}
	// By id: where two tokens have the same text to match, the later one
	// (higher id) is found.
	ids := slices.Sorted(maps.Keys(t.addedByID))
	var raws, norms []*addedToken
	for _, id := range ids {
		tok := t.addedByID[id]
		switch {
		case !tok.normalized:
			raws = append(raws, tok)
		case tok.form != "":
			norms = append(norms, tok)
		}
	}
	t.rawMatcher = newAddedMatcher(raws, func(a *addedToken) string { return a.content })
	t.normMatcher = newAddedMatcher(norms, func(a *addedToken) string { return a.form })
	return nil
}

var errSecondSequence = errors.New("truncation: strategy OnlySecond needs a second sequence")

// Encode tokenizes text. addSpecialTokens applies the post-processor (e.g.
// a BOS token from TemplateProcessing), as HF's
// encode(add_special_tokens=True). Added/special tokens that appear in text
// are always matched as single tokens (HF's default).
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]int, error) {
	text = lossyString(text)
	e := &encoder{t: t, ids: make([]int, 0, len(text)/3+8)}
	err := splitAdded(text, t.rawMatcher, func(st, en int, tok *addedToken) error {
		if st == en {
			return nil
		}
		if tok != nil {
			e.ids = append(e.ids, tok.id)
			return nil
		}
		seg := piece{s: text[st:en]}
		if st == 0 {
			seg.lead = firstRuneLen(seg.s)
		}
		if t.normalizer != nil {
			ns, err := t.normalizer.normalize(seg.s)
			if err != nil {
				return err
			}
			if seg.lead > 0 {
				seg.lead = min(len(normalizeLead(t.normalizer, seg.s[:seg.lead])), len(ns))
			}
			seg.s = ns
		}
		return splitAdded(seg.s, t.normMatcher, func(st, en int, tok *addedToken) error {
			if st == en {
				return nil
			}
			if tok != nil {
				e.ids = append(e.ids, tok.id)
				return nil
			}
			if t.pre == nil {
				return e.put(seg.sub(st, en))
			}
			return t.pre.split(seg.sub(st, en), e)
		})
	})
	if err != nil {
		return nil, err
	}
	ids := e.ids
	if tr := t.trunc; tr != nil {
		limit := tr.maxLength
		if n := t.postAdded(); addSpecialTokens && n > 0 {
			if limit >= n {
				limit -= n
			} else {
				limit = math.MaxInt // an unsigned underflow: no limit
			}
		}
		if limit == 0 {
			ids = ids[:0]
		} else if len(ids) > limit {
			if tr.second {
				return nil, errSecondSequence
			}
			if tr.left {
				ids = ids[len(ids)-limit:]
			} else {
				ids = ids[:limit]
			}
		}
	}
	if t.post != nil {
		ids = t.post.process(ids, addSpecialTokens)
	}
	if p := t.pad; p != nil {
		target := len(ids)
		if p.fixed >= 0 {
			target = p.fixed
		}
		if p.multiple > 0 && target%p.multiple > 0 {
			target += p.multiple - target%p.multiple
		}
		if n := target - len(ids); n > 0 {
			pads := make([]int, n)
			for i := range pads {
				pads[i] = p.padID
			}
			if p.left {
				ids = append(pads, ids...)
			} else {
				ids = append(ids, pads...)
			}
		}
	}
	return ids, nil
}

// encoder is the state of one Encode: the sink of the pre-tokenizer.
type encoder struct {
	t       *Tokenizer
	ids     []int
	scratch []byte
}

func (e *encoder) put(p piece) error {
	w := p.b
	if w == nil {
		e.scratch = append(e.scratch[:0], p.s...)
		w = e.scratch
	}
	var err error
	e.ids, err = e.t.model.tokenize(w, e.ids)
	return err
}

func (t *Tokenizer) postAdded() int {
	if t.post == nil {
		return 0
	}
	return t.post.added()
}

// Decode is HF's decode(ids, skip_special_tokens=...). Ids outside the
// vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int, skipSpecialTokens bool) string {
	s, _ := t.decode(ids, skipSpecialTokens)
	return s
}

// decodeToken is the text of id as the decoders see it; ok is false for
// ids that decoding skips.
func (t *Tokenizer) decodeToken(id int, skipSpecial bool) (string, bool) {
	if skipSpecial && len(t.skipIDs) > 0 && t.skipIDs[id] {
		return "", false
	}
	return t.IDToToken(id)
}

func (t *Tokenizer) added(id int) *addedToken {
	if t.addedDense != nil {
		if id >= 0 && id < len(t.addedDense) {
			return t.addedDense[id]
		}
		return nil
	}
	return t.addedByID[id]
}

// decode also reports whether the text ends with bytes of an incomplete
// character (decoded as U+FFFD) that further ids could complete.
func (t *Tokenizer) decode(ids []int, skipSpecial bool) (string, bool) {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if tok, ok := t.decodeToken(id, skipSpecial); ok {
			toks = append(toks, tok)
		}
	}
	if t.decoder == nil {
		return strings.Join(toks, " "), false
	}
	pending := false
	out := t.decoder.decodeChain(toks, &pending)
	return strings.Join(out, ""), pending
}

// VocabSize is the highest id (of the vocabulary and the added tokens) + 1.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenToID is the id of a token (an added token's content, or a
// vocabulary entry).
func (t *Tokenizer) TokenToID(token string) (int, bool) {
	if id, ok := t.addedByContent[token]; ok {
		return id, true
	}
	return t.model.tokenToID(token)
}

// IDToToken is the token of an id, as HF's id_to_token (for an added token
// matched after normalization, its normalized form).
func (t *Tokenizer) IDToToken(id int) (string, bool) {
	if a := t.added(id); a != nil {
		return a.form, true
	}
	return t.model.idToToken(id)
}

// IsSpecial reports whether id is an added token with "special": true.
func (t *Tokenizer) IsSpecial(id int) bool {
	a := t.added(id)
	return a != nil && a.special
}

// WithoutTruncationAndPadding is t without the file's truncation and
// padding settings, as the transformers library (and vLLM's server with it)
// encodes by default: a prompt is never cut short nor padded. t is unchanged.
func (t *Tokenizer) WithoutTruncationAndPadding() *Tokenizer {
	c := *t
	c.trunc, c.pad = nil, nil
	return &c
}
