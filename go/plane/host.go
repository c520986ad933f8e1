package plane

// Host liveness. A worker's Go side runs on its own threads: it keeps
// answering the bus and writing heartbeats on its streams while the host
// (a Python event loop) is stuck, say in a handler that blocks the loop for
// seconds. Such a worker looks alive and serves nobody: its streams go
// quiet without ending and the requests it acknowledges wait. A host that
// calls HostTick at least every HostTickInterval says it is awake; one
// whose last tick is older than the host bound (half the stream idle
// timeout, at least five ticks) is stalled, and its runtime then
//
//   - refuses new requests unstarted (the caller sends them elsewhere:
//     they never reached a worker), and
//   - stops the heartbeats of the streams it serves, so their callers
//     declare it silent within the liveness bound and migrate them.
//
// Once the host ticks again all of it resumes. A host that never ticks is
// never taken for stalled (Go programs, tests).

import (
	"time"
)

// HostTickInterval is how often a host that watches itself calls
// HostTick (its header constant is DC_HOST_TICK_MS).
const HostTickInterval = 100 * time.Millisecond

// ackHostStalled refuses a request that arrives while the host is stalled;
// the caller treats it as "no responders".
const ackHostStalled = "the worker's host is not responding"

// HostTick says that the host is awake (see above).
func (r *Runtime) HostTick() { r.hostTick.Store(time.Now().UnixNano()) }

// hostBound is how long the host may go without a tick.
func (r *Runtime) hostBound() time.Duration {
	return max(r.opts.StreamIdleTimeout/2, 5*HostTickInterval)
}

// HostAwake reports whether the host ticked within the host bound (true for
// a host that never ticked, or with liveness checks off).
func (r *Runtime) HostAwake() bool {
	t := r.hostTick.Load()
	if t == 0 || r.opts.StreamIdleTimeout < 0 {
		return true
	}
	return time.Since(time.Unix(0, t)) < r.hostBound()
}
