package frontend

// Resending: a worker request that never reached a worker (no instance
// took it: no responders; or none acknowledged it in time, a frozen
// worker's) is always safe to send to another instance, whatever the
// migration limit: no work started for it, and a frozen worker that wakes
// up later cannot start it (its caller no longer expects it: the stream's
// dial back is refused). The client avoids an instance that failed for a
// few seconds (plane.Client's suspects), so a resend goes elsewhere when
// another instance is known. A choice is resent at most maxResends times,
// only before its first item and while its context is live.

import (
	"context"
	"errors"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// maxResends bounds the resends of one choice.
const maxResends = 3

// stream is the choice's current worker request.
func (c *choice) stream() *plane.Stream { return c.st.Load() }

// next is the next item of the choice's worker request, resending it first
// when it never reached a worker.
func (c *choice) next(ctx context.Context) (workerItem, error) {
	for {
		it, err := next(ctx, c.stream())
		if err == nil {
			c.items++
			return it, nil
		}
		if c.items > 0 || c.resends >= maxResends || !neverReached(err) || c.reqCtx.IsStopped() || ctx.Err() != nil {
			return it, err
		}
		c.resends++
		select { // a moment for the instance lists to catch up
		case <-time.After(time.Duration(c.resends) * 10 * time.Millisecond):
		case <-ctx.Done():
			return it, err
		}
		s, gerr := c.resend()
		if gerr != nil {
			return it, err
		}
		c.st.Store(s)
	}
}

// neverReached reports whether a worker request's error says no worker
// received it.
func neverReached(err error) bool {
	return errors.Is(err, plane.ErrNoResponders) || errors.Is(err, plane.ErrNotAcknowledged)
}
