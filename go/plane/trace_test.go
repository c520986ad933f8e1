package plane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing/tracingtest"
)

// A request sent under a context with a span: the attempt is that span's
// child, the worker's handler span the attempt's (through the envelope),
// the handler's context carries its span (the host's spans go under it),
// and a kill by the caller shows on both with its cause, then the abort's
// confirmation on the handler's.
func TestTraceAcrossTheEnvelope(t *testing.T) {
	exp := &tracingtest.Recorder{}
	release := tracing.UseExporter(exp)
	t.Cleanup(release)
	got := make(chan *plane.Request, 1)
	host, _, c := planetest.ServeAndConnect(t, "test.trace.generate", planetest.Hold(got))
	confirmed := make(chan struct{}, 1)
	unsubscribe, err := host.OnAbortConfirmed(func(plane.AbortConfirmation) { confirmed <- struct{}{} })
	require.NoError(t, err)
	defer unsubscribe()

	root := tracing.StartHandler(&tracing.Remote{Op: "chat", Model: "m"})
	parent := ctxtree.New("traced")
	tracing.Attach(parent, root)
	s := planetest.Generate(t, c, `{}`, parent)
	req := <-got
	require.NotNil(t, tracing.Of(req.Ctx), "the handler's context carries its span")
	parent.Cancel(ctxtree.Killed, ctxtree.ReasonClientDisconnected)
	select {
	case <-confirmed:
	case <-time.After(planetest.WaitLimit):
		t.Fatal("abort not confirmed")
	}
	_, _ = planetest.Take(s, 1)
	root.End()
	// The handler's span ends just after the confirmation is published.
	require.Eventually(t, func() bool { return tracing.CurrentStats().Ended >= 3 }, planetest.WaitLimit, time.Millisecond)
	release() // flushes

	spans := exp.Spans()
	byKind := map[trace.SpanKind]tracetest.SpanStub{}
	for _, sp := range spans {
		assert.Equal(t, "chat m", sp.Name)
		byKind[sp.SpanKind] = sp
	}
	require.Len(t, byKind, 2, "the root and the handler are SERVER, the attempt CLIENT: %v", spans)
	attempt := byKind[trace.SpanKindClient]
	assert.Equal(t, root.Remote().TraceParent[36:52], attempt.Parent.SpanID().String())
	var handler tracetest.SpanStub
	for _, sp := range spans {
		if sp.Parent.SpanID() == attempt.SpanContext.SpanID() {
			handler = sp
		}
	}
	require.Equal(t, trace.SpanKindServer, handler.SpanKind, "the handler is the attempt's child")
	assert.True(t, handler.Parent.IsRemote())
	assert.Equal(t, attempt.SpanContext.TraceID(), handler.SpanContext.TraceID())
	var names []string
	for _, e := range handler.Events {
		names = append(names, e.Name)
	}
	assert.Equal(t, []string{tracing.EventKill, tracing.EventAbortConfirmed}, names)
	assert.Contains(t, handler.Events[0].Attributes, attribute.String(tracing.AttrReason, "client_disconnected"))
	assert.Contains(t, handler.Attributes, attribute.String(tracing.AttrOutcome, "killed"))
	assert.Contains(t, attempt.Attributes, attribute.String(tracing.AttrOutcome, "killed"))
}
