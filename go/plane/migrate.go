package plane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// Migration retries a token stream on another worker when the first one
// breaks. The rules (docs/design.md, section 5), each enforced here:
//
//   - Limit: at most limit retries after the first attempt (0: none).
//   - Retried: every failure that is not the caller's: the request reached
//     no worker (ErrNoResponders), was not acknowledged in time
//     (ErrNotAcknowledged: a stopped worker, or a dead one whose
//     subscription the server had not dropped yet), or the worker's stream
//     broke before its final marker (ErrIncomplete: a crashed worker, a lost
//     connection, a worker silent past the stream idle timeout).
//   - Busy: an attempt that every worker refused as busy (load.go) spends
//     no attempt: the first one ends the request with ErrBusy (it reached
//     no worker: the caller queues it for a place), a later one waits its
//     backoff and tries again until a place is free or the request ends.
//   - Never retried: a cancelled request (once the request's context is
//     stopped or killed no attempt starts), a handler error, a worker that
//     stopped the request on purpose (transport.ErrStoppedByHandler), a request
//     the worker refused as malformed, or a runtime shutting down.
//   - Where: a retry avoids every instance that already failed this request,
//     and the client avoids an instance that failed any request for a few
//     seconds (Client.suspect), as long as another instance is known. A
//     Direct request's retries may go to any instance.
//   - When: retry n waits a jittered backoff (backoff: 25 ms doubling, at
//     most 1 s, half of it random), cut short by a stop or kill.
//   - Identity and cancellation: every attempt carries the request's Key
//     (made once, here) and its context is a new child of
//     the request's context with the same id, linked before it is sent, so a
//     stop or kill that lands during or between attempts reaches the current
//     attempt's worker.
//   - Continuity: the runtime's Continuation hook (Options.Continuation)
//     sees every item passed to the caller and rewrites the request for the
//     next worker, so that it continues where the last stopped; the caller
//     sees one stream, nothing lost or repeated (items of a broken attempt
//     that arrived are passed on once, nothing is replayed). The plane knows
//     no schema: the library installs the token schema's (go/tokens:
//     "token_ids" extended by the tokens received, "max_tokens" reduced by
//     their number). Without a hook the request is sent again unchanged.
//     A hook that is a Completer ends, as finished, a request whose last
//     item arrived before its stream broke (go/tokens: a finish reason, or
//     all of "max_tokens").

// GenerateMigrating is Generate with migration: up to limit retries. The
// returned stream's context is the request's context (a child of parent, or
// a root with a fresh id); each attempt runs under a child of it.
func (c *Client) GenerateMigrating(payload []byte, parent *ctxtree.Context, route Route, instance uint64, limit int, opts ...GenerateOption) (*Stream, error) {
	o, err := applyGenerateOptions(opts)
	if err != nil {
		if o.reservation != nil {
			o.reservation.Release()
		}
		return nil, err
	}
	reqCtx, err := c.requestContext(payload, parent)
	if err != nil {
		if o.reservation != nil {
			o.reservation.Release()
		}
		return nil, err
	}
	slog.Debug("migration_limit read", "request_id", reqCtx.ID(), "endpoint", c.path, "migration_limit", limit)
	out := &Stream{ctx: reqCtx, key: NewKey(), parent: parent, wake: make(chan struct{}, 1), rt: c.rt}
	out.stopHooks = append(out.stopHooks, reqCtx.NotifyHeld(ctxtree.Killed, func(h *ctxtree.Held) { h.Wake(out.poke) }))
	c.rt.trackStream(out)
	go out.migrate(c, payload, route, instance, limit, o)
	return out, nil
}

// retryable reports whether an attempt that ended with err may be retried.
func retryable(err error) bool {
	if errors.Is(err, transport.ErrStoppedByHandler) || errors.Is(err, ErrBusy) {
		return false // ErrBusy: no attempt failed (migrate waits for a place)
	}
	return errors.Is(err, ErrNoResponders) || errors.Is(err, ErrIncomplete) || errors.Is(err, ErrNotAcknowledged)
}

// instanceFault reports whether err says the instance is unhealthy (as
// opposed to the request or the caller).
func instanceFault(err error) bool {
	return retryable(err) && !errors.Is(err, ErrNoInstances)
}

// backoff waits before retry n (n >= 1): 25 ms doubling up to 1 s, the
// upper half random. It returns false if the request was stopped or killed
// meanwhile.
func (s *Stream) backoff(n int) bool {
	d := min(25*time.Millisecond<<min(n-1, 6), time.Second)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Stopped():
		return false
	}
}

func (s *Stream) migrate(c *Client, payload []byte, route Route, instance uint64, limit int, o generateOptions) {
	var cont Continuation // what carries the request to the next attempt (nil: resent unchanged)
	if c.rt != nil && c.rt.opts.Continuation != nil {
		cont = c.rt.opts.Continuation()
	}
	passed := 0                  // items passed to the caller so far
	exclude := map[uint64]bool{} // instances that failed this request
	waits := 0                   // retries so far, busy ones included (backoff)
	for attempt := 0; ; attempt++ {
		if (attempt > 0 || waits > 0) && (s.ctx.IsStopped() || !s.backoff(waits)) {
			// Cancelled: no new attempt starts. (The first one always goes
			// out, so that a handler sees a request stopped before it was
			// sent, as without migration.)
			s.end(io.EOF)
			return
		}
		p := payload
		if passed > 0 && cont != nil {
			var err error
			if p, err = cont.Next(payload); err != nil {
				s.end(err)
				return
			}
		}
		o.attempt = attempt
		inner, err := c.generateOnce(p, s.ctx, route, instance, exclude, s, o)
		o.reservation = nil // the first attempt's place only
		if err != nil {
			s.end(err)
			return
		}
		s.attempt.Store(inner)
		if err = inner.waitStarted(); err == nil {
			s.markStarted()
			err = s.relay(inner, cont, &passed)
		}
		inner.Kill() // no-op if it ended; releases it otherwise
		switch {
		case err == io.EOF:
			s.end(io.EOF)
			return
		case s.ctx.IsStopped():
			s.end(io.EOF)
			return
		case expired(s.ctx):
			// A deadline is not a fault: never retried, and no attempt
			// starts past it.
			s.ctx.Cancel(ctxtree.Killed, ctxtree.ReasonDeadline)
			s.end(io.EOF)
			return
		case errors.Is(err, ErrBusy) && attempt > 0:
			// Every worker was busy for a request that a worker broke: it
			// waits for a place, without spending an attempt (the first
			// attempt's ErrBusy goes to the caller, who queues it).
			s.attempt.Store(nil)
			waits++
			attempt--
			continue
		case errors.Is(err, ErrBusy):
			s.end(err)
			return
		case retryable(err) && complete(cont, payload):
			// Its last item arrived: nothing is left to generate, and a
			// retry would ask a worker for none.
			slog.Debug("request complete before its stream broke: not migrated", "request_id", s.ctx.ID(),
				"items_so_far", passed, "failed_instance", inner.instance, "error", err.Error())
			s.end(io.EOF)
			return
		case attempt < limit && retryable(err):
			waits++
			s.attempt.Store(nil) // a kill from now on stops the request before the next worker
			if inner.instance != 0 {
				exclude[inner.instance] = true
			}
			s.traceMigration(attempt, inner.instance, err)
			if route == Direct {
				route = RoundRobin // the instance it was sent to just failed
			}
			slog.Debug("migrating request", "request_id", s.ctx.ID(), "attempt", attempt+1,
				"migration_limit", limit, "items_so_far", passed,
				"failed_instance", inner.instance, "error", err.Error())
			continue
		default:
			s.end(err)
			return
		}
	}
}

// relay passes one attempt's items to the caller, showing each to cont.
func (s *Stream) relay(inner *Stream, cont Continuation, passed *int) error {
	for {
		item, err := inner.Next(context.Background())
		if err != nil {
			return err
		}
		if cont != nil {
			cont.Observe(item)
		}
		*passed++
		s.push(item)
	}
}

// complete reports whether cont says the request is complete (Completer).
func complete(cont Continuation, payload []byte) bool {
	c, ok := cont.(Completer)
	return ok && c.Complete(payload)
}

// expired reports whether ctx has a deadline that has passed.
func expired(ctx *ctxtree.Context) bool {
	left, ok := ctx.Remaining()
	return ok && left <= 0
}
