package ctxtree

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestStatesAreMonotonic(t *testing.T) {
	c := New("req-1")
	require.Equal(t, "req-1", c.ID())
	st, r := c.State()
	assert.Equal(t, Live, st)
	assert.Equal(t, ReasonNone, r)
	assert.False(t, c.IsStopped())
	assert.False(t, c.IsKilled())

	c.StopGenerating()
	assert.True(t, c.IsStopped())
	assert.False(t, c.IsKilled())
	assert.Equal(t, ReasonStopGenerating, c.Reason())

	c.StopGenerating() // idempotent
	assert.Equal(t, ReasonStopGenerating, c.Reason())

	c.Kill()
	assert.True(t, c.IsStopped())
	assert.True(t, c.IsKilled())
	assert.Equal(t, ReasonKill, c.Reason())

	c.StopGenerating() // never backwards
	assert.True(t, c.IsKilled())
	assert.Equal(t, ReasonKill, c.Reason())
	assert.False(t, c.Cancel(Stopped, ReasonShutdown))
	assert.False(t, c.Cancel(Killed, ReasonShutdown))
	assert.Equal(t, ReasonKill, c.Reason())
}

func TestKillLiveGoesStraightToKilled(t *testing.T) {
	c := New("x")
	stopped, killed := c.Stopped(), c.Killed()
	require.True(t, c.Cancel(Killed, ReasonClientDisconnected))
	assert.True(t, isClosed(stopped), "a kill also releases Stopped waiters")
	assert.True(t, isClosed(killed))
	assert.Equal(t, ReasonClientDisconnected, c.Reason())
}

func TestCancelRejectsLiveTarget(t *testing.T) {
	c := New("x")
	assert.False(t, c.Cancel(Live, ReasonKill))
	assert.False(t, c.Cancel(State(7), ReasonKill))
	assert.False(t, c.IsStopped())
}

func TestChannels(t *testing.T) {
	c := New("x")
	s, k := c.Stopped(), c.Killed()
	assert.False(t, isClosed(s))
	c.StopGenerating()
	assert.True(t, isClosed(s))
	assert.False(t, isClosed(k))
	assert.True(t, isClosed(c.Stopped()))
	c.Kill()
	assert.True(t, isClosed(k))
	assert.True(t, isClosed(c.Killed()))
}

func TestReasonNames(t *testing.T) {
	want := []string{"stop_generating", "kill", "client_disconnected", "parent", "deadline", "connection_lost", "shutdown"}
	for i, name := range want {
		r := Reason(i + 1)
		assert.Equal(t, name, r.String())
		assert.True(t, r.Valid())
		back, ok := ReasonFromString(name)
		assert.True(t, ok)
		assert.Equal(t, r, back)
	}
	assert.False(t, ReasonNone.Valid())
	assert.False(t, Reason(99).Valid())
	_, ok := ReasonFromString("nope")
	assert.False(t, ok)
}

func TestPackUnpack(t *testing.T) {
	for s := Live; s <= Killed; s++ {
		for r := ReasonNone; r < NumReasons; r++ {
			gs, gr := Unpack(Pack(s, r))
			assert.Equal(t, s, gs)
			assert.Equal(t, r, gr)
		}
	}
}

func TestPropagation(t *testing.T) {
	p := New("p")
	a, b := New("a"), New("b")
	p.LinkChild(a)
	a.LinkChild(b)

	p.StopGenerating()
	for _, c := range []*Context{a, b} {
		assert.True(t, c.IsStopped())
		assert.False(t, c.IsKilled())
		assert.Equal(t, ReasonParent, c.Reason())
	}
	p.Kill()
	for _, c := range []*Context{a, b} {
		assert.True(t, c.IsKilled())
	}
}

func TestChildDoesNotAffectParent(t *testing.T) {
	p := New("p")
	c := p.Child()
	assert.Equal(t, "p", c.ID())
	c.Kill()
	assert.False(t, p.IsStopped())
}

func TestLinkToCancelledParentAppliesAtOnce(t *testing.T) {
	p := New("p")
	p.StopGenerating()
	c := New("c")
	p.LinkChild(c)
	assert.True(t, c.IsStopped())
	assert.False(t, c.IsKilled())
	// A stopped parent still holds its children: a later kill reaches them.
	p.Kill()
	assert.True(t, c.IsKilled())

	k := New("k")
	k.Kill()
	c2 := k.Child()
	assert.True(t, c2.IsKilled())
	assert.Equal(t, ReasonParent, c2.Reason())
	assert.Equal(t, 0, k.NumChildren(), "a killed parent remembers no children")
}

func TestStopOnKilledChildChangesNothing(t *testing.T) {
	p := New("p")
	c := p.Child()
	c.Kill()
	p.StopGenerating()
	assert.Equal(t, ReasonKill, c.Reason())
}

func TestCycleTerminates(t *testing.T) {
	a, b, c := New("a"), New("b"), New("c")
	a.LinkChild(b)
	b.LinkChild(c)
	c.LinkChild(a)
	a.LinkChild(a)
	b.StopGenerating()
	for _, x := range []*Context{a, b, c} {
		assert.True(t, x.IsStopped())
	}
	c.Kill()
	for _, x := range []*Context{a, b, c} {
		assert.True(t, x.IsKilled())
	}
}

func TestDeepChain(t *testing.T) {
	const n = 10000
	root := New("root")
	cur := root
	all := make([]*Context, 0, n)
	for i := 0; i < n; i++ {
		cur = cur.Child()
		all = append(all, cur)
	}
	root.Kill()
	for _, c := range all {
		require.True(t, c.IsKilled())
	}
}

func TestWideFanOut(t *testing.T) {
	const n = 10000
	root := New("root")
	kids := make([]*Context, n)
	for i := range kids {
		kids[i] = root.Child()
	}
	assert.Equal(t, n, root.NumChildren())
	root.StopGenerating()
	for _, c := range kids {
		require.True(t, c.IsStopped())
		require.False(t, c.IsKilled())
	}
	root.Kill()
	for _, c := range kids {
		require.True(t, c.IsKilled())
	}
}

func TestFinishUnlinks(t *testing.T) {
	p := New("p")
	kids := make([]*Context, 1000)
	for i := range kids {
		kids[i] = p.Child()
	}
	q := New("q")
	q.LinkChild(kids[0])
	for _, k := range kids {
		k.Finish()
	}
	assert.Equal(t, 0, p.NumChildren())
	assert.Equal(t, 0, q.NumChildren())
	kids[1].Finish() // idempotent
	p.LinkChild(kids[2])
	assert.Equal(t, 0, p.NumChildren(), "a finished context is not linked again")
	p.Kill()
	assert.False(t, kids[2].IsStopped())

	// A finished context still propagates to its own children.
	f := New("f")
	g := f.Child()
	f.Finish()
	f.Kill()
	assert.True(t, g.IsKilled())
}

func TestUnreferencedChildrenArePruned(t *testing.T) {
	p := New("p")
	for i := 0; i < 10000; i++ {
		p.Child()
	}
	// Weak pointers die once the children are collected; the next links prune.
	require.Eventually(t, func() bool {
		runtime.GC()
		p.Child()
		return p.NumChildren() < 100
	}, 10*time.Second, time.Millisecond)
	p.mu.Lock()
	size := len(p.children)
	p.mu.Unlock()
	assert.Less(t, size, 100, "dead entries are swept from the map")
}

func TestNotify(t *testing.T) {
	c := New("x")
	var stops, kills atomic.Int32
	c.Notify(Stopped, func() { stops.Add(1) })
	c.Notify(Killed, func() { kills.Add(1) })
	cancelMe := c.Notify(Stopped, func() { t.Error("unregistered hook ran") })
	assert.True(t, cancelMe())
	assert.False(t, cancelMe())

	c.StopGenerating()
	assert.EqualValues(t, 1, stops.Load())
	assert.EqualValues(t, 0, kills.Load())
	c.Kill()
	c.Kill()
	assert.EqualValues(t, 1, stops.Load())
	assert.EqualValues(t, 1, kills.Load())

	var late atomic.Int32
	stop := c.Notify(Killed, func() { late.Add(1) })
	assert.EqualValues(t, 1, late.Load(), "already there: runs at once")
	assert.False(t, stop())
}

func TestHooksRunBeforeChannelsClose(t *testing.T) {
	parent := New("x")
	child := parent.Child()
	for _, c := range []*Context{parent, child} {
		stopped, killed := c.Stopped(), c.Killed()
		var open int
		c.Notify(Killed, func() {
			if !isClosed(stopped) {
				open++
			}
			if !isClosed(killed) {
				open++
			}
			assert.True(t, c.IsKilled(), "the word moves first")
			assert.True(t, isClosed(c.Killed()), "a channel asked for from now on is closed")
		})
		defer func() { assert.Equal(t, 2, open, "both channels were still open in the hook") }()
	}
	parent.Kill()
	for _, c := range []*Context{parent, child} {
		assert.True(t, isClosed(c.Stopped()))
		assert.True(t, isClosed(c.Killed()), "closed when Cancel returns")
	}
}

func TestNotifyRunsInRegistrationOrder(t *testing.T) {
	for range 50 { // map order would differ between runs
		c := New("x")
		var got []int
		for i := range 20 {
			target := Stopped
			if i%2 == 1 {
				target = Killed
			}
			c.Notify(target, func() { got = append(got, i) })
		}
		c.Kill()
		want := make([]int, 20)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, got)
	}
}

func TestNotifyCanReenter(t *testing.T) {
	c := New("x")
	var seen Reason
	c.Notify(Stopped, func() { seen = c.Reason(); c.Kill() })
	c.StopGenerating()
	assert.Equal(t, ReasonStopGenerating, seen)
	assert.True(t, c.IsKilled())
}

func TestWithStateWord(t *testing.T) {
	var w atomic.Uint32
	c := New("x", WithStateWord(&w))
	c.Kill()
	st, r := Unpack(w.Load())
	assert.Equal(t, Killed, st)
	assert.Equal(t, ReasonKill, r)
}

func TestStdBridge(t *testing.T) {
	c := New("x")
	std := c.Std()
	assert.Nil(t, std.Err())
	assert.Same(t, c, FromStd(std))
	derived, cancel := context.WithCancel(std)
	defer cancel()
	assert.Same(t, c, FromStd(derived))
	assert.Nil(t, FromStd(context.Background()))

	c.StopGenerating()
	select {
	case <-derived.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("derived context not cancelled")
	}
	assert.ErrorIs(t, std.Err(), context.Canceled)

	d := New("d")
	d.Cancel(Killed, ReasonDeadline)
	assert.ErrorIs(t, d.Std().Err(), context.DeadlineExceeded)
}

func TestFollowStd(t *testing.T) {
	std, cancel := context.WithCancel(context.Background())
	c := New("x")
	c.FollowStd(std)
	cancel()
	select {
	case <-c.Killed():
	case <-time.After(10 * time.Second):
		t.Fatal("not killed")
	}
	assert.Equal(t, ReasonParent, c.Reason())

	dl, cancel2 := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel2()
	d := New("d")
	d.FollowStd(dl)
	select {
	case <-d.Killed():
	case <-time.After(10 * time.Second):
		t.Fatal("not killed by deadline")
	}
	assert.Equal(t, ReasonDeadline, d.Reason())

	e := New("e")
	bg, cancel3 := context.WithCancel(context.Background())
	stop := e.FollowStd(bg)
	assert.True(t, stop())
	cancel3()
	assert.False(t, e.IsStopped())
}

// Links racing cancels: whatever the interleaving, every child linked to a
// parent that ends up killed is killed once everything returned.
func TestRaceLinkAgainstKill(t *testing.T) {
	for round := 0; round < 200; round++ {
		p := New("p")
		const n = 64
		kids := make([]*Context, n)
		for i := range kids {
			kids[i] = New(fmt.Sprint(i))
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(c *Context) {
				defer wg.Done()
				<-start
				p.LinkChild(c)
			}(kids[i])
		}
		wg.Add(2)
		go func() { defer wg.Done(); <-start; p.StopGenerating() }()
		go func() { defer wg.Done(); <-start; p.Kill() }()
		close(start)
		wg.Wait()
		for _, c := range kids {
			require.True(t, c.IsKilled(), "round %d: child missed the kill", round)
		}
	}
}

// A random graph (with cycles) cancelled from many goroutines in random order
// while links are still being added: every node reachable from a killed node
// through links made before the kill ends up killed, and nothing deadlocks.
func TestRaceRandomGraph(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 50; round++ {
		const n = 200
		nodes := make([]*Context, n)
		for i := range nodes {
			nodes[i] = New(fmt.Sprint(i))
		}
		type edge struct{ a, b int }
		edges := make([]edge, 600)
		for i := range edges {
			edges[i] = edge{rng.Intn(n), rng.Intn(n)}
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(part []edge) {
				defer wg.Done()
				for _, e := range part {
					nodes[e.a].LinkChild(nodes[e.b])
				}
			}(edges[g*150 : (g+1)*150])
		}
		victims := rng.Perm(n)[:10]
		for _, v := range victims {
			wg.Add(1)
			go func(c *Context) { defer wg.Done(); c.Kill() }(nodes[v])
		}
		wg.Wait()
		// After all links and kills returned, the kill set is closed under edges.
		for _, e := range edges {
			if nodes[e.a].IsKilled() {
				require.True(t, nodes[e.b].IsKilled(), "edge %d->%d", e.a, e.b)
			}
		}
	}
}

func TestConcurrentCancelsOneWinner(t *testing.T) {
	c := New("x")
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.Cancel(Killed, ReasonKill) {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, wins.Load())
}

func TestNoGoroutinesPerLink(t *testing.T) {
	before := runtime.NumGoroutine()
	root := New("r")
	for i := 0; i < 1000; i++ {
		root.Child().Child()
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), before)
	root.Kill()
}

func TestMemoryPerContext(t *testing.T) {
	const n = 10000
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	root := New("root")
	kids := make([]*Context, n)
	for i := range kids {
		kids[i] = root.Child()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per linked context", per)
	assert.Less(t, per, 2048.0)
	runtime.KeepAlive(kids)
}

func BenchmarkCreateCancel(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		c := New("req")
		c.Kill()
	}
}

func BenchmarkLink(b *testing.B) {
	b.ReportAllocs()
	p := New("p")
	for i := 0; i < b.N; i++ {
		c := New("c")
		p.LinkChild(c)
		c.Finish()
	}
}

func BenchmarkFanOut10k(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		root := New("r")
		kids := make([]*Context, 10000)
		for j := range kids {
			kids[j] = root.Child()
		}
		b.StartTimer()
		root.Kill()
		runtime.KeepAlive(kids)
	}
}

func BenchmarkChain1k(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		root := New("r")
		cur := root
		for j := 0; j < 1000; j++ {
			cur = cur.Child()
		}
		b.StartTimer()
		root.Kill()
		runtime.KeepAlive(cur)
	}
}

func BenchmarkIsStopped(b *testing.B) {
	c := New("x")
	n := 0
	for i := 0; i < b.N; i++ {
		if c.IsStopped() {
			n++
		}
	}
	_ = n
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := NewID()
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func TestCauseFollowsPropagation(t *testing.T) {
	root := New("r")
	mid := root.Child()
	leaf := mid.Child()
	assert.Equal(t, ReasonNone, leaf.Cause())
	root.Cancel(Killed, ReasonClientDisconnected)
	assert.Equal(t, ReasonParent, leaf.Reason())
	assert.Equal(t, ReasonClientDisconnected, leaf.Cause(), "the origin's reason")
	assert.Equal(t, ReasonClientDisconnected, root.Cause())

	late := New("late")
	root.LinkChild(late) // linked after the cancel: same cause
	assert.Equal(t, ReasonClientDisconnected, late.Cause())

	s := New("s")
	s.StopGenerating()
	s.Kill() // a later kill replaces both reason and cause
	assert.Equal(t, ReasonKill, s.Cause())
	st, r := Unpack(s.StateWord().Load())
	assert.Equal(t, Killed, st)
	assert.Equal(t, ReasonKill, r)
}

func TestCountKills(t *testing.T) {
	var n atomic.Uint64
	CountKills(&n)
	defer CountKills(nil)
	root := New("r")
	kid := root.Child()
	grandkid := kid.Child()
	root.StopGenerating()
	assert.Zero(t, n.Load(), "a stop is not a kill")
	before := n.Load()
	root.Kill()
	// Counted by the time Kill returns: once per context that became Killed.
	assert.Equal(t, before+3, n.Load())
	root.Kill()
	grandkid.Kill()
	assert.Equal(t, before+3, n.Load(), "a context is killed once")

	// Concurrent kills: every one is counted, whichever goroutine makes it.
	var wg sync.WaitGroup
	base := n.Load()
	for i := 0; i < 100; i++ {
		c := New("c")
		wg.Add(2)
		go func() { defer wg.Done(); c.Kill() }()
		go func() { defer wg.Done(); c.Kill() }()
	}
	wg.Wait()
	assert.Equal(t, base+100, n.Load())

	CountKills(nil)
	New("x").Kill()
	assert.Equal(t, base+100, n.Load(), "not counted once CountKills(nil)")
}

// Next is the transition rule Cancel applies: forward only, the reason and
// cause change only with the state.
func TestNextIsCancelsRule(t *testing.T) {
	states := []State{Stopped, Killed}
	for _, s1 := range states {
		for r1 := ReasonStopGenerating; r1 < NumReasons; r1++ {
			for _, s2 := range states {
				for r2 := ReasonStopGenerating; r2 < NumReasons; r2++ {
					c := New("x")
					w := c.StateWord().Load()
					w1, changed1 := Next(w, s1, r1, r1)
					assert.Equal(t, c.Cancel(s1, r1), changed1)
					assert.Equal(t, c.StateWord().Load(), w1)
					w2, changed2 := Next(w1, s2, r2, r2)
					assert.Equal(t, c.Cancel(s2, r2), changed2)
					assert.Equal(t, c.StateWord().Load(), w2)
					assert.Equal(t, s2 > s1, changed2, "forward only")
				}
			}
		}
	}
	w, changed := Next(Pack(Killed, ReasonKill), Stopped, ReasonDeadline, ReasonDeadline)
	assert.False(t, changed)
	assert.Equal(t, Pack(Killed, ReasonKill), w)
	w, changed = Next(0, Killed, ReasonParent, ReasonClientDisconnected)
	assert.True(t, changed)
	assert.Equal(t, ReasonClientDisconnected, Reason(w>>16&0xff))
}

// A cancel of a context with the hooks an in-process request's has (a
// handful of Notify and NotifyHeld functions), held as Context.kill holds
// it: the cost per cancel, allocations included.
func BenchmarkCancelWithHooks(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		c := New("x")
		for range 3 {
			c.Notify(Killed, func() {})
			c.NotifyHeld(Killed, func(h *Held) { h.Wake(func() {}) })
		}
		var h Held
		c.CancelHolding(Killed, ReasonKill, &h)
		h.Run()
	}
}
