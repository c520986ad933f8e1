package tokenizer

import (
	"errors"
	"math"
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

// ModelType is the model's type as the tokenizers library names it ("BPE",
// "WordPiece", "WordLevel", "Unigram"), also for a file that does not name
// it (the model recognised by its fields).
func (t *Tokenizer) ModelType() string {
	switch t.model.(type) {
	case *bpeModel:
		return "BPE"
	case *wordPieceModel:
		return "WordPiece"
	case *wordLevelModel:
		return "WordLevel"
	case *unigramModel:
		return "Unigram"
	}
	return ""
}

// SpaceMarker is the replacement character of the Metaspace pre-tokenizer
// (alone or in a Sequence), which stands for a space in the vocabulary's
// strings; "" when there is none.
func (t *Tokenizer) SpaceMarker() string {
	pres := []preTokenizer{t.pre}
	if seq, ok := t.pre.(sequencePre); ok {
		pres = seq
	}
	for _, p := range pres {
		if m, ok := p.(metaspacePre); ok {
			return m.repStr
		}
	}
	return ""
}

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
