package frame

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReader feeds arbitrary bytes to a Reader. It must never panic, every
// error must be io.EOF, io.ErrUnexpectedEOF or wrap ErrInvalid, and every
// frame it accepts must re-encode to exactly the bytes it was decoded from.
// The seeds in testdata/fuzz/FuzzReader run with plain `go test`.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		const max = 1 << 18                              // above chunk, so the chunked path is fuzzed too
		r := NewReaderSize(bytes.NewReader(in), 16, max) // tiny buffer: refills mid-frame
		var out bytes.Buffer
		w := NewWriter(&out)
		consumed := 0
		for {
			fr, err := r.ReadFrame()
			if err != nil {
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrInvalid) {
					t.Fatalf("unexpected error type: %v", err)
				}
				break
			}
			if !fr.Type.Valid() || len(fr.Payload) > max {
				t.Fatalf("accepted invalid frame %v len %d", fr.Type, len(fr.Payload))
			}
			if fr.Type == Credit {
				if err := w.WriteCredit(fr.Credit()); err != nil {
					t.Fatal(err)
				}
			} else if err := w.WriteFrame(fr.Type, fr.Payload); err != nil {
				t.Fatal(err)
			}
			consumed += HeaderSize + len(fr.Payload)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), in[:consumed]) {
			t.Fatalf("re-encoding differs:\n in  %x\n out %x", in[:consumed], out.Bytes())
		}
	})
}
