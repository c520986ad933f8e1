package tokenizer

import (
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
