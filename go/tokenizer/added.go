package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// addedToken is an entry of the tokenizer.json "added_tokens" list.
type addedToken struct {
	id         int
	content    string
	special    bool
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	// form is the token's text as Decode sees it: its normalized content
	// when it is matched after normalization, else its content.
	form string
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

// addedMatcher finds added tokens in text: at the leftmost position where
// one occurs, the longest one.
type addedMatcher struct {
	trie  *byteTrie // values index toks
	toks  []*addedToken
	first [256]bool // bytes a token can start with
}

func newAddedMatcher(toks []*addedToken, key func(*addedToken) string) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{toks: toks}
	keys := make([]trieKey, len(toks))
	for i, t := range toks {
		k := key(t)
		keys[i] = trieKey{k, int32(i)}
		if k != "" {
			m.first[k[0]] = true
		}
	}
	m.trie = newByteTrie(keys)
	return m
}

// next finds the first match at or after from.
func (m *addedMatcher) next(s string, from int) (start, end int, tok *addedToken) {
	for i := from; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		n, best := int32(0), int32(-1)
		for j := i; j < len(s); j++ {
			if n = m.trie.child(n, s[j]); n < 0 {
				break
			}
			if v := m.trie.values[n]; v >= 0 {
				best, end = v, j+1
			}
		}
		if best >= 0 {
			return i, end, m.toks[best]
		}
	}
	return 0, 0, nil
}

// splitAdded emits the segments of s around the added tokens m finds (tok
// nil for the text between them), honoring single_word, lstrip and
// rstrip. Segments may be empty.
func splitAdded(s string, m *addedMatcher, emit func(start, end int, tok *addedToken) error) error {
	if m == nil || s == "" {
		return emit(0, len(s), nil)
	}
	startOffset := 0
	for from := 0; from < len(s); {
		ms, me, tok := m.next(s, from)
		if tok == nil {
			break
		}
		from = me
		start, stop := ms, me
		if tok.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], isWhitespace)), startOffset)
		}
		if tok.rstrip {
			stop += len(s[stop:]) - len(strings.TrimLeftFunc(s[stop:], isWhitespace))
		}
		if startOffset < start {
			if err := emit(startOffset, start, nil); err != nil {
				return err
			}
		}
		// After an rstrip, a later match may start inside the stripped
		// whitespace; such overlapping segments are kept as they are.
		if err := emit(min(start, stop), stop, tok); err != nil {
			return err
		}
		startOffset = stop
	}
	if startOffset < len(s) {
		return emit(startOffset, len(s), nil)
	}
	return nil
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return s != "" && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return s != "" && isWordChar(r)
}
