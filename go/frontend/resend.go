package frontend

// The start of a response: nothing is written until every choice's worker
// request has reached a worker (its acknowledgement, a round trip on the
// bus), so that a request no worker took can still be answered as such.
//
// Resending: a worker request that never reached a worker (no instance
// took it: no responders; or none acknowledged it in time, a frozen
// worker's) is always safe to send to another instance, whatever the
// migration limit: no work started for it, and a frozen worker that wakes
// up later cannot start it (its caller no longer expects it: the stream's
// dial back is refused). The client avoids an instance that failed for a
// few seconds (plane.Client's suspects), so a resend goes elsewhere when
// another instance is known. A choice is resent at most maxResends times,
// and only while its context is live.
//
// Busy: a worker request that every worker refused as busy (plane.ErrBusy:
// other frontends' requests took the places this frontend thought free)
// goes back to the model's queue, first in line, and is sent again into
// the next free place; when the queue is full the request is answered as
// any request is then, 503 overloaded with Retry-After (admission.go).

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

// next is the next item of the choice's worker request.
func (c *choice) next(ctx context.Context) (workerItem, error) { return next(ctx, c.stream()) }

// started waits until every choice's worker request reached a worker (or
// ended otherwise, which the response reports), resending and readmitting
// as the top of this file says. Its error is why a readmitted choice got no
// place (admit's): nothing was written, and the request is answered as
// answerNotAdmitted does.
func (p *response) started() error {
	for _, c := range p.choices {
		if err := c.start(p.ctx); err != nil {
			return err
		}
	}
	return nil
}

// start is started for one choice.
func (c *choice) start(ctx context.Context) error {
	for {
		err := c.stream().AwaitStart(ctx)
		if err == nil || ctx.Err() != nil || c.reqCtx.IsStopped() {
			return nil // the response reads how it went on
		}
		var place *plane.Reservation
		switch {
		case errors.Is(err, plane.ErrBusy):
			var aerr error
			if place, aerr = c.readmit(ctx); aerr != nil {
				c.refused = notAdmittedOutcome(aerr)
				return aerr
			}
		case neverReached(err) && c.resends < maxResends:
			c.resends++
			select { // a moment for the instance lists to catch up
			case <-time.After(time.Duration(c.resends) * 10 * time.Millisecond):
			case <-ctx.Done():
				return nil
			}
		default:
			return nil
		}
		s, gerr := c.send(place)
		if gerr != nil {
			return nil // the last stream's error stands
		}
		c.st.Store(s)
	}
}

// neverReached reports whether a worker request's error says no worker
// received it.
func neverReached(err error) bool {
	return errors.Is(err, plane.ErrNoResponders) || errors.Is(err, plane.ErrNotAcknowledged)
}
