package frontend

// The frontend's span (go/tracing): the HTTP request, a child of the
// client's traceparent, named by the HTTP conventions and carrying the
// GenAI attributes of the completion; each choice's worker requests are its
// children (their contexts carry it). Every function here is a nil check
// while tracing is off.

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// traceStart starts the span of a completions request (nil while tracing
// is off).
func traceStart(r *http.Request, chat bool) *tracing.Span {
	if !tracing.Enabled() {
		return nil
	}
	route := "/v1/completions"
	if chat {
		route = "/v1/chat/completions"
	}
	return tracing.StartHTTP(r, route)
}

// traceParsed names the span after the request's operation and model.
func traceParsed(span *tracing.Span, in *incoming) {
	if span == nil {
		return
	}
	op := "text_completion"
	if in.chat {
		op = "chat"
	}
	span.SetName(op, in.req.Model)
	attrs := []attribute.KeyValue{attribute.String(tracing.AttrRequestID, in.id), attribute.Int(tracing.AttrInputTokens, in.promptTokens)}
	if len(in.budgets) > 0 {
		attrs = append(attrs, attribute.Int(tracing.AttrMaxTokens, in.budgets[0]))
	}
	span.SetAttributes(attrs...)
}

// traceChoice makes the span the parent of a choice's worker requests
// (before they are sent), and watches its cancellation.
func traceChoice(span *tracing.Span, reqCtx *ctxtree.Context) {
	if span == nil {
		return
	}
	tracing.Attach(reqCtx, span)
	span.Watch(reqCtx)
}

// traceEnd ends the span with the response's status and usage.
func traceEnd(span *tracing.Span, w http.ResponseWriter, in *incoming, choices []*choice) {
	if span == nil {
		return
	}
	status := http.StatusOK
	if rec, ok := w.(*recorder); ok && rec.status != 0 {
		status = rec.status
	}
	attrs := []attribute.KeyValue{attribute.Int("http.response.status_code", status)}
	if status >= 500 {
		span.Fail(strconv.Itoa(status))
		attrs = append(attrs, attribute.String("error.type", strconv.Itoa(status)))
	}
	if in != nil && len(choices) > 0 {
		prefix := "cmpl-"
		if in.chat {
			prefix = "chatcmpl-"
		}
		out, reasons, outcomes := 0, make([]string, 0, len(choices)), make([]string, 0, len(choices))
		for _, c := range choices {
			out += c.tokens
			if c.finish != "" {
				reasons = append(reasons, c.finish)
			}
			outcomes = append(outcomes, c.outcome())
		}
		attrs = append(attrs, attribute.String(tracing.AttrResponseID, prefix+in.id), attribute.Int(tracing.AttrOutputTokens, out),
			attribute.StringSlice(tracing.AttrFinishReasons, reasons), attribute.StringSlice(tracing.AttrOutcome, outcomes))
	}
	span.End(attrs...)
}
