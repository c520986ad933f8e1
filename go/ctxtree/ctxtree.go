// Package ctxtree implements the per-request cancellation context of dynamo-ctx:
// a tree (in fact a graph) of contexts, each in one of three states, that
// propagates a stop or a kill from a parent to its children.
//
// States are monotonic: Live -> Stopped -> Killed, and Live -> Killed directly.
// No operation ever moves a context backwards: a StopGenerating after Kill
// changes nothing, and the reason of a context only changes together with its
// state.
//
// Stopped is graceful (the producer should stop producing; what it produced
// stays valid and the stream ends cleanly). Killed is a hard abort. A killed
// context is also stopped, so everything that waits for Stopped is released by
// a kill too.
//
// The guarantees of the tree, each implemented in exactly one place:
//
//   - Propagation (Cancel): moving a context to Stopped moves every linked child
//     to at least Stopped, moving it to Killed moves every linked child to
//     Killed, transitively, with reason ReasonParent. Propagation stops at nodes
//     already in the target state, so it terminates on cycles. It runs on the
//     calling goroutine, iteratively (a 10k-deep chain needs no deep stack), and
//     has finished when Cancel returns. No goroutine is started per link or per
//     context.
//   - Linking (LinkChild): linking a child to a parent that is already Stopped or
//     Killed applies that state to the child before LinkChild returns. A parent's
//     state change and its snapshot of children happen under the parent's lock,
//     and linking reads the parent's state and inserts the child under the same
//     lock, so a child is either in the snapshot or sees the new state: no child
//     linked concurrently with a cancel can miss it.
//   - Unlinking: Finish removes a context from all of its parents at once, and a
//     parent holds its children through weak pointers, so a child that nobody
//     else references is dropped by the garbage collector and pruned from the
//     parent. A long-lived parent does not grow with the requests it served.
//   - Deadlines (SetDeadline): a context with a deadline is killed with
//     ReasonDeadline when it passes, by one timer of its own (none per poll,
//     no goroutine until it fires); the timer stops when the context is
//     killed or finished. A deadline only moves earlier. A child takes its
//     parent's deadline when that is earlier than its own (when linked, and
//     when the parent's is set later), with a timer of its own, so it is
//     killed at that time even once its parent is finished.
//   - Notification: Stopped and Killed return channels closed on the transition;
//     Notify runs a function exactly once when the context reaches a state.
//     A context's Notify functions run in the order they were registered,
//     before its channels close, so what they signal (an event loop's fd, a
//     Kill frame) does not wait for the wake-up of the goroutines blocked on
//     those channels.
//
// A context's state word (state, reason and cause: see StateMask) can live in
// memory supplied by the caller (WithStateWord), for readers outside Go that
// poll it with an atomic load; Go only ever writes it atomically.
package ctxtree

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
)

// State is the cancellation state of a Context. The numeric values are part of
// the C ABI: they are what the state word holds.
type State uint32

const (
	Live    State = 0 // not cancelled
	Stopped State = 1 // stop_generating: finish cleanly, produce no more
	Killed  State = 2 // kill: abort now, do not drain
)

func (s State) String() string {
	switch s {
	case Live:
		return "live"
	case Stopped:
		return "stopped"
	case Killed:
		return "killed"
	}
	return "invalid"
}

// Reason says why a context was cancelled. The numeric values are part of the
// C ABI.
type Reason uint32

const (
	ReasonNone               Reason = 0 // still live
	ReasonStopGenerating     Reason = 1
	ReasonKill               Reason = 2
	ReasonClientDisconnected Reason = 3
	ReasonParent             Reason = 4 // propagated from a parent
	ReasonDeadline           Reason = 5
	ReasonConnectionLost     Reason = 6
	ReasonShutdown           Reason = 7

	// NumReasons is the number of reason codes, ReasonNone included: every
	// reason is below it (the header's DC_REASON_COUNT).
	NumReasons = 8
)

var reasonNames = [NumReasons]string{
	"", "stop_generating", "kill", "client_disconnected", "parent",
	"deadline", "connection_lost", "shutdown",
}

// String returns the reason's name as the Python API spells it ("" for ReasonNone).
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "invalid"
}

// Valid reports whether r is one of the defined reasons other than ReasonNone.
func (r Reason) Valid() bool { return r > ReasonNone && r < NumReasons }

// ReasonFromString is the inverse of Reason.String for the defined reasons.
func ReasonFromString(s string) (Reason, bool) {
	for i := Reason(1); i < NumReasons; i++ {
		if reasonNames[i] == s {
			return i, true
		}
	}
	return ReasonNone, false
}

// The state word's layout (part of the C ABI: the header's DC_STATE_MASK,
// DC_REASON_SHIFT, DC_CAUSE_SHIFT and DC_FIELD_MASK are checked equal to
// these at compile time): the state in bits 0-7, the reason in bits 8-15,
// the cause in bits 16-23, zero above.
const (
	StateMask   = 0xff // w & StateMask is the state
	ReasonShift = 8    // w >> ReasonShift & FieldMask is the reason
	CauseShift  = 16   // w >> CauseShift & FieldMask is the cause
	FieldMask   = 0xff // each field is 8 bits
)

// Pack builds a state word; Unpack splits one.
func Pack(s State, r Reason) uint32 { return packCause(s, r, r) }

// packCause adds the cause: the reason at the origin of the cancellation,
// which a propagated context's own reason (ReasonParent) hides.
func packCause(s State, r, cause Reason) uint32 {
	return uint32(s) | uint32(r)<<ReasonShift | uint32(cause)<<CauseShift
}

// stateOf and causeOf read one field of a state word.
func stateOf(w uint32) State  { return State(w & StateMask) }
func causeOf(w uint32) Reason { return Reason(w >> CauseShift & FieldMask) }

// Cause returns the reason the cancellation had where it started: c's own
// reason if it was cancelled directly, else the reason of the ancestor whose
// cancellation reached it (ReasonNone while live). A context cancelled over
// a connection is cancelled directly, with the cause the caller sent.
func (c *Context) Cause() Reason { return causeOf(c.word.Load()) }

// Unpack splits a state word into its state and reason.
func Unpack(w uint32) (State, Reason) { return stateOf(w), Reason(w >> ReasonShift & FieldMask) }

var seqCounter atomic.Uint64

// Context is one node of the cancellation tree. The zero value is not usable;
// create contexts with New. All methods are safe for concurrent use.
type Context struct {
	id   string
	seq  uint64         // global creation order: the lock order when two contexts are locked together
	word *atomic.Uint32 // state word: own, or caller-supplied memory
	own  atomic.Uint32

	mu       sync.Mutex
	children map[weak.Pointer[Context]]struct{}
	pruneAt  int
	parents  []*Context
	finished bool
	stopCh   chan struct{}
	killCh   chan struct{}
	// stopClosed: stopCh was closed. A kill that finds c Stopped closes it
	// too, if the stop's own canceller has not yet (it may still be running
	// hooks): Killed's channel never closes before Stopped's.
	stopClosed atomic.Bool
	hooks      map[uint64]hook
	nextHook   uint64
	dl         *deadline // nil: no deadline (most contexts): 8 bytes, not 32
}

// deadline is a context's deadline and the timer that kills it then.
type deadline struct {
	at    time.Time
	timer *time.Timer
}

// MaxTimeout bounds a timeout (a deadline that far or farther is refused by
// the callers that take one: the C ABI, the HTTP frontend).
const MaxTimeout = 365 * 24 * time.Hour

type hook struct {
	target State
	f      func()
}

// killCount, when set (CountKills), counts transitions of any context to Killed.
var killCount atomic.Pointer[atomic.Uint64]

// CountKills makes every later transition of any context to Killed add one to
// *n, after that context's state word shows Killed. So a reader that finds n
// unchanged since it last found a context not killed may take it as still not
// killed without reading it again. (The library keeps n where C code reads it
// without calling into Go.) nil stops the counting.
func CountKills(n *atomic.Uint64) { killCount.Store(n) }

// Option configures New.
type Option func(*Context)

// WithStateWord makes the context keep its state word at w instead of inside
// the Context. w must be zero, must stay valid for as long as the Context is
// reachable, and must only be read (atomically) by others.
func WithStateWord(w *atomic.Uint32) Option { return func(c *Context) { c.word = w } }

// New returns a live context with the given id and no parent.
func New(id string, opts ...Option) *Context {
	c := &Context{id: id, seq: seqCounter.Add(1)}
	c.word = &c.own
	for _, o := range opts {
		o(c)
	}
	return c
}

// ID returns the request id the context was created with.
func (c *Context) ID() string { return c.id }

// State returns the current state and reason (one atomic load).
func (c *Context) State() (State, Reason) { return Unpack(c.word.Load()) }

// IsStopped reports whether the context is Stopped or Killed.
func (c *Context) IsStopped() bool { return stateOf(c.word.Load()) >= Stopped }

// IsKilled reports whether the context is Killed.
func (c *Context) IsKilled() bool { return stateOf(c.word.Load()) == Killed }

// Reason returns why the context was cancelled, ReasonNone while it is live.
func (c *Context) Reason() Reason { _, r := c.State(); return r }

// StopGenerating moves the context to Stopped with ReasonStopGenerating.
func (c *Context) StopGenerating() { c.Cancel(Stopped, ReasonStopGenerating) }

// Kill moves the context to Killed with ReasonKill.
func (c *Context) Kill() { c.Cancel(Killed, ReasonKill) }

// Child returns a new live context with the same id, linked as a child of c
// (so it is already cancelled if c is).
func (c *Context) Child(opts ...Option) *Context {
	ch := New(c.id, opts...)
	c.LinkChild(ch)
	return ch
}

// Next is the one transition rule of a state word: the word a context whose
// word is w has after a cancel to target with reason and cause, and whether
// the cancel changes it. States only move forward, and the reason and cause
// change only with the state: a cancel to a state w is already at or past
// changes nothing. target is Stopped or Killed (Cancel's callers check it).
// It is pure: transition applies it to a context under its lock, and the C
// ABI's dc_state_word_next to a word with no context behind it yet (a
// Python Context before its Go side is made).
func Next(w uint32, target State, reason, cause Reason) (uint32, bool) {
	if old, _ := Unpack(w); old >= target {
		return w, false
	}
	return packCause(target, reason, cause), true
}

// Cancel moves c to target (Stopped or Killed) with the given reason, and every
// context linked below it with ReasonParent. It reports whether c itself
// changed state: false when c was already at or past target, or target is not
// Stopped or Killed. When Cancel returns, the whole tree below c has been
// moved and every channel and Notify function of the moved contexts has run.
func (c *Context) Cancel(target State, reason Reason) bool {
	if target != Stopped && target != Killed {
		return false
	}
	return c.cancel(target, reason, reason)
}

// cancel is Cancel with the origin's reason (cause) carried down the tree.
func (c *Context) cancel(target State, reason, cause Reason) bool {
	if target != Stopped && target != Killed {
		return false
	}
	kids, fired, ok := c.transition(target, reason, cause)
	if !ok {
		return false
	}
	runHooks(fired)
	// Depth-first over an explicit stack: deep chains need no deep goroutine stack.
	stack := kids
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		more, fired, ok := n.transition(target, ReasonParent, cause)
		if !ok {
			continue
		}
		runHooks(fired)
		stack = append(stack, more...)
	}
	return true
}

// afterUnlock is what one node's transition leaves to do outside its lock: the
// Notify functions, then the channels to close. Closing a channel a
// goroutine waits on wakes a thread, which costs the cancelling thread tens
// of microseconds when the CPUs are idle; the hooks (which signal event
// loops, write Kill frames) do not wait for that.
type afterUnlock struct {
	hooks      []func()
	chans      [2]chan struct{}
	stopClosed *atomic.Bool // chans[0] is closed by whoever sets it first
}

// transition moves one node under its lock and returns what the caller must
// do outside the lock: the children to visit and the hooks to run.
func (c *Context) transition(target State, reason, cause Reason) ([]*Context, afterUnlock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var f afterUnlock
	w := c.word.Load()
	next, ok := Next(w, target, reason, cause)
	if !ok {
		return nil, f, false
	}
	old, _ := Unpack(w)
	c.word.Store(next)
	if target == Killed {
		if n := killCount.Load(); n != nil {
			n.Add(1)
		}
	}
	// A channel made from now on is closedCh (stateCh reads the word under
	// mu); the ones made before are closed by runHooks, before Cancel returns.
	if c.stopCh != nil && (old < Stopped || target == Killed) {
		f.chans[0], f.stopClosed = c.stopCh, &c.stopClosed
	}
	if c.killCh != nil && target == Killed {
		f.chans[1] = c.killCh
	}
	var keys []uint64
	for k, h := range c.hooks {
		if h.target <= target {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // in the order they were registered
	for _, k := range keys {
		f.hooks = append(f.hooks, c.hooks[k].f)
		delete(c.hooks, k)
	}
	kids := make([]*Context, 0, len(c.children))
	for wp := range c.children {
		if k := wp.Value(); k != nil {
			kids = append(kids, k)
		}
	}
	if target == Killed {
		// Nothing can happen to a killed context any more: its children need
		// not be remembered, nor its deadline's timer run.
		c.children = nil
		c.stopTimerLocked()
	}
	return kids, f, true
}

func runHooks(f afterUnlock) {
	for _, h := range f.hooks {
		h()
	}
	if f.chans[0] != nil && f.stopClosed.CompareAndSwap(false, true) {
		close(f.chans[0])
	}
	if f.chans[1] != nil {
		close(f.chans[1])
	}
}

// LinkChild makes child follow c: stopping c stops child, killing c kills
// child. If c is already Stopped or Killed, child is moved to that state
// before LinkChild returns. Linking a context to itself or building a cycle is
// allowed; propagation terminates. Linking a finished child does nothing but
// apply c's current state. Linking the same pair twice is the same as once.
func (c *Context) LinkChild(child *Context) {
	if child == nil {
		return
	}
	if child == c {
		return // a self-link can never change anything
	}
	first, second := c, child
	if second.seq < first.seq {
		first, second = second, first
	}
	first.mu.Lock()
	second.mu.Lock()
	pw := c.word.Load()
	pst, _ := Unpack(pw)
	var inherit time.Time
	if c.dl != nil && pst < Killed && (child.dl == nil || c.dl.at.Before(child.dl.at)) {
		inherit = c.dl.at
	}
	if pst < Killed && !child.finished {
		wp := weak.Make(child)
		if _, dup := c.children[wp]; !dup {
			if c.children == nil {
				c.children = make(map[weak.Pointer[Context]]struct{})
			}
			c.children[wp] = struct{}{}
			child.parents = append(child.parents, c)
			c.maybePruneLocked()
		}
	}
	second.mu.Unlock()
	first.mu.Unlock()
	if pst > Live {
		child.cancel(pst, ReasonParent, causeOf(pw))
	}
	if !inherit.IsZero() {
		child.SetDeadline(inherit)
	}
}

// SetDeadline kills c with ReasonDeadline at d (see the package comment):
// it arms c's one timer, or kills c before it returns if d has passed. A
// deadline later than c's own, or one given to a killed or finished
// context, changes nothing. The children linked below c take d when it is
// earlier than theirs, before SetDeadline returns.
func (c *Context) SetDeadline(d time.Time) {
	stack := []*Context{c}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		kids, passed, ok := n.setDeadline(d)
		if !ok {
			continue
		}
		if passed {
			n.Cancel(Killed, ReasonDeadline) // reaches the children too
			continue
		}
		stack = append(stack, kids...)
	}
}

// setDeadline sets one context's deadline under its lock and returns its
// children to visit, whether d has passed, and whether anything changed.
func (c *Context) setDeadline(d time.Time) (kids []*Context, passed, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stateOf(c.word.Load()) == Killed || c.finished || (c.dl != nil && !d.Before(c.dl.at)) {
		return nil, false, false
	}
	wait := time.Until(d)
	if c.dl == nil {
		c.dl = &deadline{}
	}
	c.stopTimerLocked()
	c.dl.at = d
	if wait <= 0 {
		return nil, true, true
	}
	// The timer holds c weakly: a context nothing else holds (its handle
	// freed, its request over) is not kept alive until its deadline, and
	// neither is the timer (Go collects unreferenced timers).
	wp := weak.Make(c)
	c.dl.timer = time.AfterFunc(wait, func() {
		if c := wp.Value(); c != nil {
			killtrace.Mark("deadline.fired", c.id) // for the benchmarks: how late the timer ran
			c.Cancel(Killed, ReasonDeadline)
		}
	})
	for wp := range c.children {
		if k := wp.Value(); k != nil {
			kids = append(kids, k)
		}
	}
	return kids, false, true
}

// stopTimerLocked stops the deadline's timer, if any (c.mu held).
func (c *Context) stopTimerLocked() {
	if c.dl != nil && c.dl.timer != nil {
		c.dl.timer.Stop()
		c.dl.timer = nil
	}
}

// Deadline returns c's deadline, and whether it has one.
func (c *Context) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dl == nil {
		return time.Time{}, false
	}
	return c.dl.at, true
}

// Remaining returns the time left until c's deadline (0 once it has passed),
// and whether c has one.
func (c *Context) Remaining() (time.Duration, bool) {
	d, ok := c.Deadline()
	if !ok {
		return 0, false
	}
	return max(0, time.Until(d)), true
}

// TimeoutError checks a timeout given in seconds: a finite number, not
// negative, below MaxTimeout. The message names what is wrong.
func TimeoutError(seconds float64) error {
	switch {
	case seconds != seconds:
		return errors.New("timeout is not a number")
	case seconds < 0:
		return errors.New("timeout is negative")
	case seconds >= MaxTimeout.Seconds():
		return fmt.Errorf("timeout is too large (at most %d seconds)", int64(MaxTimeout.Seconds())-1)
	}
	return nil
}

// maybePruneLocked drops children the garbage collector has reclaimed, once
// the map has doubled since the last sweep (amortised O(1) per link).
func (c *Context) maybePruneLocked() {
	if len(c.children) < c.pruneAt || len(c.children) < 64 {
		return
	}
	for wp := range c.children {
		if wp.Value() == nil {
			delete(c.children, wp)
		}
	}
	c.pruneAt = 2 * len(c.children)
}

// Finish declares that the request of c is over: c is unlinked from all of its
// parents (so they stop holding it) and will not be linked again. c's own
// state and its children are unaffected: cancelling c still propagates.
func (c *Context) Finish() {
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return
	}
	c.finished = true
	parents := c.parents
	c.parents = nil
	c.stopTimerLocked()
	c.mu.Unlock()
	wp := weak.Make(c)
	for _, p := range parents {
		p.mu.Lock()
		delete(p.children, wp)
		p.mu.Unlock()
	}
}

// NumChildren returns how many linked children are still reachable, sweeping
// the collected ones. It is meant for tests and metrics.
func (c *Context) NumChildren() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for wp := range c.children {
		if wp.Value() == nil {
			delete(c.children, wp)
		}
	}
	return len(c.children)
}

var closedCh = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// Stopped returns a channel that is closed when c becomes Stopped or Killed.
func (c *Context) Stopped() <-chan struct{} { return c.stateCh(Stopped, &c.stopCh) }

// Killed returns a channel that is closed when c becomes Killed.
func (c *Context) Killed() <-chan struct{} { return c.stateCh(Killed, &c.killCh) }

// stateCh returns a channel that is closed once c has reached state at
// (States are ordered): closedCh if it has already, else *ch, made on first
// use and closed by transition. The check and the making happen under c.mu, as
// transition's close does, so no transition falls between them.
func (c *Context) stateCh(at State, ch *chan struct{}) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stateOf(c.word.Load()) >= at {
		return closedCh
	}
	if *ch == nil {
		*ch = make(chan struct{})
	}
	return *ch
}

// Notify arranges for f to run exactly once when c reaches target (Stopped
// also fires on Killed). f runs synchronously on the goroutine that cancels
// c, after c's lock is released, or in Notify itself if c is already there;
// it must not block. The returned stop function unregisters f and reports
// whether it did so before f ran.
func (c *Context) Notify(target State, f func()) (stop func() bool) {
	c.mu.Lock()
	if st, _ := Unpack(c.word.Load()); st >= target {
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	if c.hooks == nil {
		c.hooks = make(map[uint64]hook)
	}
	c.nextHook++
	key := c.nextHook
	c.hooks[key] = hook{target: target, f: f}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.hooks[key]; ok {
			delete(c.hooks, key)
			return true
		}
		return false
	}
}

type ctxKey struct{}

// Std returns a context.Context that is done when c is Stopped or Killed, for
// Go code that only knows the standard interface. It starts no goroutine.
// Err returns context.Canceled (context.DeadlineExceeded for ReasonDeadline).
// FromStd recovers c from it or from any context derived from it.
func (c *Context) Std() context.Context { return stdContext{c} }

type stdContext struct{ c *Context }

func (s stdContext) Deadline() (time.Time, bool) { return s.c.Deadline() }
func (s stdContext) Done() <-chan struct{}       { return s.c.Stopped() }
func (s stdContext) Err() error {
	st, r := s.c.State()
	switch {
	case st == Live:
		return nil
	case r == ReasonDeadline:
		return context.DeadlineExceeded
	default:
		return context.Canceled
	}
}
func (s stdContext) Value(key any) any {
	if key == (ctxKey{}) {
		return s.c
	}
	return nil
}

// FromStd returns the Context behind a context.Context made by Std, or nil.
func FromStd(ctx context.Context) *Context {
	c, _ := ctx.Value(ctxKey{}).(*Context)
	return c
}

// FollowStd kills c when std is done: with ReasonDeadline if std's deadline
// passed, ReasonParent otherwise. It uses context.AfterFunc, so no goroutine
// exists until std is done. The returned stop function detaches c from std.
func (c *Context) FollowStd(std context.Context) (stop func() bool) {
	return context.AfterFunc(std, func() {
		r := ReasonParent
		if errors.Is(context.Cause(std), context.DeadlineExceeded) {
			r = ReasonDeadline
		}
		c.Cancel(Killed, r)
	})
}

// StateWord returns the word that holds c's state and reason (see Pack). It
// is the one given to WithStateWord, or c's own. Only read it.
func (c *Context) StateWord() *atomic.Uint32 { return c.word }
