package procs

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The rule: one P after LowWindows windows in a row under LowCPUs, the
// default after one window over HighCPUs; anything between keeps the state.
func TestNext(t *testing.T) {
	for _, c := range []struct {
		atOne        bool
		use          float64
		low          int
		toOne, toDef bool
		lowAfter     int
	}{
		{false, 0.1, 0, false, false, 1},
		{false, 0.1, LowWindows - 2, false, false, LowWindows - 1},
		{false, 0.1, LowWindows - 1, true, false, 0},
		{false, LowCPUs, LowWindows - 1, false, false, 0}, // not under: the count starts again
		{false, 3, 5, false, false, 0},
		{true, 0.1, 0, false, false, 0},
		{true, HighCPUs, 0, false, false, 0},
		{true, HighCPUs + 0.01, 0, false, true, 0},
		{true, math.Inf(1), 0, false, true, 0}, // unknown: busy
	} {
		toOne, toDef, low := next(c.atOne, c.use, c.low)
		assert.Equal(t, []any{c.toOne, c.toDef, c.lowAfter}, []any{toOne, toDef, low}, "%+v", c)
	}
}

// fakeCPU stands for the process's CPU time: it grows at rate CPUs.
type fakeCPU struct {
	mu   sync.Mutex
	rate float64
	acc  time.Duration
	at   time.Time
	ok   bool
}

func (f *fakeCPU) read() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	return f.acc, f.ok
}

func (f *fakeCPU) set(rate float64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	f.rate, f.ok = rate, ok
}

func (f *fakeCPU) advance() {
	now := time.Now()
	f.acc += time.Duration(f.rate * float64(now.Sub(f.at)))
	f.at = now
}

func withFake(t *testing.T) *fakeCPU {
	t.Helper()
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("one CPU: the runtime's default is one P already")
	}
	t.Setenv("GOMAXPROCS", "")
	// From the runtime's default (go test -cpu sets its own), restored after.
	prev := runtime.GOMAXPROCS(0)
	runtime.SetDefaultGOMAXPROCS()
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	f := &fakeCPU{at: time.Now(), ok: true}
	window, cpuTime = 5*time.Millisecond, f.read
	t.Cleanup(func() { window, cpuTime = Window, processCPU })
	return f
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, what)
}

// Quiet, the process goes to one P; busy, back to the runtime's default;
// the last release gives the default back and stops the goroutine.
func TestFitsThePsToTheLoad(t *testing.T) {
	f := withFake(t)
	def := runtime.GOMAXPROCS(0)
	f.set(0.05, true)
	release := Acquire()
	t.Cleanup(release) // before withFake's: stops the goroutine on a failure
	waitFor(t, "one P while quiet", func() bool { return One() && runtime.GOMAXPROCS(0) == 1 })

	f.set(0.9, true)
	waitFor(t, "the default while busy", func() bool { return !One() && runtime.GOMAXPROCS(0) == def })

	f.set(0.05, true)
	waitFor(t, "one P again", One)
	inner := Acquire() // a second user: the last release stops it
	inner()
	inner() // idempotent
	assert.True(t, One())
	release()
	assert.False(t, One())
	assert.Equal(t, def, runtime.GOMAXPROCS(0))
}

// A window whose CPU time cannot be read counts as busy.
func TestAnUnreadableWindowCountsAsBusy(t *testing.T) {
	f := withFake(t)
	def := runtime.GOMAXPROCS(0)
	f.set(0, true)
	t.Cleanup(Acquire())
	waitFor(t, "one P while quiet", One)
	f.set(0, false)
	waitFor(t, "the default when unreadable", func() bool { return !One() && runtime.GOMAXPROCS(0) == def })
}

// A GOMAXPROCS set in the environment is the deployment's: left alone.
func TestAGivenGOMAXPROCSIsLeftAlone(t *testing.T) {
	f := withFake(t)
	t.Setenv("GOMAXPROCS", "2")
	f.set(0, true)
	before := moves.Load()
	t.Cleanup(Acquire())
	time.Sleep(20 * LowWindows * window)
	assert.False(t, One())
	assert.Equal(t, before, moves.Load())
}
