// Package procs fits a process's Ps (GOMAXPROCS) to its load: one P while
// the process uses little CPU, the runtime's default once it uses more.
//
// Why: a frontend between an engine's steps idles, and each step's
// message wakes it. With more than one P, the goroutine that reads the
// message readies the streams' goroutines, and the runtime starts a second
// thread to look for more work at the first of them (its wakep): two
// thread wake-ups a step where one would do. A wake-up after a few
// milliseconds asleep costs tens of microseconds of CPU on a virtual
// machine, more than the step's work. With one P, nothing is there for a
// second thread to take. On the real engine at 16 streams (2026-12-07,
// docs/benchmarks.md), the frontend with one P switched threads half as
// often and spent a fifth to a quarter less CPU per token, with the same
// tokens/s and abort latencies. A busy frontend needs its CPUs, so it gets
// the default back as soon as it uses more than HighCPUs.
//
// The process's CPU time (user + system, every thread; a window whose
// time cannot be read counts as busy) is read every Window: one P once it
// stayed under LowCPUs for LowWindows in a row, the runtime's default
// (runtime.SetDefaultGOMAXPROCS, which also takes the runtime's own
// updates back) once a window goes over HighCPUs. Each
// change stops the world for some tens of microseconds; the hysteresis
// keeps changes rare. A GOMAXPROCS set in the environment is the
// deployment's choice: then, or where the default is already one P, the
// Ps are left alone.
//
// At one P, a call into the library from a thread of the host's (the
// Python module's pump of the library's log records) keeps the P when it
// returns to C, until the runtime's monitor (sysmon) takes it back: within
// about 40 us when the call woke the monitor from its deep sleep, as it
// usually does in a quiet process, up to some 20 ms when the monitor was
// awake and slowed down. A frontend logs at most a line a request at its
// default level; with a client leaving every 40 ms over 16 streams, the
// gaps between tokens at one P were no longer than with the default's Ps
// (p99.9 7.7 ms against 8.1-8.6, 6,400 gaps, 2026-12-07).
package procs

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// Window is how often the process's CPU time is read.
	Window = 250 * time.Millisecond
	// LowCPUs is the use (in CPUs, over a window) under which the process
	// goes to one P, once it stayed under it for LowWindows in a row.
	LowCPUs = 0.25
	// LowWindows is how many windows in a row (2 s) the use stays under
	// LowCPUs before the process goes to one P.
	LowWindows = 8
	// HighCPUs is the use over which the process at one P gets the
	// runtime's default back, after one window.
	HighCPUs = 0.5
)

var (
	mu    sync.Mutex
	users int
	stop  chan struct{} // closed by the last release
	done  chan struct{} // closed when the fitting goroutine returned

	one   atomic.Bool  // the process runs at one P, set here
	moves atomic.Int64 // changes made (the tests)

	// What the tests replace: the window, and the process's CPU time.
	window  = Window
	cpuTime = processCPU
)

// Acquire fits the process's Ps to its load for as long as the returned
// release has not been called: the first Acquire starts, the last release
// stops and gives the runtime its default back. release is idempotent.
// Where GOMAXPROCS is set in the environment, or the runtime's default is
// one P, nothing is fitted. A GOMAXPROCS the program set itself
// (runtime.GOMAXPROCS) is not seen: after a move it is the default again.
func Acquire() (release func()) {
	mu.Lock()
	defer mu.Unlock()
	users++
	if users == 1 && os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > 1 {
		stop, done = make(chan struct{}), make(chan struct{})
		go fit(stop, done)
	}
	var once sync.Once
	return func() { once.Do(releaseOne) }
}

func releaseOne() {
	mu.Lock()
	defer mu.Unlock()
	users--
	if users > 0 || stop == nil {
		return
	}
	close(stop)
	<-done
	stop, done = nil, nil
}

// One says whether the process runs at one P by this package's doing.
func One() bool { return one.Load() }

// fit reads the process's CPU time every window and moves its Ps (next)
// until stop is closed, then gives the runtime its default back.
func fit(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(window)
	defer t.Stop()
	lastCPU, lastOK := cpuTime()
	lastAt := time.Now()
	low := 0
	for {
		select {
		case <-stop:
			if one.Load() {
				move(false)
			}
			return
		case <-t.C:
		}
		c, ok := cpuTime()
		now := time.Now()
		use := math.Inf(1) // unknown: taken for busy
		if el := now.Sub(lastAt); ok && lastOK && el > 0 {
			use = float64(c-lastCPU) / float64(el)
		}
		lastCPU, lastOK, lastAt = c, ok, now
		toOne, toDefault, l := next(one.Load(), use, low)
		low = l
		if toOne || toDefault {
			move(toOne)
			slog.Debug("procs: moved", "one", toOne, "cpus", fmt.Sprintf("%.3f", use), "procs", runtime.GOMAXPROCS(0))
		}
	}
}

// move runs the process at one P (toOne), or at the runtime's default.
func move(toOne bool) {
	if toOne {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.SetDefaultGOMAXPROCS()
	}
	one.Store(toOne)
	moves.Add(1)
}

// next is the rule: from one P (atOne) or the default, given a window's
// use in CPUs and how many windows in a row came in under LowCPUs before
// it, whether to go to one P or to the default, and the new count.
func next(atOne bool, use float64, low int) (toOne, toDefault bool, lowAfter int) {
	if atOne {
		return false, use > HighCPUs, 0
	}
	if use >= LowCPUs {
		return false, false, 0
	}
	if low+1 >= LowWindows {
		return true, false, 0
	}
	return false, false, low + 1
}

// processCPU is the CPU time of every thread of the process so far, or
// false where it cannot be read.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
