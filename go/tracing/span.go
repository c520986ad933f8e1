package tracing

import (
	"context"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

// Attribute keys: the OpenTelemetry GenAI and HTTP conventions', and the
// library's own (dynamo_ctx.*).
const (
	AttrOperation     = "gen_ai.operation.name"
	AttrModel         = "gen_ai.request.model"
	AttrMaxTokens     = "gen_ai.request.max_tokens"
	AttrInputTokens   = "gen_ai.usage.input_tokens"
	AttrOutputTokens  = "gen_ai.usage.output_tokens"
	AttrFinishReasons = "gen_ai.response.finish_reasons"
	AttrResponseID    = "gen_ai.response.id"
	AttrRequestID     = "dynamo_ctx.request_id"
	AttrAttempt       = "dynamo_ctx.attempt"
	AttrInstance      = "dynamo_ctx.instance_id"
	AttrEndpoint      = "dynamo_ctx.endpoint"
	AttrReason        = "dynamo_ctx.reason"
	AttrOutcome       = "dynamo_ctx.outcome"
	AttrCount         = "count"
)

// The events of a request's cancellation, on the span of each hop that sees
// it (docs/design.md, "Traces").
const (
	EventStop           = "dynamo_ctx.stop"            // stopped: stop generating, finish cleanly
	EventKill           = "dynamo_ctx.kill"            // killed, with AttrReason
	EventDeadline       = "dynamo_ctx.deadline"        // killed by its deadline
	EventAbortConfirmed = "dynamo_ctx.abort_confirmed" // the worker confirmed the abort to its caller
	EventKVBlocksFreed  = "dynamo_ctx.kv_blocks_freed" // the engine's abort freed AttrCount KV blocks
	EventMigrated       = "dynamo_ctx.migrated"        // this attempt broke and the request goes on elsewhere
)

// Span is one hop's span. Every method is a no-op on a nil *Span, which is
// what every Start returns while tracing is off.
type Span struct {
	s         trace.Span
	op, model string

	mu    sync.Mutex
	hooks []func() bool // Watch's context hooks, removed by End
	ended bool
}

// Name is a GenAI span's name: "{operation} {model}".
func Name(op, model string) string {
	if model == "" {
		return op
	}
	return op + " " + model
}

// Remote is a span's context as it crosses to another process: the W3C
// traceparent and tracestate, and the GenAI operation and model the next
// hop's spans are named after.
type Remote struct {
	TraceParent string `json:"traceparent"`
	TraceState  string `json:"tracestate,omitempty"`
	Op          string `json:"op,omitempty"`
	Model       string `json:"model,omitempty"`
}

// MaxRemoteField bounds each field of a Remote a worker accepts (a
// traceparent is 55 characters, a tracestate at most 512 by W3C's rules).
const MaxRemoteField = 512

// Valid reports whether a received Remote is within MaxRemoteField.
func (r *Remote) Valid() bool {
	return len(r.TraceParent) <= MaxRemoteField && len(r.TraceState) <= MaxRemoteField &&
		len(r.Op) <= MaxRemoteField && len(r.Model) <= MaxRemoteField
}

var w3c = propagation.TraceContext{}

// mapCarrier is a propagation carrier over two fields.
type mapCarrier map[string]string

func (m mapCarrier) Get(k string) string { return m[k] }
func (m mapCarrier) Set(k, v string)     { m[k] = v }
func (m mapCarrier) Keys() []string      { return []string{"traceparent", "tracestate"} }

// remoteParent is the context of a parent received from elsewhere: a
// traceparent that breaks W3C's rules is ignored (the span is a root).
func remoteParent(traceparent, tracestate string) context.Context {
	if traceparent == "" || len(traceparent) > MaxRemoteField {
		return context.Background()
	}
	if len(tracestate) > MaxRemoteField {
		tracestate = ""
	}
	return w3c.Extract(context.Background(), mapCarrier{"traceparent": traceparent, "tracestate": tracestate})
}

// StartHTTP starts the span of an HTTP request served (kind SERVER, named
// "METHOD route" by the HTTP conventions), a child of the client's
// traceparent if it sent a valid one. Nil while tracing is off.
func StartHTTP(r *http.Request, route string) *Span {
	p := active.Load()
	if p == nil {
		return nil
	}
	parent := remoteParent(r.Header.Get("traceparent"), r.Header.Get("tracestate"))
	_, s := p.tracer.Start(parent, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", route),
			attribute.String("url.path", r.URL.Path),
			attribute.String("url.scheme", "http"),
			attribute.String("network.protocol.version", protoVersion(r)),
		))
	return &Span{s: s}
}

func protoVersion(r *http.Request) string {
	if r.ProtoMajor == 2 {
		return "2"
	}
	if r.ProtoMinor == 0 {
		return "1.0"
	}
	return "1.1"
}

// StartAttempt starts the span of one attempt of a request sent to a worker
// (kind CLIENT, named by GenAI's rules), a child of the span attached to
// parent (the request's context). Nil while tracing is off.
func StartAttempt(parent *ctxtree.Context, op, model string, attrs ...attribute.KeyValue) *Span {
	p := active.Load()
	if p == nil {
		return nil
	}
	ps := Of(parent)
	pop, pmodel := ps.names()
	if op == "" {
		op = pop
	}
	if model == "" {
		model = pmodel
	}
	if op == "" {
		op = "generate"
	}
	s := start(p, ps.ctx(), trace.SpanKindClient, op, model, attrs)
	return s
}

// StartHandler starts the span of a worker's handler (kind SERVER), a child
// of the caller's attempt (remote; nil or invalid: a root). Nil while
// tracing is off.
func StartHandler(remote *Remote, attrs ...attribute.KeyValue) *Span {
	p := active.Load()
	if p == nil {
		return nil
	}
	parent, op, model := context.Background(), "generate", ""
	if remote != nil {
		parent = remoteParent(remote.TraceParent, remote.TraceState)
		if remote.Op != "" {
			op = remote.Op
		}
		model = remote.Model
	}
	return start(p, parent, trace.SpanKindServer, op, model, attrs)
}

// StartChild starts an INTERNAL span under the span attached to parent:
// the engine's generate. An empty name is the parent's GenAI name. Nil
// while tracing is off or parent has no span.
func StartChild(parent *ctxtree.Context, name string, attrs ...attribute.KeyValue) *Span {
	p := active.Load()
	if p == nil {
		return nil
	}
	ps := Of(parent)
	if ps == nil {
		return nil
	}
	op, model := ps.names()
	if name == "" {
		return start(p, ps.ctx(), trace.SpanKindInternal, op, model, attrs)
	}
	_, s := p.tracer.Start(ps.ctx(), name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return &Span{s: s, op: op, model: model}
}

func start(p *provider, parent context.Context, kind trace.SpanKind, op, model string, attrs []attribute.KeyValue) *Span {
	all := make([]attribute.KeyValue, 0, len(attrs)+2)
	all = append(all, attribute.String(AttrOperation, op))
	if model != "" {
		all = append(all, attribute.String(AttrModel, model))
	}
	all = append(all, attrs...)
	_, s := p.tracer.Start(parent, Name(op, model), trace.WithSpanKind(kind), trace.WithAttributes(all...))
	return &Span{s: s, op: op, model: model}
}

func (s *Span) ctx() context.Context {
	if s == nil {
		return context.Background()
	}
	return trace.ContextWithSpan(context.Background(), s.s)
}

// Attach attaches s to c (nothing while s is nil): spans started under c
// are its children.
func Attach(c *ctxtree.Context, s *Span) {
	if s != nil && c != nil {
		c.SetTrace(s)
	}
}

// Of returns the span attached to c, nil if none.
func Of(c *ctxtree.Context) *Span {
	if c == nil {
		return nil
	}
	s, _ := c.Trace().(*Span)
	return s
}

// Remote returns s's context for the next hop (nil for a nil s).
func (s *Span) Remote() *Remote {
	if s == nil {
		return nil
	}
	m := mapCarrier{}
	w3c.Inject(s.ctx(), m)
	if m["traceparent"] == "" {
		return nil // not a valid span context
	}
	op, model := s.names()
	return &Remote{TraceParent: m["traceparent"], TraceState: m["tracestate"], Op: op, Model: model}
}

// SetName sets s's GenAI operation and model, and renames it after them.
func (s *Span) SetName(op, model string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.op, s.model = op, model
	s.mu.Unlock()
	s.s.SetAttributes(attribute.String(AttrOperation, op), attribute.String(AttrModel, model))
}

// names returns s's GenAI operation and model ("" for a nil s).
func (s *Span) names() (op, model string) {
	if s == nil {
		return "", ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.op, s.model
}

// SetAttributes sets attributes on s.
func (s *Span) SetAttributes(attrs ...attribute.KeyValue) {
	if s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// Event adds an event to s.
func (s *Span) Event(name string, attrs ...attribute.KeyValue) {
	if s != nil {
		s.s.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// Fail marks s as failed, with msg.
func (s *Span) Fail(msg string) {
	if s != nil {
		s.s.SetStatus(codes.Error, msg)
	}
}

// Watch adds the events of c's cancellation to s as it happens: stop,
// kill (with its reason) or deadline. End stops watching.
func (s *Span) Watch(c *ctxtree.Context) {
	if s == nil || c == nil {
		return
	}
	stopHook := c.Notify(ctxtree.Stopped, func() {
		if !c.IsKilled() { // a kill fires the Stopped hooks first
			s.Event(EventStop, attribute.String(AttrReason, c.Cause().String()))
		}
	})
	killHook := c.Notify(ctxtree.Killed, func() {
		reason := c.Cause() // where it started: client_disconnected, not parent
		if reason == ctxtree.ReasonDeadline {
			s.Event(EventDeadline)
			return
		}
		s.Event(EventKill, attribute.String(AttrReason, reason.String()))
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		stopHook()
		killHook()
		return
	}
	s.hooks = append(s.hooks, stopHook, killHook)
}

// End ends s (once; later calls do nothing) and stops its watches.
func (s *Span) End(attrs ...attribute.KeyValue) {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	hooks := s.hooks
	s.hooks = nil
	s.mu.Unlock()
	for _, stop := range hooks {
		stop()
	}
	if len(attrs) > 0 {
		s.s.SetAttributes(attrs...)
	}
	s.s.End()
}

// IDs returns s's trace and span ids in hex ("" for a nil s).
func (s *Span) IDs() (traceID, spanID string) {
	if s == nil {
		return "", ""
	}
	sc := s.s.SpanContext()
	return sc.TraceID().String(), sc.SpanID().String()
}
