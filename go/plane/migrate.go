package plane

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/stream"
)

// Migration retries a token stream on another worker when the first one
// breaks. The rules (SPEC section 4), each enforced here:
//
//   - Limit: at most limit retries after the first attempt (0: none).
//   - Retried: every failure that is not the caller's: the request reached
//     no worker (ErrNoResponders), was not acknowledged in time
//     (ErrNotAcknowledged: a stopped worker, or a dead one whose
//     subscription the server had not dropped yet), or the worker's stream
//     broke before its final marker (ErrIncomplete: a crashed worker, a lost
//     connection, a worker silent past the stream idle timeout).
//   - Never retried: a cancelled request (once the request's context is
//     stopped or killed no attempt starts), a handler error, a worker that
//     stopped the request on purpose (stream.ErrStoppedByHandler), a request
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
//   - Continuity: token ids received so far are appended to the request's
//     "token_ids" and its "max_tokens" (top level, or under
//     "stop_conditions") is reduced by their number, so the next worker
//     continues where the last stopped; the caller sees one stream, with no
//     token lost or repeated (items of a broken attempt that arrived are
//     passed on once, nothing is replayed).

// GenerateMigrating is Generate with migration: up to limit retries. The
// returned stream's context is the request's context (a child of parent, or
// a root with a fresh id); each attempt runs under a child of it.
func (c *Client) GenerateMigrating(payload []byte, parent *ctxtree.Context, route Route, instance uint64, limit int, opts ...GenerateOption) (*Stream, error) {
	o, err := applyGenerateOptions(opts)
	if err != nil {
		return nil, err
	}
	reqCtx, err := c.requestContext(payload, parent)
	if err != nil {
		return nil, err
	}
	slog.Debug("migration_limit read", "request_id", reqCtx.ID(), "endpoint", c.path, "migration_limit", limit)
	out := &Stream{ctx: reqCtx, key: NewKey(), parent: parent, wake: make(chan struct{}, 1), rt: c.rt}
	out.stopHooks = append(out.stopHooks, reqCtx.Notify(ctxtree.Killed, out.poke))
	c.rt.trackStream(out)
	go out.migrate(c, payload, route, instance, limit, o)
	return out, nil
}

// retryable reports whether an attempt that ended with err may be retried.
func retryable(err error) bool {
	if errors.Is(err, stream.ErrStoppedByHandler) {
		return false
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
	var received []json.RawMessage // token ids passed to the caller so far
	exclude := map[uint64]bool{}   // instances that failed this request
	for attempt := 0; ; attempt++ {
		if attempt > 0 && (s.ctx.IsStopped() || !s.backoff(attempt)) {
			// Cancelled: no new attempt starts. (The first one always goes
			// out, so that a handler sees a request stopped before it was
			// sent, as without migration.)
			s.end(io.EOF)
			return
		}
		p := payload
		if len(received) > 0 {
			var err error
			if p, err = continuation(payload, received); err != nil {
				s.end(err)
				return
			}
		}
		inner, err := c.generateOnce(p, s.ctx, route, instance, exclude, s, o)
		if err != nil {
			s.end(err)
			return
		}
		s.attempt.Store(inner)
		if err = inner.waitStarted(); err == nil {
			s.markStarted()
			err = s.relay(inner, &received)
		}
		inner.Kill() // no-op if it ended; releases it otherwise
		switch {
		case err == io.EOF:
			s.end(io.EOF)
			return
		case s.ctx.IsStopped():
			s.end(io.EOF)
			return
		case attempt < limit && retryable(err):
			s.attempt.Store(nil) // a kill from now on stops the request before the next worker
			if inner.instance != 0 {
				exclude[inner.instance] = true
			}
			if route == Direct {
				route = RoundRobin // the instance it was sent to just failed
			}
			slog.Debug("migrating request", "request_id", s.ctx.ID(), "attempt", attempt+1,
				"migration_limit", limit, "tokens_so_far", len(received),
				"failed_instance", inner.instance, "error", err.Error())
			continue
		default:
			s.end(err)
			return
		}
	}
}

// relay passes one attempt's items to the caller, recording their token ids.
func (s *Stream) relay(inner *Stream, received *[]json.RawMessage) error {
	for {
		item, err := inner.Next(context.Background())
		if err != nil {
			return err
		}
		var tok struct {
			TokenIDs []json.RawMessage `json:"token_ids"`
		}
		if json.Unmarshal(item, &tok) == nil {
			*received = append(*received, tok.TokenIDs...)
		}
		s.push(item)
	}
}

// continuation rewrites the request for the next worker: token_ids extended
// by the tokens received, max_tokens reduced by their number.
func continuation(payload []byte, received []json.RawMessage) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(payload, &req); err != nil || req == nil {
		return payload, nil // not a token request (or null): resend as is
	}
	var ids []json.RawMessage
	if raw, ok := req["token_ids"]; ok {
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, err
		}
	}
	ids = append(ids, received...)
	req["token_ids"] = mustJSON(ids)
	reduce := func(m map[string]json.RawMessage) {
		var n int64
		// null (no limit) stays null: Unmarshal of null leaves n at 0.
		if raw, ok := m["max_tokens"]; ok && string(raw) != "null" && json.Unmarshal(raw, &n) == nil {
			n -= int64(len(received))
			if n < 0 {
				n = 0
			}
			m["max_tokens"] = mustJSON(n)
		}
	}
	reduce(req)
	if raw, ok := req["stop_conditions"]; ok {
		var sc map[string]json.RawMessage
		if json.Unmarshal(raw, &sc) == nil {
			reduce(sc)
			req["stop_conditions"] = mustJSON(sc)
		}
	}
	return json.Marshal(req)
}
