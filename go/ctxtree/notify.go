package ctxtree

// What a transition signals: the channels closed and the Notify functions
// run when a context reaches a state, and the process's count of kills
// (CountKills).

import "sync/atomic"

type hook struct {
	target State
	f      func()      // Notify's; nil for NotifyHeld's
	held   func(*Held) // NotifyHeld's: gets the cancel's Held (nil unless CancelHolding)
}

func (k hook) run(h *Held) {
	if k.held != nil {
		k.held(h)
		return
	}
	k.f()
}

// Held is the goroutine wake-ups a CancelHolding held back: the channel
// closes of the contexts it moved and what their NotifyHeld functions passed
// to Wake. Its zero value is empty and ready; it is not safe for concurrent
// use (one canceller fills it, then runs it).
type Held struct{ fs []func() }

// Wake runs f now on a nil h (the cancel holds nothing), else keeps it for
// Run. f must not block: it closes a channel, starts a goroutine, pokes one.
func (h *Held) Wake(f func()) {
	if h == nil {
		f()
		return
	}
	if h.fs == nil {
		h.fs = make([]func(), 0, 4) // a kill of an in-process request holds a few
	}
	h.fs = append(h.fs, f)
}

// Len is the number of wake-ups h holds.
func (h *Held) Len() int { return len(h.fs) }

// Run runs the held wake-ups in the order they were held, and empties h.
func (h *Held) Run() {
	fs := h.fs
	h.fs = nil
	for _, f := range fs {
		f()
	}
}

// killCount, when set (CountKills), counts transitions of any context to Killed.
var killCount atomic.Pointer[atomic.Uint64]

// CountKills makes every later transition of any context to Killed add one to
// *n, after that context's state word shows Killed. So a reader that finds n
// unchanged since it last found a context not killed may take it as still not
// killed without reading it again. (The library keeps n where C code reads it
// without calling into Go.) nil stops the counting.
func CountKills(n *atomic.Uint64) { killCount.Store(n) }

// afterUnlock is what one node's transition leaves to do outside its lock: the
// Notify functions, then the channels to close. Closing a channel a
// goroutine waits on wakes a thread, which costs the cancelling thread tens
// of microseconds when the CPUs are idle; the hooks (which signal event
// loops, write Kill frames) do not wait for that.
type afterUnlock struct {
	hooks      []hook
	chans      [2]chan struct{}
	stopClosed *atomic.Bool // chans[0] is closed by whoever sets it first
}

// runHooks runs one node's Notify functions, then closes its channels, or
// hands the closes to h (see CancelHolding).
func runHooks(f afterUnlock, h *Held) {
	for _, k := range f.hooks {
		k.run(h)
	}
	if f.chans[0] == nil && f.chans[1] == nil {
		return
	}
	if h == nil {
		f.closeChans() // no closure to allocate on the common path
		return
	}
	h.Wake(f.closeChans)
}

func (f afterUnlock) closeChans() {
	if f.chans[0] != nil && f.stopClosed.CompareAndSwap(false, true) {
		close(f.chans[0])
	}
	if f.chans[1] != nil {
		close(f.chans[1])
	}
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
	return c.notify(hook{target: target, f: f})
}

// NotifyHeld is Notify for a function that wakes goroutines: f gets the
// Held of the cancel that runs it (nil for Cancel, and when c is already at
// target) and passes its wake-ups to Held.Wake, so that a CancelHolding can
// hold them; what else f does happens at once. A context f cancels in turn
// is cancelled with CancelHolding and the same Held.
func (c *Context) NotifyHeld(target State, f func(*Held)) (stop func() bool) {
	return c.notify(hook{target: target, held: f})
}

func (c *Context) notify(k hook) (stop func() bool) {
	target := k.target
	c.mu.Lock()
	if st, _ := Unpack(c.word.Load()); st >= target {
		c.mu.Unlock()
		k.run(nil)
		return func() bool { return false }
	}
	if c.hooks == nil {
		c.hooks = make(map[uint64]hook)
	}
	c.nextHook++
	key := c.nextHook
	c.hooks[key] = k
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
