package frame

import (
	"bytes"
	"testing"
)

// BenchmarkWriteRead encodes and decodes 64-byte Data frames through an
// in-memory buffer, 256 at a time (one Flush per batch, as a stream does).
func BenchmarkWriteRead(b *testing.B) {
	for _, size := range []int{16, 64, 512} {
		b.Run(sizeName(size), func(b *testing.B) {
			item := bytes.Repeat([]byte("x"), size)
			const batch = 256
			items := make([][]byte, batch)
			for i := range items {
				items[i] = item
			}
			var buf bytes.Buffer
			w := NewWriter(&buf)
			r := NewReader(&buf)
			b.SetBytes(int64(size + HeaderSize))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				n := min(batch, b.N-i)
				if _, err := w.WriteBatch(items[:n]); err != nil {
					b.Fatal(err)
				}
				if err := w.Flush(); err != nil {
					b.Fatal(err)
				}
				for j := 0; j < n; j++ {
					if _, err := r.ReadFrame(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

func sizeName(n int) string {
	switch n {
	case 16:
		return "16B"
	case 64:
		return "64B"
	}
	return "512B"
}
