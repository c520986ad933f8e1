package tokenizer

import (
	"encoding/json"
	"math"
	"unicode/utf8"
)

type wordPieceModel struct {
	*vocabulary
	unk      string
	prefix   string // continuing_subword_prefix
	maxChars int
	trie     *byteTrie // values index tokIDs
	tokIDs   []uint32
	prefixAt int32 // trie node after the prefix (-1: no token has it)
}

// parseWordPieceModel parses a "WordPiece" model.
func parseWordPieceModel(kind string, raw json.RawMessage) (model, error) {
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
}

func newWordPiece(voc map[string]uint32, unk, prefix string, maxChars int) *wordPieceModel {
	keys := make([]trieKey, 0, len(voc))
	m := &wordPieceModel{vocabulary: newVocabulary(voc), unk: unk, prefix: prefix, maxChars: maxChars}
	for tok, id := range voc {
		keys = append(keys, trieKey{tok, int32(len(m.tokIDs))})
		m.tokIDs = append(m.tokIDs, id)
	}
	m.trie = newByteTrie(keys)
	m.prefixAt = m.trie.walk(0, prefix)
	return m
}

func (m *wordPieceModel) tokenize(s []byte, out []int) ([]int, error) {
	n0 := len(out)
	unk := func() ([]int, error) {
		out = out[:n0] // a word with an unknown part is one unknown token
		id, ok := m.ids[m.unk]
		if !ok {
			return out, errMissingUnk
		}
		return append(out, int(id)), nil
	}
	if utf8.RuneCount(s) > m.maxChars {
		return unk()
	}
	for start := 0; start < len(s); {
		// The longest vocabulary token (with the prefix past the start)
		// that the rest of the word begins with.
		node := int32(0)
		if start > 0 {
			node = m.prefixAt
		}
		end, id := -1, uint32(0)
		for i := start; i < len(s) && node >= 0; i++ {
			node = m.trie.child(node, s[i])
			if node >= 0 && m.trie.values[node] >= 0 {
				end, id = i+1, m.tokIDs[m.trie.values[node]]
			}
		}
		if end < 0 {
			return unk()
		}
		out = append(out, int(id))
		start = end
	}
	return out, nil
}
