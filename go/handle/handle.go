// Package handle implements checked tables of integer handles, the kind a
// C ABI hands out in place of Go pointers.
//
// A handle crosses a trust boundary: foreign code may pass back any uint64,
// including zero, a handle it already freed, a handle from another table, or
// garbage. A [Table] therefore treats every handle as untrusted input and
// validates it before use.
//
// A handle is a uint64 laid out as
//
//	bits 56-63  kind        the [Kind] of the table that issued it
//	bits 32-55  generation  24 bits, never 0 for a live slot
//	bits  0-31  slot index
//
// A Table makes the following guarantees:
//
//   - Insert never returns 0, so 0 is free to mean "no handle" across the ABI.
//   - Get and Remove never panic, whatever uint64 they are given. Any value
//     that is not a live handle of the table fails with an error that
//     matches [ErrBadHandle] under [errors.Is], and changes nothing.
//   - A handle carrying a different Kind is rejected. The Kind is the only
//     thing that tells tables apart, so give each table its own Kind: two
//     tables of the same Kind cannot tell each other's handles from their own.
//   - A handle is live from the Insert that returns it until the first Remove
//     of it succeeds; after that it is stale and is rejected. In particular a
//     second Remove of the same handle fails.
//   - A stale handle stays rejected until its slot has been reused 2^24-1
//     times (the generation space); only then can it alias a newer handle.
//     Freed slots are reused in FIFO order, so while k slots are free that
//     takes about k*2^24 frees rather than 2^24.
//   - All methods are safe for concurrent use. Get takes no lock and writes
//     no shared memory, so concurrent Gets scale with the number of CPUs.
//   - Remove drops the table's reference to the value, so the table never
//     keeps a freed value reachable.
//
// Handles are not secrets: anyone who can see one may use it. The checks
// catch mistakes and stale use, not forgery of a currently live handle.
package handle

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Kind tags which table a handle belongs to, so a handle of one kind is
// rejected by a table of another kind. It occupies the top 8 bits of a handle.
type Kind uint8

// ErrBadHandle is the error matched (with [errors.Is]) by every failure to
// resolve a handle. The returned error wraps it with the handle value and the
// reason: "zero handle", "wrong kind", "out of range" or "stale".
var ErrBadHandle = errors.New("handle: bad handle")

const (
	kindShift = 56
	genShift  = 32
	genBits   = 24
	genMask   = 1<<genBits - 1
	idxMask   = 1<<32 - 1

	// maxSlots is the number of distinct slot indexes a handle can encode.
	maxSlots = 1 << 32
	// minGrow is the first slot array size; small, so that an empty or tiny
	// table costs little.
	minGrow = 8
)

// entry is one occupancy of a slot. It is immutable once published, which is
// what lets Get read the generation and the value together without a lock:
// a single atomic pointer load yields a consistent (gen, value) pair.
type entry[T any] struct {
	gen uint32
	v   T
}

// slot is one position in the table. cur is nil while the slot is free.
type slot[T any] struct {
	cur atomic.Pointer[entry[T]]

	// The fields below are only touched with Table.mu held.

	// gen is the generation the next occupant of this slot will get. It is
	// kept in the slot, not in the entry, because it must survive while the
	// slot is free so the next handle differs from every recent one.
	gen uint32
	// next links the FIFO free list, as index+1 so that 0 means "none".
	next uint64
}

// Table maps handles to values of type T. The zero Table is not usable; make
// one with [NewTable].
type Table[T any] struct {
	kind Kind

	// slots is read without a lock by Get. Its slice is only ever replaced,
	// never modified in place, and every element of a published slice points
	// to an allocated slot. Slots themselves never move, so a reader holding
	// an old slice still sees the current state of each slot.
	slots atomic.Pointer[[]*slot[T]]

	mu sync.Mutex // serialises Insert, Remove and growth
	// freeHead and freeTail are the FIFO free list (index+1, 0 = empty).
	// FIFO rather than LIFO spreads reuse over all free slots, so a given
	// slot's generation advances as slowly as possible and stale handles
	// stay detectably stale for longer.
	freeHead, freeTail uint64
	live               int
	// firstGen is the generation given to newly created slots. Always 1
	// outside tests; tests lower it towards genMask to exercise wrap-around.
	firstGen uint32
}

// NewTable returns an empty table whose handles carry kind.
func NewTable[T any](kind Kind) *Table[T] {
	t := &Table[T]{kind: kind, firstGen: 1}
	empty := []*slot[T]{}
	t.slots.Store(&empty)
	return t
}

// Kind reports the kind stamped on this table's handles.
func (t *Table[T]) Kind() Kind { return t.kind }

// KindOf reports the kind stamped on h, which tells the table to look it up
// in; it says nothing about whether h is live (Get does).
func KindOf(h uint64) Kind { return Kind(h >> kindShift) }

// Len reports the number of live handles. It exists mainly so tests can check
// that every handle handed out was eventually freed.
func (t *Table[T]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}

// Insert stores v and returns a new handle for it. The handle is never 0.
// Insert panics only if the table already holds 2^32 live handles, which no
// realistic program reaches and which the encoding cannot represent.
func (t *Table[T]) Insert(v T) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freeHead == 0 {
		t.grow()
	}
	idx := t.freeHead - 1
	s := (*t.slots.Load())[idx]
	t.freeHead = s.next
	if t.freeHead == 0 {
		t.freeTail = 0
	}
	s.next = 0
	e := &entry[T]{gen: s.gen, v: v}
	// Publishing e is the linearisation point: from here on Get sees it.
	s.cur.Store(e)
	t.live++
	return uint64(t.kind)<<kindShift | uint64(e.gen)<<genShift | idx
}

// grow enlarges the slot array and queues the new slots as free. It is called
// with t.mu held and only when the free list is empty.
func (t *Table[T]) grow() {
	old := *t.slots.Load()
	n := uint64(len(old))
	if n >= maxSlots {
		panic("handle: table full (2^32 live handles)")
	}
	size := max(2*n, minGrow)
	size = min(size, maxSlots)
	// Copy into a fresh slice instead of appending in place: readers may be
	// holding old, and must keep seeing a fully initialised slice.
	next := make([]*slot[T], size)
	copy(next, old)
	// One backing array for the new slots keeps allocations per growth at
	// two, regardless of size.
	fresh := make([]slot[T], size-n)
	for i := range fresh {
		s := &fresh[i]
		s.gen = t.firstGen
		next[n+uint64(i)] = s
		t.pushFree(next, n+uint64(i))
	}
	t.slots.Store(&next)
}

// pushFree appends slot idx to the tail of the free list. slots is passed in
// because during grow it is not yet published.
func (t *Table[T]) pushFree(slots []*slot[T], idx uint64) {
	if t.freeTail == 0 {
		t.freeHead = idx + 1
	} else {
		slots[t.freeTail-1].next = idx + 1
	}
	t.freeTail = idx + 1
}

// Get returns the value for h, or an error matching ErrBadHandle if h is not
// a live handle of this table. It takes no lock.
func (t *Table[T]) Get(h uint64) (T, error) {
	s, gen, err := t.lookup(h)
	if err != nil {
		var zero T
		return zero, err
	}
	e := s.cur.Load()
	if e == nil || e.gen != gen {
		var zero T
		return zero, badHandle(h, "stale")
	}
	return e.v, nil
}

// Remove frees h and returns the value it referred to. Once Remove succeeds,
// h is stale: every later Get or Remove of it fails with ErrBadHandle.
func (t *Table[T]) Remove(h uint64) (T, error) {
	var zero T
	s, gen, err := t.lookup(h)
	if err != nil {
		return zero, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Re-check under the lock: two racing Removes of the same handle must
	// not both succeed, and only the holder of mu changes cur from non-nil.
	e := s.cur.Load()
	if e == nil || e.gen != gen {
		return zero, badHandle(h, "stale")
	}
	s.cur.Store(nil)
	// Advance the generation now, while the slot is free, so the next
	// occupant's handle differs from h. Skip 0: it marks no live slot, and
	// keeping it unused means a handle with generation 0 is always invalid.
	g := (gen + 1) & genMask
	if g == 0 {
		g = 1
	}
	s.gen = g
	t.pushFree(*t.slots.Load(), h&idxMask)
	t.live--
	return e.v, nil
}

// lookup performs the checks that need only the handle's bits and the
// current slot array: zero, kind and range. The generation check is left to
// the caller because Remove must repeat it under the lock.
func (t *Table[T]) lookup(h uint64) (*slot[T], uint32, error) {
	if h == 0 {
		return nil, 0, badHandle(h, "zero handle")
	}
	if KindOf(h) != t.kind {
		return nil, 0, badHandle(h, "wrong kind")
	}
	slots := *t.slots.Load()
	idx := h & idxMask
	if idx >= uint64(len(slots)) {
		return nil, 0, badHandle(h, "out of range")
	}
	return slots[idx], uint32(h>>genShift) & genMask, nil
}

// badHandle builds the error for a rejected handle. Formatting is deferred to
// Error, so rejecting a handle costs one small allocation: a foreign caller
// probing bad handles should not pay for fmt on every call.
func badHandle(h uint64, why string) error {
	return &badHandleError{h: h, why: why}
}

// badHandleError carries the rejected handle and the reason, and unwraps to
// ErrBadHandle so callers need match only the one sentinel.
type badHandleError struct {
	h   uint64
	why string
}

func (e *badHandleError) Error() string {
	return fmt.Sprintf("%v 0x%016x: %s", ErrBadHandle, e.h, e.why)
}

func (e *badHandleError) Unwrap() error { return ErrBadHandle }
