package tokenizer

import (
	"slices"
	"strings"
)

// byteTrie is an immutable trie over the bytes of a set of strings, each
// with an int32 value, stored flat: node n's edges are
// labels/targets[start[n]:start[n+1]], sorted by label.
type byteTrie struct {
	start   []int32
	labels  []byte
	targets []int32
	values  []int32 // -1: no key ends here
}

type trieKey struct {
	key   string
	value int32
}

// newByteTrie builds the trie of keys; for a repeated key the last value wins.
func newByteTrie(keys []trieKey) *byteTrie {
	ks := slices.Clone(keys)
	slices.SortStableFunc(ks, func(a, b trieKey) int { return strings.Compare(a.key, b.key) })
	// Deduplicate, keeping the last value of each key.
	out := ks[:0]
	for i, k := range ks {
		if i+1 < len(ks) && ks[i+1].key == k.key {
			continue
		}
		out = append(out, k)
	}
	ks = out
	t := &byteTrie{}
	// Breadth-first: each queue entry is a node and its range of keys,
	// which all share the node's prefix of length depth.
	type span struct{ lo, hi, depth int }
	queue := []span{{0, len(ks), 0}}
	t.values = append(t.values, -1)
	for n := 0; n < len(queue); n++ {
		sp := queue[n]
		lo := sp.lo
		if lo < sp.hi && len(ks[lo].key) == sp.depth {
			t.values[n] = ks[lo].value
			lo++
		}
		t.start = append(t.start, int32(len(t.labels)))
		for lo < sp.hi {
			b := ks[lo].key[sp.depth]
			hi := lo + 1
			for hi < sp.hi && ks[hi].key[sp.depth] == b {
				hi++
			}
			t.labels = append(t.labels, b)
			t.targets = append(t.targets, int32(len(queue)))
			queue = append(queue, span{lo, hi, sp.depth + 1})
			t.values = append(t.values, -1)
			lo = hi
		}
	}
	t.start = append(t.start, int32(len(t.labels)))
	return t
}

// child is the node reached from n over byte b, or -1.
func (t *byteTrie) child(n int32, b byte) int32 {
	lo, hi := int(t.start[n]), int(t.start[n+1])
	if hi-lo <= 8 {
		for i := lo; i < hi; i++ {
			if t.labels[i] == b {
				return t.targets[i]
			}
		}
		return -1
	}
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch l := t.labels[m]; {
		case l == b:
			return t.targets[m]
		case l < b:
			lo = m + 1
		default:
			hi = m
		}
	}
	return -1
}

// walk follows s from node n; it returns the node reached, or -1.
func (t *byteTrie) walk(n int32, s string) int32 {
	for i := 0; i < len(s) && n >= 0; i++ {
		n = t.child(n, s[i])
	}
	return n
}
