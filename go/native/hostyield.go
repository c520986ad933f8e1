package main

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Renewing the scheduling tick of the host's thread.
//
// (The Python module now posts its per-step items and its 100 ms tick
// instead of calling in: posted.go. What follows applies to the hosts and
// the moments that still call dc_request_send_multi: a C host, or the
// module while a request's buffer is full.)
//
// A call from the host (Python's thread) into an export runs as a
// goroutine locked to that thread, holding a P; back in C, the thread
// keeps the P in the system-call state until its next call. Go's monitor
// thread (sysmon) takes such a P away once it has seen the P's
// scheduling tick unchanged for 10 ms, and a call's goroutine never
// passes through the scheduler, so its tick never changes: a worker that
// calls in at every engine step (dc_request_send_multi) lost its P every
// 10-20 ms. Each time, the next call took an idle P and woke sysmon,
// which after a retake polls every 20 us for about a millisecond before
// it slows down again: on the real engine at 16 streams sysmon was a
// fifth of the worker's CPU samples, and most of its thread switches.
//
// So the per-step export, after its work, passes through the scheduler
// (runtime.Gosched) when hostYieldEvery has gone by since the last time:
// the tick moves, the P stays, sysmon stays at its slow pace. The yield
// hands the P to another thread and back (the goroutine is locked to the
// host's thread): some tens of microseconds on the calling thread, more
// when goroutines the call readied run first or the other thread waits
// for a CPU, at most every hostYieldEvery; calls further apart than 10 ms lose their P
// as before (there is nothing to keep then). This leans on how the
// runtime schedules (Go 1.26's retake); were that to change, the yield
// would only cost its handoff.
const hostYieldEvery = 5 * time.Millisecond

// hostEpoch is what hostNow counts from: the monotonic clock, which no
// change of the wall clock moves.
var hostEpoch = time.Now()

// hostNow is the time for renewHostTick: nanoseconds since hostEpoch.
func hostNow() int64 { return int64(time.Since(hostEpoch)) }

// lastHostYield is when the host's thread last yielded (hostNow); one for
// all host threads, as a worker has one that sends.
var lastHostYield atomic.Int64

// renewHostTick yields the calling goroutine when hostYieldEvery has gone
// by since the last yield (now is hostNow), and says whether it did.
func renewHostTick(now int64) bool {
	last := lastHostYield.Load()
	if now-last < int64(hostYieldEvery) || !lastHostYield.CompareAndSwap(last, now) {
		return false
	}
	runtime.Gosched()
	return true
}
