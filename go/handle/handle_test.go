package handle

import (
	"errors"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// parts splits a handle into its encoded fields, for assertions.
func parts(h uint64) (k Kind, gen uint32, idx uint32) {
	return Kind(h >> kindShift), uint32(h>>genShift) & genMask, uint32(h & idxMask)
}

func requireBad(t *testing.T, err error, why string) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, ErrBadHandle)
	if why != "" {
		require.Contains(t, err.Error(), why)
	}
}

func TestInsertGetRemove(t *testing.T) {
	tb := NewTable[string](3)
	assert.Equal(t, Kind(3), tb.Kind())
	assert.Equal(t, 0, tb.Len())

	a := tb.Insert("a")
	b := tb.Insert("b")
	require.NotZero(t, a)
	require.NotZero(t, b)
	require.NotEqual(t, a, b)
	assert.Equal(t, 2, tb.Len())

	k, gen, _ := parts(a)
	assert.Equal(t, Kind(3), k)
	assert.NotZero(t, gen)

	v, err := tb.Get(a)
	require.NoError(t, err)
	assert.Equal(t, "a", v)
	v, err = tb.Get(b)
	require.NoError(t, err)
	assert.Equal(t, "b", v)

	v, err = tb.Remove(a)
	require.NoError(t, err)
	assert.Equal(t, "a", v)
	assert.Equal(t, 1, tb.Len())

	// b is untouched by removing a.
	v, err = tb.Get(b)
	require.NoError(t, err)
	assert.Equal(t, "b", v)

	_, err = tb.Remove(b)
	require.NoError(t, err)
	assert.Equal(t, 0, tb.Len())
}

func TestZeroHandle(t *testing.T) {
	// Kind 0 is the interesting case: a zero handle has kind 0 too, so
	// only the explicit zero check can reject it.
	for _, k := range []Kind{0, 1, 255} {
		tb := NewTable[int](k)
		tb.Insert(1)
		v, err := tb.Get(0)
		requireBad(t, err, "zero handle")
		assert.Zero(t, v)
		_, err = tb.Remove(0)
		requireBad(t, err, "zero handle")
		assert.Equal(t, 1, tb.Len())
	}
}

func TestErrorMessage(t *testing.T) {
	tb := NewTable[int](1)
	h := tb.Insert(1)
	_, err := tb.Remove(h)
	require.NoError(t, err)
	_, err = tb.Get(h)
	requireBad(t, err, "stale")
	assert.EqualError(t, err, "handle: bad handle 0x0100000100000000: stale")
}

func TestStaleAfterRemove(t *testing.T) {
	tb := NewTable[int](1)
	h := tb.Insert(42)
	_, err := tb.Remove(h)
	require.NoError(t, err)
	v, err := tb.Get(h)
	requireBad(t, err, "stale")
	assert.Zero(t, v)
}

func TestDoubleRemove(t *testing.T) {
	tb := NewTable[int](1)
	h := tb.Insert(42)
	keep := tb.Insert(7)
	_, err := tb.Remove(h)
	require.NoError(t, err)
	_, err = tb.Remove(h)
	requireBad(t, err, "stale")
	assert.Equal(t, 1, tb.Len(), "failed Remove must not change Len")

	// A double free must not corrupt the free list: the next inserts get
	// distinct slots, and the surviving handle is unaffected.
	x := tb.Insert(1)
	y := tb.Insert(2)
	assert.NotEqual(t, x, y)
	_, _, ix := parts(x)
	_, _, iy := parts(y)
	assert.NotEqual(t, ix, iy)
	v, err := tb.Get(keep)
	require.NoError(t, err)
	assert.Equal(t, 7, v)
}

func TestWrongKind(t *testing.T) {
	a := NewTable[int](1)
	b := NewTable[int](2)
	ha := a.Insert(10)
	hb := b.Insert(20)
	// Same slot and generation, different kind: only the kind check tells
	// them apart.
	require.Equal(t, ha&^(0xff<<kindShift), hb&^(0xff<<kindShift))

	_, err := b.Get(ha)
	requireBad(t, err, "wrong kind")
	_, err = a.Get(hb)
	requireBad(t, err, "wrong kind")
	_, err = b.Remove(ha)
	requireBad(t, err, "wrong kind")
	assert.Equal(t, 1, a.Len())
	assert.Equal(t, 1, b.Len())
	assert.Equal(t, Kind(1), KindOf(ha))
	assert.Equal(t, Kind(2), KindOf(hb))
	assert.Equal(t, Kind(0), KindOf(0))
}

func TestOutOfRange(t *testing.T) {
	tb := NewTable[int](1)
	h := tb.Insert(1)
	forged := h | idxMask // same kind and generation, last possible slot
	_, err := tb.Get(forged)
	requireBad(t, err, "out of range")
	_, err = tb.Remove(forged)
	requireBad(t, err, "out of range")

	// An empty table has no slots at all.
	empty := NewTable[int](1)
	_, err = empty.Get(h)
	requireBad(t, err, "out of range")
}

func TestForgedHandles(t *testing.T) {
	const kind Kind = 7
	tb := NewTable[uint64](kind)
	live := map[uint64]uint64{}
	for i := range uint64(1000) {
		h := tb.Insert(i)
		live[h] = i
	}
	// Free some, so the table has stale slots as well as live and
	// never-used ones.
	n := 0
	for h := range live {
		if n%3 == 0 {
			_, err := tb.Remove(h)
			require.NoError(t, err)
			delete(live, h)
		}
		n++
	}
	wantLen := len(live)
	liveList := make([]uint64, 0, len(live))
	for h := range live {
		liveList = append(liveList, h)
	}

	r := rand.New(rand.NewSource(1))
	check := func(h uint64) {
		// Plain ifs, not require, on the hot path: this runs a million
		// times and must stay quick under -race.
		v, err := tb.Get(h)
		if want, ok := live[h]; ok {
			if err != nil || v != want {
				t.Fatalf("live handle %#x: got %v, %v; want %v", h, v, err, want)
			}
			return
		}
		if !errors.Is(err, ErrBadHandle) {
			t.Fatalf("forged handle %#x accepted by Get: %v, %v", h, v, err)
		}
		if _, err = tb.Remove(h); !errors.Is(err, ErrBadHandle) {
			t.Fatalf("forged handle %#x accepted by Remove: %v", h, err)
		}
	}
	for range 100_000 {
		// Fully random: almost always wrong kind.
		check(r.Uint64())
		// Right kind, random generation, index near the populated range:
		// exercises the range and generation checks.
		check(uint64(kind)<<kindShift | uint64(r.Int63n(1<<24))<<genShift | uint64(r.Intn(1100)))
		// Right kind, small generation: likely to hit a real slot.
		check(uint64(kind)<<kindShift | uint64(r.Intn(4))<<genShift | uint64(r.Intn(1100)))
		// A live handle with one random bit flipped.
		check(liveList[r.Intn(len(liveList))] ^ 1<<r.Intn(64))
	}
	require.Equal(t, wantLen, tb.Len(), "forged Removes must not free anything")
	for h, want := range live {
		v, err := tb.Get(h)
		require.NoError(t, err)
		require.Equal(t, want, v)
	}
}

func TestSlotReuse(t *testing.T) {
	tb := NewTable[int](1)
	// Fill exactly to the first growth so the free list is empty and the
	// next Insert must reuse the slot we free.
	hs := make([]uint64, minGrow)
	for i := range hs {
		hs[i] = tb.Insert(i)
	}
	old := hs[3]
	_, err := tb.Remove(old)
	require.NoError(t, err)
	nh := tb.Insert(99)

	_, oldGen, oldIdx := parts(old)
	_, newGen, newIdx := parts(nh)
	require.Equal(t, oldIdx, newIdx, "slot should be reused")
	require.NotEqual(t, old, nh)
	require.Equal(t, oldGen+1, newGen)

	_, err = tb.Get(old)
	requireBad(t, err, "stale")
	v, err := tb.Get(nh)
	require.NoError(t, err)
	assert.Equal(t, 99, v)
}

func TestFreeListFIFO(t *testing.T) {
	tb := NewTable[int](1)
	hs := make([]uint64, minGrow)
	for i := range hs {
		hs[i] = tb.Insert(i)
	}
	// Free slots 5 then 2; they must come back in that order.
	for _, i := range []int{5, 2} {
		_, err := tb.Remove(hs[i])
		require.NoError(t, err)
	}
	_, _, a := parts(tb.Insert(0))
	_, _, b := parts(tb.Insert(0))
	assert.Equal(t, []uint32{5, 2}, []uint32{a, b})
}

func TestGenerationWrap(t *testing.T) {
	tb := NewTable[int](1)
	tb.firstGen = genMask - 1 // test hook: start near the top
	hs := make([]uint64, minGrow)
	for i := range hs {
		hs[i] = tb.Insert(i)
	}
	// Cycle slot 0 through the wrap: gens max-1, max, 1, 2.
	h := hs[0]
	seen := []uint64{h}
	var gens []uint32
	for i := range 4 {
		_, g, idx := parts(h)
		require.Equal(t, uint32(0), idx)
		gens = append(gens, g)
		_, err := tb.Remove(h)
		require.NoError(t, err)
		h = tb.Insert(100 + i)
		seen = append(seen, h)
	}
	assert.Equal(t, []uint32{genMask - 1, genMask, 1, 2}, gens)
	for _, old := range seen[:len(seen)-1] {
		_, err := tb.Get(old)
		requireBad(t, err, "stale")
	}
	v, err := tb.Get(h)
	require.NoError(t, err)
	assert.Equal(t, 103, v)

	// A handle with generation 0 never resolves, even for an occupied slot.
	_, err = tb.Get(h &^ (genMask << genShift))
	requireBad(t, err, "stale")
}

func TestChurnLen(t *testing.T) {
	tb := NewTable[int](1)
	const n = 100_000
	r := rand.New(rand.NewSource(2))
	var held []uint64
	for i := range n {
		held = append(held, tb.Insert(i))
		// Remove a random held handle about half the time, so live count
		// wanders and slots are reused in a mixed order.
		if r.Intn(2) == 0 {
			j := r.Intn(len(held))
			if _, err := tb.Remove(held[j]); err != nil {
				t.Fatal(err)
			}
			held[j] = held[len(held)-1]
			held = held[:len(held)-1]
		}
	}
	require.Equal(t, len(held), tb.Len())
	for _, h := range held {
		_, err := tb.Remove(h)
		require.NoError(t, err)
	}
	require.Equal(t, 0, tb.Len())

	// Plain insert/remove pairs on the now-warm table.
	for i := range n {
		h := tb.Insert(i)
		if _, err := tb.Remove(h); err != nil {
			t.Fatal(err)
		}
	}
	require.Equal(t, 0, tb.Len())
}

func TestConcurrent(t *testing.T) {
	type pair struct{ h, v uint64 }
	tb := NewTable[uint64](9)
	const (
		writers = 16
		readers = 8
		iters   = 2000
		board   = 256
	)
	// A board of recently published handles that readers probe while
	// writers remove them, so Get races with Remove and slot reuse.
	var recent [board]atomic.Pointer[pair]
	var nextVal atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup

	errs := make(chan error, writers+readers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			for range iters {
				v := nextVal.Add(1)
				h := tb.Insert(v)
				recent[r.Intn(board)].Store(&pair{h, v})
				got, err := tb.Get(h)
				if err != nil || got != v {
					errs <- errors.New("own handle did not resolve")
					return
				}
				if _, err := tb.Remove(h); err != nil {
					errs <- err
					return
				}
				if _, err := tb.Get(h); !errors.Is(err, ErrBadHandle) {
					errs <- errors.New("removed handle still resolves")
					return
				}
			}
		}()
	}
	var readerWG sync.WaitGroup
	for rd := range readers {
		readerWG.Add(1)
		go func() {
			defer readerWG.Done()
			r := rand.New(rand.NewSource(int64(1000 + rd)))
			for !stop.Load() {
				p := recent[r.Intn(board)].Load()
				if p == nil {
					continue
				}
				got, err := tb.Get(p.h)
				// Either the handle is already gone, or it resolves to
				// exactly the value it was issued for: never another's.
				if err == nil && got != p.v {
					errs <- errors.New("handle resolved to another value")
					return
				}
				if err != nil && !errors.Is(err, ErrBadHandle) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	readerWG.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 0, tb.Len())

	// Racing Removes of the same handle: exactly one may win.
	const handles = 500
	hs := make([]uint64, handles)
	for i := range hs {
		hs[i] = tb.Insert(uint64(i))
	}
	var wins atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, h := range hs {
				if _, err := tb.Remove(h); err == nil {
					wins.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(handles), wins.Load())
	require.Equal(t, 0, tb.Len())
}

func benchTable(n int) (*Table[int], []uint64) {
	tb := NewTable[int](1)
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = tb.Insert(i)
	}
	return tb, hs
}

func BenchmarkGet(b *testing.B) {
	tb, hs := benchTable(1024)
	for i := 0; b.Loop(); i++ {
		if _, err := tb.Get(hs[i&1023]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInsertRemove(b *testing.B) {
	tb, _ := benchTable(1024)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h := tb.Insert(i)
		if _, err := tb.Remove(h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetParallel(b *testing.B) {
	tb, hs := benchTable(1024)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := tb.Get(hs[i&1023]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// BenchmarkGetParallelRWMutexBaseline is the design Get avoids: a map behind
// an RWMutex. Even read locks write the mutex's reader count, so that cache
// line bounces between CPUs; compare with BenchmarkGetParallel.
func BenchmarkGetParallelRWMutexBaseline(b *testing.B) {
	var mu sync.RWMutex
	m := map[uint64]int{}
	for i := range 1024 {
		m[uint64(i)+1] = i
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			mu.RLock()
			_, ok := m[uint64(i&1023)+1]
			mu.RUnlock()
			if !ok {
				b.Error("missing")
				return
			}
			i++
		}
	})
}
