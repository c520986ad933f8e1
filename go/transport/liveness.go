package transport

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Liveness. A stream can be quiet for a long time on purpose (a long prefill
// before the first item, a consumer that stopped granting credit), so silence
// alone says nothing; a stopped, partitioned or wedged peer must still be
// noticed. Each side therefore:
//
//   - writes a Heartbeat frame whenever it has written nothing for one
//     heartbeat interval (min(DefaultHeartbeat, idle timeout / 5)), from a
//     timer, never waiting for a write in progress (which proves life anyway);
//   - declares its peer gone when it has read nothing at all (no item, no
//     control frame, no heartbeat) for the idle timeout (DefaultIdleTimeout,
//     WithIdleTimeout). It notices within the idle timeout plus half a
//     heartbeat interval: 2.75 s with the defaults.
//
// The caller then ends the stream with ErrPeerSilent (an ErrIncomplete, so
// migration retries it); the worker treats it as a lost caller (Lost). Both
// processes must use compatible settings: a side's idle timeout must exceed
// its peer's heartbeat interval with margin (equal settings always do).
// Heartbeats are sent by Go timers, so a peer whose host language is busy
// (a Python handler in a long step) keeps beating.

// Defaults of the liveness options.
const (
	DefaultIdleTimeout = 2500 * time.Millisecond
	DefaultHeartbeat   = 500 * time.Millisecond
)

// ErrPeerSilent is what Recv returns when the worker sent nothing, not even
// a heartbeat, for the idle timeout. It wraps ErrIncomplete.
var ErrPeerSilent = fmt.Errorf("%w: no word from the worker within the idle timeout", ErrIncomplete)

// WithIdleTimeout (both sides) sets how long a peer may stay silent before it
// is declared gone; the heartbeat interval follows it (see Liveness). Zero
// keeps the default; a negative value disables liveness checks and
// heartbeats (for tests of other timeouts).
func WithIdleTimeout(d time.Duration) Option {
	return func(c *config) {
		if d != 0 {
			c.idleTimeout = d
		}
	}
}

// WithHeartbeatGate (Dial) makes the worker write its heartbeats only while
// awake returns true: a worker whose host is stalled falls silent, so that
// its caller declares it gone within the idle timeout, although the Go side
// could go on beating. Items and control frames are not gated.
func WithHeartbeatGate(awake func() bool) Option {
	return func(c *config) { c.heartbeatGate = awake }
}

// heartbeatFor is the heartbeat interval that goes with an idle timeout.
func heartbeatFor(idle time.Duration) time.Duration {
	return max(min(DefaultHeartbeat, idle/5), time.Millisecond)
}

// checkEvery is how often a watchdog with idle timeout idle is checked:
// half its heartbeat interval. Watchdogs of one period share a round.
func checkEvery(idle time.Duration) time.Duration {
	return max(heartbeatFor(idle)/2, time.Millisecond)
}

// liveness is the watchdog of one side of a connection. Its checks run
// from its round (watchRound): one timer for every watchdog of the same
// period in the process. It has no goroutine of its own: a heartbeat's
// write and the dead callback each run on a short-lived one.
type liveness struct {
	idle  time.Duration
	every time.Duration        // check period: half the heartbeat interval
	beat  func(*liveness) bool // writes a heartbeat unless a write is in progress; false if it could not
	dead  func()               // the peer has been silent for idle; called once

	heard atomic.Bool // a frame arrived since the last check
	wrote atomic.Bool // we wrote a frame since the last heartbeat

	mu        sync.Mutex
	stopped   bool
	lastHeard time.Time // under mu
	lastBeat  time.Time
	interval  time.Duration
	beating   bool // a heartbeat's write is under way (under mu)
}

// startLiveness starts watching; it returns nil when liveness is disabled.
func startLiveness(idle time.Duration, beat func(*liveness) bool, dead func()) *liveness {
	if idle <= 0 {
		return nil
	}
	hb := heartbeatFor(idle)
	now := time.Now()
	l := &liveness{idle: idle, every: checkEvery(idle), beat: beat, dead: dead,
		lastHeard: now, lastBeat: now, interval: hb}
	roundOf(l.every).add(l)
	return l
}

// sawFrame records that the peer sent something. Cheap: one atomic store,
// called for every frame read.
func (l *liveness) sawFrame() {
	if l != nil {
		l.heard.Store(true)
	}
}

// didWrite records that we wrote something, so no heartbeat is due.
func (l *liveness) didWrite() {
	if l != nil {
		l.wrote.Store(true)
	}
}

// isStopped reports whether stop was called (or the peer declared gone).
func (l *liveness) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

func (l *liveness) stop() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	// Its round drops it at its next run.
}

// check is one check of the round: it fails a silent peer (dead) and writes
// a heartbeat when one is due, each on a goroutine of its own, so that a
// write that blocks (a peer that stopped reading) or a slow dead never
// delays the round's other checks. It reports whether l stays in the round.
func (l *liveness) check(now time.Time) bool {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	if l.heard.Swap(false) {
		l.lastHeard = now
	}
	if now.Sub(l.lastHeard) >= l.idle {
		l.stopped = true
		l.mu.Unlock()
		go l.dead()
		return false
	}
	due := false
	if l.wrote.Swap(false) {
		l.lastBeat = now
	} else if now.Sub(l.lastBeat) >= l.interval-l.every/2 && !l.beating {
		due, l.beating = true, true
	}
	l.mu.Unlock()
	if due {
		go l.heartbeat(now)
	}
	return true
}

// heartbeat writes one heartbeat (check found it due at now).
func (l *liveness) heartbeat(now time.Time) {
	ok := l.beat(l)
	l.mu.Lock()
	l.beating = false
	if ok {
		l.lastBeat = now
	}
	l.mu.Unlock()
}

// watchRound runs the checks of every watchdog of one period: one timer
// for all of them, armed while the round has any. A timer per watchdog
// fired at each watchdog's own moment, four times a second a stream on
// each side, and woke the process between an engine's steps for them
// (docs/benchmarks.md, "Where the serving processes' CPU goes"). A
// watchdog's checks stay a period apart; its first comes within one
// period of its start instead of at one period, so its first heartbeat
// within 0.75 to 1.25 heartbeat intervals instead of at one.
//
// Runs never overlap (the timer is rearmed at a run's end), and a
// watchdog's stop takes no lock of the round: the next run drops it.
type watchRound struct {
	every time.Duration

	mu      sync.Mutex
	members map[*liveness]struct{}
	peak    int         // most members since members was last made
	timer   *time.Timer // made on the first add
	armed   bool        // the timer will fire
	running bool        // a run is under way (it rearms the timer at its end)
	batch   []*liveness // the running run's copy of members
}

var (
	roundsMu sync.Mutex
	rounds   = map[time.Duration]*watchRound{} // one per period: a few at most
)

// roundOf is the round of the watchdogs checked every d.
func roundOf(d time.Duration) *watchRound {
	roundsMu.Lock()
	defer roundsMu.Unlock()
	r := rounds[d]
	if r == nil {
		r = &watchRound{every: d, members: map[*liveness]struct{}{}}
		rounds[d] = r
	}
	return r
}

func (r *watchRound) add(l *liveness) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members[l] = struct{}{}
	r.peak = max(r.peak, len(r.members))
	switch {
	case r.armed || r.running:
	case r.timer == nil:
		r.timer, r.armed = time.AfterFunc(r.every, r.run), true
	default:
		r.timer.Reset(r.every)
		r.armed = true
	}
}

// run checks every member, drops those that are done (stopped, or their
// peer declared gone), and rearms the timer while any remain.
func (r *watchRound) run() {
	r.mu.Lock()
	r.armed, r.running = false, true
	batch := r.batch[:0]
	for l := range r.members {
		batch = append(batch, l)
	}
	r.mu.Unlock()
	now := time.Now()
	done := batch[:0] // the members to drop, written over those checked
	for _, l := range batch {
		if !l.check(now) {
			done = append(done, l)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range done {
		delete(r.members, l)
	}
	clear(batch[:cap(batch)])
	r.batch = batch[:0]
	if n := len(r.members); r.peak > 256 && n < r.peak/4 {
		// Maps keep their largest size: after a burst, a smaller one.
		m := make(map[*liveness]struct{}, n)
		for l := range r.members {
			m[l] = struct{}{}
		}
		r.members, r.peak, r.batch = m, n, nil
	}
	r.running = false
	if len(r.members) > 0 {
		r.timer.Reset(r.every)
		r.armed = true
	}
}
