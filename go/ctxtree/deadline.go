package ctxtree

// Deadlines: a context's deadline and the timer that kills it then, how
// children take their parent's, and the bound and check of a timeout.

import (
	"errors"
	"fmt"
	"time"
	"weak"

	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
)

// deadline is a context's deadline and the timer that kills it then.
type deadline struct {
	at    time.Time
	timer *time.Timer
}

// MaxTimeout bounds a timeout (a deadline that far or farther is refused by
// the callers that take one: the C ABI, the HTTP frontend).
const MaxTimeout = 365 * 24 * time.Hour

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
// negative, below MaxTimeout. The message names what is wrong. It is the one
// statement of a timeout's range: Timeout and TimeoutMicros check with it,
// and so does every caller that takes a timeout (the C ABI, the HTTP
// frontend's header and settings, a request envelope's time left).
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

// Timeout is a timeout given in seconds, checked by TimeoutError, as a
// duration.
func Timeout(seconds float64) (time.Duration, error) {
	if err := TimeoutError(seconds); err != nil {
		return 0, err
	}
	return time.Duration(seconds * float64(time.Second)), nil
}

// TimeoutMicros is a timeout given in whole microseconds (a request
// envelope's time left), checked by TimeoutError, as a duration. Every
// int64 is exact in float64 as far as the range reaches (2^53 microseconds
// is 285 years), so the check is TimeoutError's to the microsecond.
func TimeoutMicros(us int64) (time.Duration, error) {
	if err := TimeoutError(float64(us) / 1e6); err != nil {
		return 0, err
	}
	return time.Duration(us) * time.Microsecond, nil
}
