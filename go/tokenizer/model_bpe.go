package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

type mergeRule struct{ rank, newID uint32 }

type bpeModel struct {
	*vocabulary
	merges       map[uint64]mergeRule // (left id << 32 | right id) -> rule
	unkToken     string
	hasUnk       bool
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	byteIDs      [256]int64
	// runeIDs: the ids of single-character tokens below U+0800, for the
	// common case without prefix or suffix (-1: not in the vocabulary).
	runeIDs []int32
	cache   *wordCache
}

var errUnkNotInVocab = errors.New("the BPE unk_token is not in the vocabulary")

// parseBPEModel parses a "BPE" model.
func parseBPEModel(kind string, raw json.RawMessage) (model, error) {
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
	if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil || jsonscan.IsNull(v.Merges) {
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
}

// parseMerges accepts both spellings of BPE merges: [["a", "b"], ...] and
// ["a b", ...] (lines of a merges.txt; "#version" lines are skipped).
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	i := jsonscan.SkipSpace(raw, 0)
	if jsonscan.HasAt(raw, i, "[") {
		i = jsonscan.SkipSpace(raw, i+1)
	}
	if !jsonscan.HasAt(raw, i, `"`) {
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

func newBPE(voc map[string]uint32, merges [][2]string, unk *string, prefix, suffix string, fuseUnk, byteFallback, ignoreMerges bool) (*bpeModel, error) {
	m := &bpeModel{
		vocabulary:   newVocabulary(voc),
		merges:       make(map[uint64]mergeRule, len(merges)),
		fuseUnk:      fuseUnk,
		byteFallback: byteFallback,
		ignoreMerges: ignoreMerges,
		prefix:       prefix,
		suffix:       suffix,
		cache:        newWordCache(),
	}
	if unk != nil {
		m.unkToken, m.hasUnk = *unk, true
	}
	for rank, mg := range merges {
		a, ok := voc[mg[0]]
		if !ok {
			return nil, fmt.Errorf("BPE merge %q %q: %q is not in the vocabulary", mg[0], mg[1], mg[0])
		}
		b, ok := voc[mg[1]]
		if !ok {
			return nil, fmt.Errorf("BPE merge %q %q: %q is not in the vocabulary", mg[0], mg[1], mg[1])
		}
		if len(mg[1]) < len(prefix) {
			return nil, fmt.Errorf("BPE merge %q %q: shorter than the continuing_subword_prefix", mg[0], mg[1])
		}
		// The merged token drops the right part's prefix length, whatever it holds.
		merged := mg[0] + mg[1][len(prefix):]
		id, ok := voc[merged]
		if !ok || !utf8.ValidString(merged) {
			return nil, fmt.Errorf("BPE merge %q %q: %q is not in the vocabulary", mg[0], mg[1], merged)
		}
		m.merges[uint64(a)<<32|uint64(b)] = mergeRule{uint32(rank), id}
	}
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		if id, ok := voc[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = int64(id)
		}
	}
	if prefix == "" && suffix == "" {
		m.runeIDs = make([]int32, 0x800)
		for r := range m.runeIDs {
			m.runeIDs[r] = -1
			if id, ok := voc[string(rune(r))]; ok && id <= 1<<31-1 {
				m.runeIDs[r] = int32(id)
			}
		}
	}
	return m, nil
}

// symbol is one part of a word being merged; removed parts get len 0.
type symbol struct {
	id         uint32
	prev, next int32
	len        int32
}

type mergeItem struct {
	rank, newID uint32
	pos         int32
}

// bpeScratch is the per-call working memory of merging a word.
type bpeScratch struct {
	syms []symbol
	heap []mergeItem
	tok  []byte
}

var bpePool = sync.Pool{New: func() any { return new(bpeScratch) }}

func (m *bpeModel) tokenize(w []byte, out []int) ([]int, error) {
	if len(w) == 0 {
		return out, nil
	}
	if m.ignoreMerges {
		if id, ok := m.ids[string(w)]; ok {
			return append(out, int(id)), nil
		}
	}
	cacheable := len(w) < maxCachedWord
	if cacheable {
		if ids, ok := m.cache.get(w); ok {
			return append(out, ids...), nil
		}
	}
	sc := bpePool.Get().(*bpeScratch)
	defer bpePool.Put(sc)
	if err := m.mergeWord(w, sc); err != nil {
		return out, err
	}
	start := len(out)
	for i := range sc.syms {
		if sc.syms[i].len != 0 {
			out = append(out, int(sc.syms[i].id))
		}
	}
	if cacheable {
		m.cache.put(string(w), slices.Clone(out[start:]))
	}
	if cap(sc.syms) > 1<<16 {
		sc.syms, sc.heap = nil, nil // do not keep huge buffers pooled
	}
	return out, nil
}

func (m *bpeModel) addSymbol(sc *bpeScratch, id uint32, n int) {
	k := int32(len(sc.syms))
	if k > 0 {
		sc.syms[k-1].next = k
	}
	sc.syms = append(sc.syms, symbol{id: id, prev: k - 1, next: -1, len: int32(n)})
}

// mergeWord splits w into its characters (with the byte-fallback and
// unknown-token rules) and applies the merges, lowest rank first and
// leftmost first among equal ranks.
func (m *bpeModel) mergeWord(w []byte, sc *bpeScratch) error {
	sc.syms = sc.syms[:0]
	if len(w) > 64 {
		sc.syms = slices.Grow(sc.syms, utf8.RuneCount(w))
	}
	unkPending, unkLen := false, 0
	var unkID uint32
	for i := 0; i < len(w); {
		r, n := rune(w[i]), 1
		if r >= utf8.RuneSelf {
			r, n = utf8.DecodeRune(w[i:])
		}
		var (
			id    uint32
			found bool
			tok   []byte
		)
		if m.runeIDs != nil {
			if int(r) < len(m.runeIDs) {
				if v := m.runeIDs[r]; v >= 0 {
					id, found = uint32(v), true
				}
			} else {
				id, found = m.ids[string(w[i:i+n])]
			}
			tok = w[i : i+n]
		} else {
			tok = sc.tok[:0]
			if i > 0 {
				tok = append(tok, m.prefix...)
			}
			tok = append(tok, w[i:i+n]...)
			if i+n == len(w) {
				tok = append(tok, m.suffix...)
			}
			sc.tok = tok
			id, found = m.ids[string(tok)]
		}
		if found {
			if unkPending {
				m.addSymbol(sc, unkID, unkLen)
				unkPending = false
			}
			m.addSymbol(sc, id, n)
			i += n
			continue
		}
		if m.byteFallback {
			all := true
			for j := 0; j < len(tok); j++ {
				if m.byteIDs[tok[j]] < 0 {
					all = false
					break
				}
			}
			if all {
				for j := 0; j < len(tok); j++ {
					m.addSymbol(sc, uint32(m.byteIDs[tok[j]]), 1)
				}
				i += n
				continue
			}
		}
		if m.hasUnk {
			uid, ok := m.ids[m.unkToken]
			if !ok {
				return errUnkNotInVocab
			}
			switch {
			case unkPending && m.fuseUnk:
				unkLen += n
			case unkPending:
				m.addSymbol(sc, unkID, unkLen)
				unkID, unkLen = uid, n
			default:
				unkPending, unkID, unkLen = true, uid, n
			}
		}
		i += n
	}
	if unkPending {
		m.addSymbol(sc, unkID, unkLen)
	}
	m.mergeAll(sc)
	return nil
}

func (m *bpeModel) rule(a, b uint32) (mergeRule, bool) {
	r, ok := m.merges[uint64(a)<<32|uint64(b)]
	return r, ok
}

func (m *bpeModel) mergeAll(sc *bpeScratch) {
	syms := sc.syms
	h := sc.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.rule(syms[i].id, syms[i+1].id); ok {
			h = append(h, mergeItem{r.rank, r.newID, int32(i)})
		}
	}
	// (rank, pos) orders the entries totally, so the order they come out
	// in does not depend on how the heap was built.
	heapInit(h)
	for len(h) > 0 {
		var top mergeItem
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.len == 0 || cur.next == -1 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		// Skip entries made stale by earlier merges.
		if r, ok := m.rule(cur.id, right.id); !ok || r.newID != top.newID {
			continue
		}
		cur.id = top.newID
		cur.len += right.len
		cur.next = right.next
		syms[nextPos].len = 0
		if right.next > -1 && int(right.next) < len(syms) {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, ok := m.rule(syms[cur.prev].id, cur.id); ok {
				h = heapPush(h, mergeItem{r.rank, r.newID, cur.prev})
			}
		}
		if cur.next >= 0 && int(cur.next) < len(syms) {
			if r, ok := m.rule(cur.id, syms[cur.next].id); ok {
				h = heapPush(h, mergeItem{r.rank, r.newID, top.pos})
			}
		}
	}
	sc.heap = h
}

// A 4-ary min-heap of merge candidates, least (rank, pos) first.

func itemLess(a, b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

func heapInit(h []mergeItem) {
	for i := (len(h) - 2) / 4; i >= 0; i-- {
		heapDown(h, i)
	}
}

func heapPush(h []mergeItem, it mergeItem) []mergeItem {
	h = append(h, it)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 4
		if !itemLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) (mergeItem, []mergeItem) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	heapDown(h, 0)
	return top, h
}

func heapDown(h []mergeItem, i int) {
	n := len(h)
	for {
		c := 4*i + 1
		if c >= n {
			return
		}
		best := c
		for k := c + 1; k < c+4 && k < n; k++ {
			if itemLess(h[k], h[best]) {
				best = k
			}
		}
		if !itemLess(h[best], h[i]) {
			return
		}
		h[i], h[best] = h[best], h[i]
		i = best
	}
}
