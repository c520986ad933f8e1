package plane_test

import (
	"errors"
	"io"
	"testing"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing/tracingtest"
)

// BenchmarkRequestTracing is one whole request (sent under a caller's
// context, accepted, one item, completed, read to its end) between two
// runtimes on loopback, with tracing off and on. On, the caller's context
// carries a span (as the frontend's does), and the attempt's and the
// handler's spans are made and queued for an exporter that drops them: the
// cost tracing adds to a request, without the network's.
func BenchmarkRequestTracing(b *testing.B) {
	const path = "bench.traced.generate"
	_, _, c := planetest.ServeAndConnect(b, path, func(w *planetest.Worker, req *plane.Request) {
		if w.Send(req, benchItem) {
			req.Complete()
		}
	})
	run := func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			parent := ctxtree.New("bench-trace")
			span := tracing.StartHandler(nil) // nil while off
			tracing.Attach(parent, span)
			s, err := c.Generate([]byte(`1`), parent, plane.RoundRobin, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := drain(s); err != nil {
				b.Fatal(err)
			}
			span.End()
		}
	}
	b.Run("off", run)
	b.Run("on", func(b *testing.B) {
		release := tracing.UseExporter(tracingtest.Discard{})
		defer release()
		run(b)
	})
}

func drain(s *plane.Stream) error {
	if err := planetest.WaitStarted(s); err != nil {
		return err
	}
	for {
		_, err := s.Take(0)
		switch {
		case err == nil:
		case errors.Is(err, plane.ErrAgain):
			if err := planetest.WaitArm(s.Arm); err != nil {
				return err
			}
		case err == io.EOF:
			return nil
		default:
			return err
		}
	}
}
