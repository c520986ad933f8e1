package plane

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/stream"
)

// Migration retries a token stream on another worker when the first one
// breaks. The rules (SPEC section 4), each enforced here:
//
//   - Limit: at most limit retries after the first attempt (0: none).
//   - Retried: the request reached no worker (ErrNoResponders), or the
//     worker's stream broke before its final marker (ErrIncomplete from a
//     crashed worker or a lost connection).
//   - Never retried: a cancelled request (once the request's context is
//     stopped or killed no attempt starts), a handler error, or a worker that
//     stopped the request on purpose (stream.ErrStoppedByHandler).
//   - Identity and cancellation: every attempt's context is a new child of
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
func (c *Client) GenerateMigrating(payload []byte, parent *ctxtree.Context, route Route, instance uint64, limit int) (*Stream, error) {
	rc, err := c.requestContext(payload, parent)
	if err != nil {
		return nil, err
	}
	slog.Debug("migration_limit read", "request_id", rc.ID(), "endpoint", c.path, "migration_limit", limit)
	out := &Stream{ctx: rc, wake: make(chan struct{}, 1), rt: c.rt}
	out.stopHooks = append(out.stopHooks, rc.Notify(ctxtree.Killed, out.poke))
	c.rt.trackStream(out)
	go out.migrate(c, payload, route, instance, limit)
	return out, nil
}

// retryable reports whether an attempt that ended with err may be retried.
func retryable(err error) bool {
	if errors.Is(err, stream.ErrStoppedByHandler) {
		return false
	}
	return errors.Is(err, ErrNoResponders) || errors.Is(err, ErrIncomplete)
}

func (s *Stream) migrate(c *Client, payload []byte, route Route, instance uint64, limit int) {
	var received []json.RawMessage // token ids passed to the caller so far
	for attempt := 0; ; attempt++ {
		if attempt > 0 && s.ctx.IsStopped() {
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
		inner, err := c.generateOnce(p, s.ctx, route, instance)
		if err != nil {
			s.end(err)
			return
		}
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
			slog.Debug("migrating request", "request_id", s.ctx.ID(), "attempt", attempt+1,
				"migration_limit", limit, "tokens_so_far", len(received), "error", err.Error())
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
