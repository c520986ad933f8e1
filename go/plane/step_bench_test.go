package plane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// BenchmarkStepBursts is an engine's shape on the caller's side: 64 streams
// get one item each per step of 10 ms (all at once, then nothing), and a
// goroutine per stream reads its items with Next, as the frontend's
// responses do. cpu-us/item is the process's CPU time (caller and worker
// runtimes both in it) per item: what per-item wake-ups cost, beside the
// idle gaps between steps.
func BenchmarkStepBursts(b *testing.B) {
	const path, streams, steps, step = "bench.steps.generate", 64, 30, 10 * time.Millisecond
	var start time.Time
	_, _, c := planetest.ServeAndConnect(b, path, func(w *planetest.Worker, req *plane.Request) {
		for i := range steps {
			time.Sleep(time.Until(start.Add(time.Duration(i+1) * step)))
			if !w.Send(req, benchItem) {
				return
			}
		}
		req.Complete()
	})
	b.ResetTimer()
	var used time.Duration
	for range b.N {
		start = time.Now().Add(20 * time.Millisecond)
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		c0 := planetest.CPUTime()
		for range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := c.Generate(fmt.Appendf(nil, "%d", steps), nil, plane.RoundRobin, 0)
				if err != nil {
					errs <- err
					return
				}
				got := 0
				for {
					_, err := s.Next(context.Background())
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						errs <- err
						return
					}
					got++
				}
				if got != steps {
					errs <- fmt.Errorf("got %d items, want %d", got, steps)
				}
			}()
		}
		wg.Wait()
		used += planetest.CPUTime() - c0
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(used.Microseconds())/float64(b.N*streams*steps), "cpu-us/item")
}
