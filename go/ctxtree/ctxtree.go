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
//   - Held wake-ups (CancelHolding, Held): a canceller that must reach
//     something outside Go first (an event loop's waiter, which runs only
//     after the cancelling call returns) may hold back the goroutine wake-ups
//     of its cancellation: the channel closes and what NotifyHeld functions
//     hand to Held.Wake. Everything else (state words, Notify functions,
//     propagation) happens before CancelHolding returns, as for Cancel; the
//     held part runs when the canceller calls Held.Run, in order. Until then
//     a channel taken before the cancel is still open while the word (and
//     Std's Err) says cancelled, and a Cancel that finds a context already
//     moved by it returns without closing anything: a goroutine that waits on
//     such a channel waits for the Run.
//
// A context's state word (state, reason and cause: see StateMask) can live in
// memory supplied by the caller (WithStateWord), for readers outside Go that
// poll it with an atomic load; Go only ever writes it atomically.
package ctxtree

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

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
	trace      atomic.Pointer[traceSlot]
}

// traceSlot holds what SetTrace attached.
type traceSlot struct{ v any }

// SetTrace attaches v to c: the trace span the context's work runs under
// (go/tracing keeps it here, so that it travels wherever the context
// does: to the attempts made under it, to the handler's engine call). Only
// set while tracing is on: a context without one costs a nil pointer.
func (c *Context) SetTrace(v any) { c.trace.Store(&traceSlot{v}) }

// Trace returns what SetTrace attached, nil if nothing.
func (c *Context) Trace() any {
	if s := c.trace.Load(); s != nil {
		return s.v
	}
	return nil
}

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

// load reads the state word. A word given by WithStateWord may be reused
// once c is unreachable, so c stays alive until the load is done, even in a
// caller that holds it last.
func (c *Context) load() uint32 {
	w := c.word.Load()
	runtime.KeepAlive(c)
	return w
}

// State returns the current state and reason (one atomic load).
func (c *Context) State() (State, Reason) { return Unpack(c.load()) }

// IsStopped reports whether the context is Stopped or Killed.
func (c *Context) IsStopped() bool { return stateOf(c.load()) >= Stopped }

// IsKilled reports whether the context is Killed.
func (c *Context) IsKilled() bool { return stateOf(c.load()) == Killed }

// Reason returns why the context was cancelled, ReasonNone while it is live.
func (c *Context) Reason() Reason { _, r := c.State(); return r }

// Cause returns the reason the cancellation had where it started: c's own
// reason if it was cancelled directly, else the reason of the ancestor whose
// cancellation reached it (ReasonNone while live). A context cancelled over
// a connection is cancelled directly, with the cause the caller sent.
func (c *Context) Cause() Reason { return causeOf(c.load()) }

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

// Cancel moves c to target (Stopped or Killed) with the given reason, and every
// context linked below it with ReasonParent. It reports whether c itself
// changed state: false when c was already at or past target, or target is not
// Stopped or Killed. When Cancel returns, the whole tree below c has been
// moved and every channel and Notify function of the moved contexts has run.
func (c *Context) Cancel(target State, reason Reason) bool {
	return c.CancelHolding(target, reason, nil)
}

// CancelHolding is Cancel that holds the goroutine wake-ups of the
// cancellation in h (see Held) instead of running them: when it returns,
// every moved context's state word and Notify functions are done, and its
// channels close, with what NotifyHeld functions passed to h.Wake, when the
// caller runs h. A nil h is Cancel.
func (c *Context) CancelHolding(target State, reason Reason, h *Held) bool {
	if target != Stopped && target != Killed {
		return false
	}
	return c.cancel(target, reason, reason, h)
}

// cancel is CancelHolding with the origin's reason (cause) carried down the tree.
func (c *Context) cancel(target State, reason, cause Reason, h *Held) bool {
	if target != Stopped && target != Killed {
		return false
	}
	kids, fired, ok := c.transition(target, reason, cause)
	if !ok {
		return false
	}
	runHooks(fired, h)
	// Depth-first over an explicit stack: deep chains need no deep goroutine stack.
	stack := kids
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		more, fired, ok := n.transition(target, ReasonParent, cause)
		if !ok {
			continue
		}
		runHooks(fired, h)
		stack = append(stack, more...)
	}
	return true
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
	// mu); the ones made before are closed by runHooks, before Cancel returns
	// (or held: CancelHolding).
	if c.stopCh != nil && (old < Stopped || target == Killed) {
		f.chans[0], f.stopClosed = c.stopCh, &c.stopClosed
	}
	if c.killCh != nil && target == Killed {
		f.chans[1] = c.killCh
	}
	// Sized once (a cancel is on a kill's path): keys on the stack for the
	// usual handful of hooks, f.hooks allocated at its length.
	var buf [8]uint64
	keys := buf[:0]
	for k, h := range c.hooks {
		if h.target <= target {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // in the order they were registered
	if len(keys) > 0 {
		f.hooks = make([]hook, 0, len(keys))
	}
	for _, k := range keys {
		f.hooks = append(f.hooks, c.hooks[k])
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
		child.cancel(pst, ReasonParent, causeOf(pw), nil)
	}
	if !inherit.IsZero() {
		child.SetDeadline(inherit)
	}
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

// StateWord returns the word that holds c's state and reason (see Pack). It
// is the one given to WithStateWord, or c's own. Only read it.
func (c *Context) StateWord() *atomic.Uint32 { return c.word }
