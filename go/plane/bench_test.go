package plane_test

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// benchItem is a 64-byte JSON item, about the size of one token's response.
var benchItem = func() []byte {
	const head, tail = `{"token_ids":[42],"text":"`, `"}`
	b := []byte(head + strings.Repeat("x", 64-len(head)-len(tail)) + tail)
	if len(b) != 64 {
		panic(len(b))
	}
	return b
}()

// BenchmarkStreamItems pushes b.N 64-byte JSON items through one stream from
// a worker runtime to a caller runtime on loopback, both driven the way the
// native library drives them (Send + Arm on the worker, Take + Arm on the
// caller). items/s is the throughput of one stream.
func BenchmarkStreamItems(b *testing.B) {
	const path = "bench.items.generate"
	_, _, c := planetest.ServeAndConnect(b, path, func(w *planetest.Worker, req *plane.Request) {
		var n int
		if _, err := fmt.Sscanf(string(req.Payload), "%d", &n); err != nil {
			req.Fail(err.Error())
			return
		}
		for range n {
			if !w.Send(req, benchItem) {
				return
			}
		}
		req.Complete()
	})

	b.SetBytes(int64(len(benchItem)))
	b.ReportAllocs()
	b.ResetTimer()
	s, err := c.Generate(fmt.Appendf(nil, "%d", b.N), nil, plane.RoundRobin, 0)
	if err != nil {
		b.Fatal(err)
	}
	got := 0
	if err := planetest.WaitStarted(s); err != nil {
		b.Fatal(err)
	}
	for {
		items, err := s.Take(0)
		if err == nil {
			got += len(items)
			continue
		}
		if errors.Is(err, plane.ErrAgain) {
			if err := planetest.WaitArm(s.Arm); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if err != io.EOF {
			b.Fatal(err)
		}
		break
	}
	b.StopTimer()
	if got != b.N {
		b.Fatalf("got %d items, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
}

// BenchmarkKillLatency measures, for a request being served by a worker
// runtime, the time from the caller's Stream.Kill to the closing of the
// worker's request context's Killed channel (over loopback, both runtimes in
// this process). One op is a whole request (send, accept, kill, end); the
// latency metrics cover the kill only.
func BenchmarkKillLatency(b *testing.B) {
	reqs := make(chan *plane.Request, 1)
	_, _, c := planetest.ServeAndConnect(b, "bench.kill.generate", planetest.Hold(reqs))
	benchKill(b, c, reqs)
}

// BenchmarkKillLatencyLocal is BenchmarkKillLatency with the worker serving
// on the caller's runtime: the kill reaches it through the context tree
// (Request.followLocalCaller), the stream's Kill frame follows.
func BenchmarkKillLatencyLocal(b *testing.B) {
	reqs := make(chan *plane.Request, 1)
	_, _, c := planetest.ServeOnHost(b, "bench.killlocal.generate", planetest.Hold(reqs))
	benchKill(b, c, reqs)
}

func benchKill(b *testing.B, c *plane.Client, reqs chan *plane.Request) {
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		s, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := planetest.WaitStarted(s); err != nil {
			b.Fatal(err)
		}
		req := planetest.Recv(b, reqs, "the request")
		begin := time.Now()
		s.Kill()
		select {
		case <-req.Ctx.Killed():
		case <-time.After(planetest.WaitLimit):
			b.Fatal("the kill never reached the worker")
		}
		lat = append(lat, time.Since(begin))
		if _, _, err := planetest.Drain(s, 0); err != io.EOF {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		i := min(len(lat)-1, int(p*float64(len(lat))))
		return float64(lat[i].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkBurstAck sends 1,000 requests of 10 kB (a prompt of 2,000
// tokens) at once to one worker runtime and reports how long the last one
// waited for its acknowledgement (last-ack-ms; the default acknowledgement
// timeout is 1 s). One op is the whole burst.
func BenchmarkBurstAck(b *testing.B) {
	const n = 1000
	reqs := make(chan *plane.Request, n)
	_, _, c := planetest.ServeAndConnect(b, "bench.burst.generate", planetest.Hold(reqs))
	payload := []byte(`{"token_ids":[` + strings.Repeat("1234,", 2000) + `1]}`)
	var worst time.Duration
	for range b.N {
		start := time.Now()
		streams := make([]*plane.Stream, n)
		errs := make(chan error, n)
		for i := range streams {
			go func() {
				s, err := c.Generate(payload, nil, plane.RoundRobin, 0)
				if err == nil {
					streams[i] = s
					err = planetest.WaitStarted(s)
				}
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		worst = max(worst, time.Since(start))
		for _, s := range streams {
			s.Kill()
			<-reqs
		}
	}
	b.ReportMetric(float64(worst.Microseconds())/1e3, "last-ack-ms")
}
