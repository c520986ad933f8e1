package transport

import (
	"bytes"
	"context"
	"io"
	"testing"
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
