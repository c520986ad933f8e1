package ctxtree

// The adapter between a Context and the standard context.Context: Std,
// FromStd and FollowStd.

import (
	"context"
	"errors"
	"time"
)

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
