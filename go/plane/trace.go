package plane

// The plane's spans (go/tracing): one per attempt on the caller's side
// (CLIENT), one per request on the worker's (SERVER: from the request
// accepted to its end, its abort confirmed for a killed one). The envelope
// carries the attempt's trace context to the worker. Every function here is
// a nil check while tracing is off.

import (
	"errors"
	"io"
	"strconv"

	"go.opentelemetry.io/otel/attribute"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// startAttemptSpan starts the span of an attempt sent to instance, a child
// of the span of the request's context, and returns the trace context its
// envelope carries (nil, nil while tracing is off).
func (c *Client) startAttemptSpan(s *Stream, attempt int, instance uint64) *tracing.Remote {
	if !tracing.Enabled() {
		return nil
	}
	span := tracing.StartAttempt(s.ctx, "", "",
		attribute.String(tracing.AttrRequestID, s.ctx.ID()),
		attribute.String(tracing.AttrEndpoint, c.path),
		attribute.Int(tracing.AttrAttempt, attempt),
		attribute.String(tracing.AttrInstance, strconv.FormatUint(instance, 16)))
	span.Watch(s.ctx)
	s.span = span
	return span.Remote()
}

// endAttemptSpan ends an attempt's span as its stream ended (err: io.EOF
// for a normal end).
func (s *Stream) endAttemptSpan(err error) {
	if s.span == nil {
		return
	}
	outcome := "completed"
	switch {
	case s.ctx.IsKilled():
		outcome = "killed"
	case errors.Is(err, io.EOF):
	case err != nil:
		outcome = "failed"
		s.span.Fail(err.Error())
	}
	s.span.End(attribute.String(tracing.AttrOutcome, outcome))
}

// traceMigration notes on the request's span that an attempt broke and the
// request goes on elsewhere.
func (s *Stream) traceMigration(attempt int, failed uint64, err error) {
	tracing.Of(s.ctx).Event(tracing.EventMigrated, attribute.Int(tracing.AttrAttempt, attempt),
		attribute.String(tracing.AttrInstance, strconv.FormatUint(failed, 16)), attribute.String("dynamo_ctx.error", err.Error()))
}

// inheritTrace gives a request's context its caller's span, so that the
// attempts made under it are that span's children.
func inheritTrace(reqCtx, parent *ctxtree.Context) {
	if t := parent.Trace(); t != nil {
		reqCtx.SetTrace(t)
	}
}

// startHandlerSpan starts the span of a request accepted by a worker, a
// child of the caller's attempt, attached to the request's context (so the
// host's spans, the engine's, are its children) and watching it.
func (e *Endpoint) startHandlerSpan(req *Request, remote *tracing.Remote) {
	if !tracing.Enabled() {
		return
	}
	span := tracing.StartHandler(remote,
		attribute.String(tracing.AttrRequestID, req.ID),
		attribute.String(tracing.AttrEndpoint, e.path),
		attribute.String(tracing.AttrInstance, strconv.FormatUint(e.instanceID, 16)))
	tracing.Attach(req.Ctx, span)
	span.Watch(req.Ctx)
	req.span = span
}

// endHandlerSpan ends a request's span, unless its abort is still to be
// confirmed (confirmAbort ends it).
func (r *Request) endHandlerSpan() {
	if r.span == nil || r.confirming.Load() {
		return
	}
	r.finishSpan()
}

func (r *Request) finishSpan() {
	outcome := "completed"
	switch {
	case r.Ctx.IsKilled():
		outcome = "killed"
	case r.Ctx.IsStopped():
		outcome = "stopped"
	}
	r.mu.Lock()
	failMsg := r.failMsg
	r.mu.Unlock()
	if failMsg != "" && outcome != "killed" { // a killed handler's error is the kill's
		outcome = "failed"
		r.span.Fail(failMsg)
	}
	r.span.End(attribute.String(tracing.AttrOutcome, outcome))
}

// goConfirmAbort confirms the abort of a killed request in the background
// (confirmAbort), which then ends its span.
func (r *Request) goConfirmAbort() {
	r.confirming.Store(true)
	go r.confirmAbort()
}
