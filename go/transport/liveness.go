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

// liveness is the watchdog of one side of a connection: one timer, no
// goroutine of its own.
type liveness struct {
	idle  time.Duration
	every time.Duration        // check period: half the heartbeat interval
	beat  func(*liveness) bool // writes a heartbeat unless a write is in progress; false if it could not
	dead  func()               // the peer has been silent for idle; called once

	heard atomic.Bool // a frame arrived since the last check
	wrote atomic.Bool // we wrote a frame since the last heartbeat

	mu        sync.Mutex
	stopped   bool
	timer     *time.Timer
	lastHeard time.Time // timer goroutine only (under mu)
	lastBeat  time.Time
	interval  time.Duration
}

// startLiveness starts watching; it returns nil when liveness is disabled.
func startLiveness(idle time.Duration, beat func(*liveness) bool, dead func()) *liveness {
	if idle <= 0 {
		return nil
	}
	hb := heartbeatFor(idle)
	now := time.Now()
	l := &liveness{idle: idle, every: max(hb/2, time.Millisecond), beat: beat, dead: dead,
		lastHeard: now, lastBeat: now, interval: hb}
	l.mu.Lock()
	l.timer = time.AfterFunc(l.every, l.check)
	l.mu.Unlock()
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
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
}

func (l *liveness) check() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	now := time.Now()
	if l.heard.Swap(false) {
		l.lastHeard = now
	}
	if now.Sub(l.lastHeard) >= l.idle {
		l.stopped = true
		l.mu.Unlock()
		l.dead()
		return
	}
	due := false
	if l.wrote.Swap(false) {
		l.lastBeat = now
	} else if now.Sub(l.lastBeat) >= l.interval-l.every/2 {
		due = true
	}
	// Rescheduled before writing: a write that blocks (a peer that stopped
	// reading) must not stop the silence check.
	l.timer.Reset(l.every)
	l.mu.Unlock()
	if due && l.beat(l) {
		l.mu.Lock()
		l.lastBeat = now
		l.mu.Unlock()
	}
}
