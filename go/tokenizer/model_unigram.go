package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"
)

type unigramPiece struct {
	tok   string
	score float64
}

type unigramModel struct {
	pieces       []unigramPiece
	ids          map[string]int
	trie         *byteTrie
	unkID        int // -1: none
	byteFallback bool
	minScore     float64
	byteIDs      [256]int
	cache        *wordCache
}

const unkPenalty = 10.0

var errUnigramNoUnk = errors.New("unknown token, and the Unigram model has no unk_id")

// parseUnigramModel parses a "Unigram" model.
func parseUnigramModel(kind string, raw json.RawMessage) (model, error) {
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

func newUnigram(pieces []unigramPiece, unkID *int, byteFallback bool) (*unigramModel, error) {
	m := &unigramModel{pieces: pieces, ids: make(map[string]int, len(pieces)), unkID: -1, byteFallback: byteFallback, cache: newWordCache()}
	if unkID != nil {
		if len(pieces) == 0 {
			return nil, errors.New("Unigram: empty vocabulary but unk_id is set")
		}
		if *unkID < 0 || *unkID >= len(pieces) {
			return nil, errors.New("Unigram: unk_id is outside the vocabulary")
		}
		m.unkID = *unkID
	}
	if len(pieces) > 1<<31-1 {
		return nil, errors.New("Unigram: vocabulary too large")
	}
	m.minScore = 0
	keys := make([]trieKey, len(pieces))
	for i, p := range pieces {
		m.ids[p.tok] = i
		keys[i] = trieKey{p.tok, int32(i)}
		if i == 0 || p.score < m.minScore {
			m.minScore = p.score
		}
	}
	m.trie = newByteTrie(keys)
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := m.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	return m, nil
}

func (m *unigramModel) tokenToID(tok string) (int, bool) {
	id, ok := m.ids[tok]
	return id, ok
}

func (m *unigramModel) idToToken(id int) (string, bool) {
	if id < 0 || id >= len(m.pieces) {
		return "", false
	}
	return m.pieces[id].tok, true
}

func (m *unigramModel) size() int  { return len(m.pieces) }
func (m *unigramModel) maxID() int { return len(m.pieces) - 1 }

func (m *unigramModel) tokenize(s []byte, out []int) ([]int, error) {
	if len(s) == 0 {
		return out, nil
	}
	cacheable := len(s) < maxCachedWord
	if cacheable {
		if ids, ok := m.cache.get(s); ok {
			return append(out, ids...), nil
		}
	}
	toks, err := m.bestPath(s)
	if err != nil {
		return out, err
	}
	start := len(out)
	for _, r := range toks {
		tok := s[r[0]:r[1]]
		if id, ok := m.ids[string(tok)]; ok {
			out = append(out, id)
			continue
		}
		if m.byteFallback {
			all := true
			for _, c := range tok {
				if m.byteIDs[c] < 0 {
					all = false
					break
				}
			}
			if all {
				for _, c := range tok {
					out = append(out, m.byteIDs[c])
				}
				continue
			}
		}
		if m.unkID < 0 {
			return out[:start], errUnigramNoUnk
		}
		out = append(out, m.unkID)
	}
	if cacheable {
		m.cache.put(string(s), slices.Clone(out[start:]))
	}
	return out, nil
}

// bestPath is the Viterbi segmentation of s into vocabulary pieces (as
// byte ranges), with unknown characters scored below every piece and
// consecutive unknown pieces fused.
func (m *unigramModel) bestPath(s []byte) ([][2]int, error) {
	type node struct {
		score float64
		from  int32 // -1: not reached
		id    int32
	}
	if len(s) >= 1<<31-1 {
		return nil, errors.New("Unigram: input too long")
	}
	best := make([]node, len(s)+1)
	for i := range best {
		best[i].from = -1
	}
	unkScore := m.minScore - unkPenalty
	for start := 0; start < len(s); {
		here := best[start].score
		_, mblen := utf8.DecodeRune(s[start:])
		single := false
		n := int32(0)
		for i := start; i < len(s) && n >= 0; i++ {
			n = m.trie.child(n, s[i])
			if n < 0 {
				break
			}
			if id := m.trie.values[n]; id >= 0 {
				end := i + 1
				cand := m.pieces[id].score + here
				if t := &best[end]; t.from < 0 || cand > t.score {
					t.score, t.from, t.id = cand, int32(start), id
				}
				if end-start == mblen {
					single = true
				}
			}
		}
		if !single {
			t := &best[start+mblen]
			if cand := unkScore + here; t.from < 0 || cand > t.score {
				if m.unkID < 0 {
					return nil, errUnigramNoUnk
				}
				t.score, t.from, t.id = cand, int32(start), int32(m.unkID)
			}
		}
		start += mblen
	}
	var rev [][2]int
	fusedFrom, fusedEnd := 0, -1 // the run of unknown pieces being fused
	for end := len(s); end > 0; {
		nd := best[end]
		if nd.from < 0 {
			return nil, errUnigramNoUnk
		}
		from := int(nd.from)
		if int(nd.id) == m.unkID {
			if fusedEnd < 0 {
				fusedEnd = end
			}
			fusedFrom = from
		} else {
			if fusedEnd >= 0 {
				rev = append(rev, [2]int{fusedFrom, fusedEnd})
				fusedEnd = -1
			}
			rev = append(rev, [2]int{from, end})
		}
		end = from
	}
	if fusedEnd >= 0 {
		rev = append(rev, [2]int{fusedFrom, fusedEnd})
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev, nil
}
