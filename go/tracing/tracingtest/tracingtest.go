// Package tracingtest has the span exporters of the tests and benchmarks of
// the packages that trace (go/tracing.UseExporter takes them).
package tracingtest

import (
	"context"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Recorder keeps every span it exports, also after its shutdown (the SDK's
// in-memory exporter forgets them then, and turning tracing off is how a
// test flushes).
type Recorder struct {
	mu    sync.Mutex
	spans tracetest.SpanStubs
}

// ExportSpans keeps spans.
func (r *Recorder) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, tracetest.SpanStubsFromReadOnlySpans(spans)...)
	return nil
}

// Shutdown keeps what was exported.
func (r *Recorder) Shutdown(context.Context) error { return nil }

// Spans returns the spans exported so far.
func (r *Recorder) Spans() tracetest.SpanStubs {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(tracetest.SpanStubs(nil), r.spans...)
}

// Discard drops every span: what benchmarks export to, to measure the cost
// of making and queueing spans without the network's.
type Discard struct{}

// ExportSpans drops spans.
func (Discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }

// Shutdown does nothing.
func (Discard) Shutdown(context.Context) error { return nil }
