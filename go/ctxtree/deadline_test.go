package ctxtree

import (
	"context"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitKilled fails the test if c is not killed within a generous bound.
func waitKilled(t *testing.T, c *Context) {
	t.Helper()
	select {
	case <-c.Killed():
	case <-time.After(10 * time.Second):
		t.Fatal("not killed")
	}
}

func TestDeadlineKillsWithItsReason(t *testing.T) {
	c := New("d")
	_, ok := c.Remaining()
	require.False(t, ok)
	c.SetDeadline(time.Now().Add(20 * time.Millisecond))
	left, ok := c.Remaining()
	require.True(t, ok)
	assert.LessOrEqual(t, left, 20*time.Millisecond)
	waitKilled(t, c)
	assert.Equal(t, ReasonDeadline, c.Reason())
	assert.Equal(t, ReasonDeadline, c.Cause())
	left, ok = c.Remaining()
	assert.True(t, ok)
	assert.Zero(t, left, "0 once passed")
	assert.ErrorIs(t, c.Std().Err(), context.DeadlineExceeded)
}

func TestPassedDeadlineKillsAtOnce(t *testing.T) {
	c := New("d")
	child := c.Child()
	c.SetDeadline(time.Now().Add(-time.Second))
	require.True(t, c.IsKilled(), "before SetDeadline returns")
	assert.Equal(t, ReasonDeadline, c.Reason())
	assert.True(t, child.IsKilled())
	assert.Equal(t, ReasonParent, child.Reason())
	assert.Equal(t, ReasonDeadline, child.Cause())
}

func TestDeadlineOnlyMovesEarlier(t *testing.T) {
	c := New("d")
	far := time.Now().Add(time.Hour)
	c.SetDeadline(far)
	c.SetDeadline(far.Add(time.Hour))
	d, _ := c.Deadline()
	assert.Equal(t, far, d)
	near := time.Now().Add(10 * time.Millisecond)
	c.SetDeadline(near)
	d, _ = c.Deadline()
	assert.Equal(t, near, d)
	waitKilled(t, c)
}

// Children keep the earlier deadline: linked later, or set on the parent
// after they were linked, with a timer of their own (so a finished parent
// does not take it away).
func TestChildrenKeepTheEarlierDeadline(t *testing.T) {
	p := New("p")
	early := p.Child()
	p.SetDeadline(time.Now().Add(time.Hour))
	late := New("late")
	late.SetDeadline(time.Now().Add(2 * time.Hour))
	p.LinkChild(late)
	mine := New("mine")
	mineAt := time.Now().Add(time.Minute)
	mine.SetDeadline(mineAt)
	p.LinkChild(mine)
	pd, _ := p.Deadline()
	for _, c := range []*Context{early, late} {
		d, ok := c.Deadline()
		require.True(t, ok)
		assert.Equal(t, pd, d)
	}
	d, _ := mine.Deadline()
	assert.Equal(t, mineAt, d, "its own, earlier, stays")

	q := New("q")
	kid := q.Child()
	q.SetDeadline(time.Now().Add(30 * time.Millisecond))
	q.Finish()
	waitKilled(t, kid)
	assert.Equal(t, ReasonDeadline, kid.Reason(), "its own timer fired")
	assert.False(t, q.IsKilled(), "a finished context's timer is stopped")
}

func TestKilledOrFinishedContextIgnoresDeadline(t *testing.T) {
	c := New("c")
	c.Kill()
	c.SetDeadline(time.Now())
	_, ok := c.Deadline()
	assert.False(t, ok)
	assert.Equal(t, ReasonKill, c.Reason())
	f := New("f")
	f.Finish()
	f.SetDeadline(time.Now().Add(-time.Second))
	assert.False(t, f.IsStopped())
}

// A stopped (not killed) context is still killed by its deadline.
func TestStoppedContextIsKilledByItsDeadline(t *testing.T) {
	c := New("s")
	c.SetDeadline(time.Now().Add(20 * time.Millisecond))
	c.StopGenerating()
	waitKilled(t, c)
	assert.Equal(t, ReasonDeadline, c.Reason())
}

// A deadline racing a kill: exactly one wins, the context ends killed, and
// nothing fires twice.
func TestDeadlineRacesKill(t *testing.T) {
	for i := 0; i < 500; i++ {
		c := New("r")
		fired := 0
		var mu sync.Mutex
		c.Notify(Killed, func() { mu.Lock(); fired++; mu.Unlock() })
		at := time.Now().Add(time.Duration(i%50) * time.Microsecond)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); c.SetDeadline(at) }()
		go func() { defer wg.Done(); time.Sleep(time.Duration(i%40) * time.Microsecond); c.Kill() }()
		wg.Wait()
		waitKilled(t, c)
		r := c.Reason()
		assert.True(t, r == ReasonKill || r == ReasonDeadline, r)
		// The timer's goroutine may still be running the hook it fired.
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return fired == 1 }, 10*time.Second, time.Millisecond)
		time.Sleep(time.Millisecond)
		mu.Lock()
		assert.Equal(t, 1, fired, "once")
		mu.Unlock()
	}
}

// The timer holds its context weakly: a context nothing else holds is
// collected before its deadline.
func TestTimerDoesNotKeepContextAlive(t *testing.T) {
	collected := make(chan struct{})
	func() {
		c := New("gc")
		c.SetDeadline(time.Now().Add(time.Hour))
		runtime.AddCleanup(c, func(ch chan struct{}) { close(ch) }, collected)
	}()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("a context held only by its deadline's timer was not collected")
}

func TestTimeoutError(t *testing.T) {
	for _, ok := range []float64{0, 0.5, 30, MaxTimeout.Seconds() - 1} {
		assert.NoError(t, TimeoutError(ok), ok)
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1), MaxTimeout.Seconds(), 1e300} {
		assert.Error(t, TimeoutError(bad), bad)
	}
}

// Timeout and TimeoutMicros take exactly what TimeoutError takes, to the
// last microsecond below MaxTimeout, and give it as a duration.
func TestTimeoutInSecondsAndMicroseconds(t *testing.T) {
	d, err := Timeout(2.5)
	require.NoError(t, err)
	assert.Equal(t, 2500*time.Millisecond, d)
	_, err = Timeout(-1)
	assert.EqualError(t, err, TimeoutError(-1).Error())

	last := MaxTimeout.Microseconds() - 1
	for _, ok := range []int64{0, 1, 2500000, last} {
		d, err := TimeoutMicros(ok)
		require.NoError(t, err, ok)
		assert.Equal(t, time.Duration(ok)*time.Microsecond, d)
	}
	for _, bad := range []int64{-1, last + 1, math.MaxInt64, math.MinInt64} {
		_, err := TimeoutMicros(bad)
		assert.Error(t, err, bad)
	}
	_, err = TimeoutMicros(last + 1)
	assert.EqualError(t, err, TimeoutError(MaxTimeout.Seconds()).Error())
}
