package plane

// Routing without copying the instances. A pick reads the client's view:
// the instances that pass its filter, with their capacities, built from the
// watcher's shared snapshot once per change of the instance set (or of the
// filter, or of the capacity setting), never per request. Round robin and
// random take the k-th candidate in O(log W) of the instances avoided (the
// request's excluded ones, the client's suspects), without a list of the
// candidates; routing by capacity keeps each instance's free places in a
// segment tree (with the engine's waiting requests and KV usage, as the
// instances report them), updated in O(log W) when a request is counted or
// uncounted or a report arrives, and finds the best in O(log W). A pick allocates nothing
// that grows with the instances.

import (
	"cmp"
	"math"
	"slices"

	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
)

// view is what a pick reads: immutable, shared by every pick until the
// instances, the filter or the capacity setting change.
type view struct {
	snap   *discovery.Snapshot
	filter *func([]byte) bool
	cfg    *capacityConfig
	insts  []discovery.Instance // those that pass filter, sorted by id; read only
	caps   []int                // with cfg: each one's declared capacity (0: none)
	// largest is what an instance that declares no capacity counts as: the
	// largest any instance declares, unlimited when none does.
	largest int
}

// currentView returns the view of the watcher's current snapshot, built on
// the first call after a change. The filter and cfg.of run here, under
// viewMu alone: they are the caller's code and must not call back into c.
func (c *Client) currentView() *view {
	snap := c.watcher.Snapshot()
	f, cfg := c.filter.Load(), c.capacity.Load()
	if v := c.view.Load(); v != nil && v.snap == snap && v.filter == f && v.cfg == cfg {
		return v
	}
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	if v := c.view.Load(); v != nil && v.snap == snap && v.filter == f && v.cfg == cfg {
		return v
	}
	v := &view{snap: snap, filter: f, cfg: cfg, insts: snap.Instances()}
	if f != nil {
		v.insts = nil
		for _, in := range snap.Instances() {
			if (*f)(in.Meta) {
				v.insts = append(v.insts, in)
			}
		}
	}
	if cfg != nil {
		v.caps = make([]int, len(v.insts))
		for i, in := range v.insts {
			v.caps[i] = min(max(cfg.of(in.Meta), 0), unlimited) // no score overflows (freeTree)
			v.largest = max(v.largest, v.caps[i])
		}
		if v.largest == 0 {
			v.largest = unlimited
		}
	}
	c.view.Store(v)
	return v
}

// index is the position of instance id in v.insts, or -1.
func (v *view) index(id uint64) int {
	i, ok := slices.BinarySearchFunc(v.insts, id, func(in discovery.Instance, id uint64) int { return cmp.Compare(in.ID, id) })
	if !ok {
		return -1
	}
	return i
}

// avoidedLocked appends to out the positions in v of the instances a pick
// leaves out, sorted and without repeats: those in exclude and, with
// suspects, the client's suspects (c.mu held). Its cost is that of the
// instances avoided, whatever the instances known.
func (c *Client) avoidedLocked(v *view, exclude map[uint64]bool, suspects bool, out []int) []int {
	for id, bad := range exclude {
		if i := v.index(id); bad && i >= 0 {
			out = append(out, i)
		}
	}
	if suspects {
		for id := range c.suspects {
			if i := v.index(id); i >= 0 {
				out = append(out, i)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nth is the position in v of the k-th candidate (from 0, in id order) when
// the positions in avoided (sorted) are left out.
func nth(avoided []int, k int) int {
	for _, a := range avoided {
		if a > k {
			break
		}
		k++
	}
	return k
}

// absent marks a leaf of a freeTree that is no candidate.
const absent = math.MinInt64

// kvLevels is how many KV usage levels a score tells apart (0 to 100%).
const kvLevels = 128

// freeTree holds a score of each instance of one view in two max segment
// trees: all of them, and those a new request may be admitted into (an
// instance that declares a capacity and has no free place is absent from
// it). Guarded by Client.mu.
//
// The score is the rule a pick follows: the most free places, less the
// requests the instance's engine reports waiting; then, between equals,
// the lowest KV cache usage (in whole percent); then, between equals, the
// first in turn. An instance's free places are its capacity (or the view's
// largest when it declares none) minus the requests running there: the
// client's own and the others' it was told of (load.go). Admission counts
// the free places alone: the worker's count is the authority, what its
// engine holds back is only a preference.
type freeTree struct {
	v    *view
	size int     // leaves, a power of two
	all  []int64 // node i's children are 2i and 2i+1; leaves from size
	adm  []int64
}

func (c *Client) newFreeTreeLocked(v *view) *freeTree {
	c.pruneOthersLocked(v)
	size := 1
	for size < len(v.insts) {
		size *= 2
	}
	t := &freeTree{v: v, size: size, all: make([]int64, 2*size), adm: make([]int64, 2*size)}
	for i := range size {
		t.all[size+i], t.adm[size+i] = absent, absent
		if i < len(v.insts) {
			t.all[size+i], t.adm[size+i] = c.leafLocked(t, i)
		}
	}
	for n := size - 1; n >= 1; n-- {
		t.all[n] = max(t.all[2*n], t.all[2*n+1])
		t.adm[n] = max(t.adm[2*n], t.adm[2*n+1])
	}
	return t
}

// usedLocked is how many requests run on instance id: the client's own and,
// as last reported, the others' (load.go). c.mu held.
func (c *Client) usedLocked(id uint64) int { return c.load[id] + c.othersLocked(id) }

// leafLocked is the values of leaf i of t now (c.mu held).
func (c *Client) leafLocked(t *freeTree, i int) (all, adm int64) {
	id := t.v.insts[i].ID
	return t.score(i, c.usedLocked(id), c.engineLocked(id))
}

// score is instance i's score with running requests there and its engine's
// figures e, and the same where a new request may be admitted (else
// absent).
func (t *freeTree) score(i, running int, e engineLoad) (all, adm int64) {
	capacity, declared := t.v.caps[i], t.v.caps[i] > 0
	if !declared {
		capacity = t.v.largest
	}
	free := int64(capacity - running)
	all = (free-int64(e.waiting))*kvLevels + int64(kvLevels-1-e.kvPercent)
	if declared && free <= 0 {
		return all, absent
	}
	return all, all
}

// set gives leaf i its values and updates the nodes above it.
func (t *freeTree) set(i int, all, adm int64) {
	n := t.size + i
	t.all[n], t.adm[n] = all, adm
	for n /= 2; n >= 1; n /= 2 {
		t.all[n] = max(t.all[2*n], t.all[2*n+1])
		t.adm[n] = max(t.adm[2*n], t.adm[2*n+1])
	}
}

// first is the first leaf from from on whose value in a is at least want,
// or -1: O(log W).
func (t *freeTree) first(a []int64, node, lo, hi, from int, want int64) int {
	if hi <= from || a[node] < want {
		return -1
	}
	if hi-lo == 1 {
		return lo
	}
	mid := (lo + hi) / 2
	if i := t.first(a, 2*node, lo, mid, from, want); i >= 0 {
		return i
	}
	return t.first(a, 2*node+1, mid, hi, from, want)
}

// loadChangedLocked brings instance id's leaf up to date after its count of
// running requests changed (c.mu held).
func (c *Client) loadChangedLocked(id uint64) {
	if t := c.tree; t != nil {
		if i := t.v.index(id); i >= 0 {
			all, adm := c.leafLocked(t, i)
			t.set(i, all, adm)
		}
	}
}

// mostFreeLocked returns the candidate of v with the best score (freeTree:
// the most free places less its engine's waiting requests, then the lowest
// KV usage, then the first from the next position of the client's
// rotation), the candidates being v's instances less the positions in
// avoided. With admit only candidates with a free place count (an instance
// that declares no capacity always has one); ok is false when no candidate
// does. c.mu held.
func (c *Client) mostFreeLocked(v *view, avoided []int, admit bool) (best uint64, ok bool) {
	start := c.rr.Add(1) - 1
	n := len(v.insts) - len(avoided)
	if n <= 0 {
		return 0, false
	}
	if c.tree == nil || c.tree.v != v {
		c.tree = c.newFreeTreeLocked(v)
	}
	t := c.tree
	for _, i := range avoided { // left out for this pick only
		t.set(i, absent, absent)
	}
	a := t.all
	if admit {
		a = t.adm
	}
	if want := a[1]; want != absent {
		from := nth(avoided, int(start%uint64(n)))
		i := t.first(a, 1, 0, t.size, from, want)
		if i < 0 {
			i = t.first(a, 1, 0, t.size, 0, want)
		}
		best, ok = v.insts[i].ID, true
	}
	for _, i := range avoided {
		all, adm := c.leafLocked(t, i)
		t.set(i, all, adm)
	}
	return best, ok
}
