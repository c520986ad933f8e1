//go:build linux

package wake

import (
	"errors"
	"sync"
)

var (
	// ErrDuplicate is returned by EventQueue.Watch for a token already pending.
	ErrDuplicate = errors.New("wake: token already pending")
	// ErrNotPending is returned by EventQueue.Unwatch for a token that is not
	// pending: never registered, or already fired.
	ErrNotPending = errors.New("wake: token not pending")
)

// EventQueue is the readiness channel between a library and one foreign event
// loop: a TokenQueue of 64-bit tokens plus the registrations (watches) that push a
// token once when something happens. The loop, woken by Fd, drains the
// tokens and looks up what each one stands for.
//
// It guarantees, besides those of TokenQueue:
//
//   - Once: a watch pushes its token at most once, and never after Unwatch
//     or Close returned for it.
//   - Identity: a late callback of an earlier registration of the same token
//     never fires or removes a later registration.
//   - No lock held while calling register or a stop function, so they may
//     fire synchronously or take their own locks.
type EventQueue struct {
	q       *TokenQueue
	mu      sync.Mutex
	closed  bool
	pending map[uint64]*watch
}

// watch is one registration, compared by identity.
type watch struct {
	stop func() bool // unregisters the callback; nil while being registered
}

// NewEventQueue creates an empty EventQueue with its own pipe.
func NewEventQueue() (*EventQueue, error) {
	q, err := NewTokenQueue()
	if err != nil {
		return nil, err
	}
	return &EventQueue{q: q, pending: map[uint64]*watch{}}, nil
}

// Fd is the descriptor that carries the tokens (see TokenQueue).
func (e *EventQueue) Fd() int { return e.q.Fd() }

// DrainAfter is the rule for a reader of Fd (see TokenQueue.DrainAfter).
func (e *EventQueue) DrainAfter() int { return e.q.DrainAfter() }

// Push queues tok directly (no watch involved); ErrClosed after Close.
func (e *EventQueue) Push(tok uint64) error { return e.q.Push(tok) }

// Capture opens a capture of the queue's tokens (see TokenQueue.Capture).
func (e *EventQueue) Capture() (end func() []uint64) { return e.q.Capture() }

// Drain moves up to len(dst) tokens, oldest first, into dst (see TokenQueue.Drain).
func (e *EventQueue) Drain(dst []uint64) (n int, more bool) { return e.q.Drain(dst) }

// Watch registers tok: register is called once, without locks held, with a
// fire function to call when the event happens (possibly before register
// returns), and returns a function that unregisters fire. Errors:
// ErrDuplicate if tok is already pending, ErrClosed after Close.
func (e *EventQueue) Watch(tok uint64, register func(fire func()) (stop func() bool)) error {
	w := &watch{}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	if _, dup := e.pending[tok]; dup {
		e.mu.Unlock()
		return ErrDuplicate
	}
	e.pending[tok] = w // reserved: fire and Unwatch may run before register returns
	e.mu.Unlock()

	stop := register(func() { e.fire(tok, w) })

	e.mu.Lock()
	still := e.pending[tok] == w
	if still {
		w.stop = stop
	}
	e.mu.Unlock()
	if !still {
		stop() // fired, unwatched or closed while registering
	}
	return nil
}

// fire delivers w's token if w is still the pending registration.
func (e *EventQueue) fire(tok uint64, w *watch) {
	e.mu.Lock()
	ok := e.pending[tok] == w
	if ok {
		delete(e.pending, tok)
	}
	e.mu.Unlock()
	if ok {
		_ = e.q.Push(tok) // only fails once closed, when nobody waits any more
	}
}

// Unwatch cancels the pending watch of tok; ErrNotPending if there is none
// (never registered, or already fired: then its token is, or was, queued).
func (e *EventQueue) Unwatch(tok uint64) error {
	e.mu.Lock()
	w, ok := e.pending[tok]
	delete(e.pending, tok)
	e.mu.Unlock()
	if !ok {
		return ErrNotPending
	}
	if w.stop != nil {
		w.stop()
	}
	return nil
}

// Close unregisters every pending watch and closes the queue. Idempotent.
func (e *EventQueue) Close() {
	e.mu.Lock()
	e.closed = true
	stops := make([]func() bool, 0, len(e.pending))
	for _, w := range e.pending {
		if w.stop != nil {
			stops = append(stops, w.stop)
		}
	}
	e.pending = nil
	e.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	_ = e.q.Close()
}
