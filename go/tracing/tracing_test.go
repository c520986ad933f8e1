package tracing_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing/tracingtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	clientTrace = "0af7651916cd43dd8448eb211c80319c"
	clientSpan  = "b7ad6b7169203331"
)

// traced turns tracing on into an in-memory exporter for the test; spans()
// flushes (by turning it off) and returns what was exported.
func traced(t *testing.T) (spans func() tracetest.SpanStubs) {
	exp := &tracingtest.Recorder{}
	release := tracing.UseExporter(exp)
	t.Cleanup(release)
	return func() tracetest.SpanStubs {
		release() // flushes
		return exp.Spans()
	}
}

func TestOffIsNilAndFree(t *testing.T) {
	require.False(t, tracing.Enabled())
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	s := tracing.StartHTTP(r, "/v1/chat/completions")
	require.Nil(t, s)
	c := ctxtree.New("off")
	tracing.Attach(c, s)
	assert.Nil(t, c.Trace(), "nothing attached while off")
	assert.Nil(t, tracing.StartAttempt(c, "chat", "m"))
	assert.Nil(t, tracing.StartHandler(&tracing.Remote{TraceParent: "x"}))
	assert.Nil(t, tracing.StartChild(c, ""))
	// Every method of a nil span is a no-op.
	s.Watch(c)
	s.SetName("chat", "m")
	s.Event(tracing.EventKill)
	s.Fail("x")
	s.End()
	assert.Nil(t, s.Remote())
	assert.Equal(t, tracing.Stats{}, tracing.CurrentStats())
}

func TestOneTraceAcrossHops(t *testing.T) {
	spans := traced(t)
	r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	r.Header.Set("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	r.Header.Set("tracestate", "vendor=1")
	httpSpan := tracing.StartHTTP(r, "/v1/chat/completions")
	require.NotNil(t, httpSpan)
	httpSpan.SetName("chat", "m")
	req := ctxtree.New("req")
	tracing.Attach(req, httpSpan)

	attempt := tracing.StartAttempt(req, "", "", attribute.Int(tracing.AttrAttempt, 0))
	remote := attempt.Remote()
	require.NotNil(t, remote)
	assert.Equal(t, "chat", remote.Op)
	assert.Equal(t, "m", remote.Model)
	assert.Equal(t, "vendor=1", remote.TraceState, "tracestate travels on")

	handler := tracing.StartHandler(remote) // in the worker's process
	work := ctxtree.New("req")
	tracing.Attach(work, handler)
	handler.Watch(work)
	engine := tracing.StartChild(work, "")
	tracing.Of(work).Event(tracing.EventKVBlocksFreed, attribute.Int(tracing.AttrCount, 3))
	work.Cancel(ctxtree.Killed, ctxtree.ReasonClientDisconnected)
	engine.End()
	handler.Event(tracing.EventAbortConfirmed)
	handler.End()
	handler.End() // once
	attempt.End()
	httpSpan.End()

	got := spans()
	require.Len(t, got, 4)
	named := map[string]tracetest.SpanStub{}
	for _, s := range got {
		assert.Equal(t, clientTrace, s.SpanContext.TraceID().String(), "one trace: the client's")
		named[s.SpanKind.String()+" "+s.Name] = s
	}
	hs, ok := named["server POST /v1/chat/completions"]
	require.True(t, ok, "%v", named)
	assert.Equal(t, clientSpan, hs.Parent.SpanID().String(), "the HTTP span is the client's span's child")
	as := named["client chat m"]
	assert.Equal(t, hs.SpanContext.SpanID(), as.Parent.SpanID())
	ws := named["server chat m"]
	assert.Equal(t, as.SpanContext.SpanID(), ws.Parent.SpanID(), "the handler is the attempt's child")
	assert.True(t, ws.Parent.IsRemote())
	es := named["internal chat m"]
	assert.Equal(t, ws.SpanContext.SpanID(), es.Parent.SpanID(), "the engine is the handler's child")

	var names []string
	for _, e := range ws.Events {
		names = append(names, e.Name)
		if e.Name == tracing.EventKill {
			assert.Contains(t, e.Attributes, attribute.String(tracing.AttrReason, "client_disconnected"))
		}
	}
	assert.Equal(t, []string{tracing.EventKVBlocksFreed, tracing.EventKill, tracing.EventAbortConfirmed}, names)
}

func TestBadTraceparentIsIgnored(t *testing.T) {
	spans := traced(t)
	for _, tp := range []string{
		"garbage", "00-" + clientTrace + "-" + clientSpan, "00-00000000000000000000000000000000-" + clientSpan + "-01",
		"00-" + clientTrace + "-" + clientSpan + "-01" + strings.Repeat("x", 1000),
	} {
		r := httptest.NewRequest("POST", "/v1/completions", nil)
		r.Header.Set("traceparent", tp)
		r.Header.Set("tracestate", strings.Repeat("k=v,", 300))
		s := tracing.StartHTTP(r, "/v1/completions")
		require.NotNil(t, s)
		s.End()
		h := tracing.StartHandler(&tracing.Remote{TraceParent: tp})
		h.End()
	}
	for _, s := range spans() {
		assert.False(t, s.Parent.IsValid(), "a root span")
		assert.NotEqual(t, clientTrace, s.SpanContext.TraceID().String())
	}
}

func TestWatchEvents(t *testing.T) {
	spans := traced(t)
	for _, cancel := range []func(c *ctxtree.Context){
		func(c *ctxtree.Context) { c.StopGenerating() },
		func(c *ctxtree.Context) { c.SetDeadline(time.Now()) },
		func(c *ctxtree.Context) { c.Kill() },
	} {
		parent := ctxtree.New("w")
		c := parent.Child()
		s := tracing.StartHandler(nil)
		s.Watch(c)
		cancel(parent) // reaches c as "parent": the event names the cause
		require.Eventually(t, c.IsStopped, 5*time.Second, time.Millisecond)
		s.End()
		parent.Kill() // after End: no event
	}
	got := spans()
	require.Len(t, got, 3)
	want := []struct{ name, reason string }{{tracing.EventStop, "stop_generating"}, {tracing.EventDeadline, ""}, {tracing.EventKill, "kill"}}
	for i, s := range got {
		require.Len(t, s.Events, 1, s.Events)
		assert.Equal(t, want[i].name, s.Events[0].Name)
		if want[i].reason != "" {
			assert.Contains(t, s.Events[0].Attributes, attribute.String(tracing.AttrReason, want[i].reason))
		}
	}
}

func TestConfigFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env map[string]string
		on  bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "zipkin"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, true},
	} {
		for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
			"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
			t.Setenv(k, tc.env[k])
		}
		release := tracing.Acquire()
		assert.Equal(t, tc.on, tracing.Enabled(), "%v", tc.env)
		second := tracing.Acquire() // shared: the first release leaves it on
		release()
		assert.Equal(t, tc.on, tracing.Enabled(), "%v", tc.env)
		second()
		second() // idempotent
		assert.False(t, tracing.Enabled())
	}
}

// An exporter that never answers must not hold a request: spans are queued
// and dropped past the queue, never waited for.
func TestExportNeverBlocks(t *testing.T) {
	exp := &stuck{release: make(chan struct{})}
	release := tracing.UseExporter(exp)
	start := time.Now()
	for range 10000 {
		tracing.StartHandler(nil).End()
	}
	assert.Less(t, time.Since(start), 5*time.Second)
	close(exp.release)
	release()
}

type stuck struct{ release chan struct{} }

func (s *stuck) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}
func (s *stuck) Shutdown(context.Context) error { return nil }

// BenchmarkRequestSpans is the tracing work of one request in one process
// (its HTTP span, an attempt, the handler with its watch, the engine's span),
// off and on (exported to an exporter that drops them: the cost of making
// and queueing spans, not of the network).
func BenchmarkRequestSpans(b *testing.B) {
	run := func(b *testing.B) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.Header.Set("traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
		c, work := ctxtree.New("bench"), ctxtree.New("bench") // a request's, made anyway
		b.ReportAllocs()
		for b.Loop() {
			h := tracing.StartHTTP(r, "/v1/chat/completions")
			h.SetName("chat", "m")
			tracing.Attach(c, h)
			h.Watch(c)
			a := tracing.StartAttempt(c, "", "")
			w := tracing.StartHandler(a.Remote())
			tracing.Attach(work, w)
			w.Watch(work)
			e := tracing.StartChild(work, "")
			e.End()
			w.End()
			a.End()
			h.End()
		}
	}
	b.Run("off", run)
	b.Run("on", func(b *testing.B) {
		release := tracing.UseExporter(tracingtest.Discard{})
		defer release()
		run(b)
	})
}
