package transport

import (
	"bytes"
	"context"
	"io"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkStream pushes 64-byte items through one worker -> caller stream on
// loopback, the consumer reading as fast as it can (default window 256). One
// op is one item; items/s is the stream's throughput and ns/op the cost per
// item end to end (both sides, on this machine's cores).
//
//   - Send: one Send (one write syscall) per item, the handler's natural shape.
//   - SendBatch/N: N items per SendBatch (one write per batch), as a bridge that
//     drains everything its handler produced since the last write.
func BenchmarkStream(b *testing.B) {
	b.Run("Send", func(b *testing.B) { benchStream(b, 1) })
	b.Run("SendBatch/16", func(b *testing.B) { benchStream(b, 16) })
	b.Run("SendBatch/64", func(b *testing.B) { benchStream(b, 64) })
}

func benchStream(b *testing.B, batch int) {
	s, err := Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tok := NewToken()
	in := s.Expect(tok)
	defer in.Close()
	o, err := Dial(context.Background(), s.Addr().String(), tok)
	if err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), 64)
	items := make([][]byte, batch)
	for i := range items {
		items[i] = payload
	}
	ctx := context.Background()

	b.SetBytes(64)
	b.ReportAllocs()
	b.ResetTimer()
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < b.N; i += batch {
			n := min(batch, b.N-i)
			var err error
			if batch == 1 {
				err = o.Send(ctx, payload)
			} else {
				_, err = o.SendBatch(ctx, items[:n])
			}
			if err != nil {
				errc <- err
				return
			}
		}
		errc <- o.Finish()
	}()
	for i := 0; i < b.N; i++ {
		if _, err := in.Recv(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := in.Recv(ctx); err != io.EOF {
		b.Fatal(err)
	}
	b.StopTimer()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
	<-o.Done()
}

// BenchmarkFloodAttach measures, it does not pass judgement on timing
// (TestSilentFloodDoesNotKeepWorkersOut does): flooders each open a silent
// connection every interval, beyond the MaxPendingConns the Server holds,
// and once the Server is full one op is a worker attaching its stream (Dial,
// one item through), one every 20 ms while the flood goes on. It reports the
// attach latency (p50-ms, p90-ms, p99-ms, max-ms), the share of workers that
// failed, and the flood's rate; ns/op, the period, is left out. The figures
// in docs/security.md come from
//
//	go test -run '^$' -bench FloodAttach -benchtime 280x ./go/transport
func BenchmarkFloodAttach(b *testing.B) {
	b.Run("every=1ms", func(b *testing.B) { benchFloodAttach(b, time.Millisecond, 1) })
	b.Run("every=200us", func(b *testing.B) { benchFloodAttach(b, 200*time.Microsecond, 1) })
	b.Run("every=200us/flooders=4", func(b *testing.B) { benchFloodAttach(b, 200*time.Microsecond, 4) })
}

func benchFloodAttach(b *testing.B, every time.Duration, flooders int) {
	// Not listen: its goleak check would see the benchmark runner's own
	// goroutines (TestMain's check runs at the end).
	s, err := Listen("127.0.0.1:0")
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, s.Close()) })
	var fs []*flooder
	for range flooders {
		fs = append(fs, startFlood(b, s, MaxPendingConns/flooders, every, 2*MaxPendingConns))
	}
	waitFull(b, s)
	opened := func() (n int64) {
		for _, f := range fs {
			n += f.opened.Load()
		}
		return n
	}
	var lat []time.Duration
	fails := 0
	start, before := time.Now(), opened()
	for b.Loop() {
		t0 := time.Now()
		if d, ok := attachOnce(s); ok {
			lat = append(lat, d)
		} else {
			fails++
		}
		time.Sleep(time.Until(t0.Add(20 * time.Millisecond)))
	}
	rate := float64(opened()-before) / time.Since(start).Seconds()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	ms := func(q float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(.5), "p50-ms")
	b.ReportMetric(ms(.9), "p90-ms")
	b.ReportMetric(ms(.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.ReportMetric(float64(fails)/float64(b.N), "failed/op")
	b.ReportMetric(rate, "flood/s")
}

// attachOnce connects a worker's stream to s on a connection of its own and
// sends one item through: how long until the caller received it, and
// whether it did.
func attachOnce(s *Server) (time.Duration, bool) {
	tok := NewToken()
	in := s.Expect(tok)
	defer in.Close()
	t0 := time.Now()
	o, err := Dial(context.Background(), s.Addr().String(), tok)
	if err != nil {
		return 0, false
	}
	defer o.Close()
	_ = o.Send(context.Background(), item(0))
	if _, err := in.Recv(context.Background()); err != nil {
		return 0, false
	}
	return time.Since(t0), true
}
