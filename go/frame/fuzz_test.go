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

// FuzzDecode checks Decode against ReadFrame on the same input: every frame
// ReadFrame returns, Decode returns with its exact size, whatever prefix
// of the input it is given first; where ReadFrame fails with ErrInvalid,
// Decode fails too, and at the end of input Decode asks for more.
// Seeds: testdata/fuzz/FuzzReader's inputs (plain `go test` runs them).
func FuzzDecode(f *testing.F) {
	f.Add([]byte{byte(Data), 0, 0, 0, 3, 'a', 'b', 'c', byte(Kill), 0, 0, 0, 1, 7, byte(Final), 0, 0, 0, 0})
	f.Add([]byte{byte(Credit), 0, 0, 0, 4, 0, 0, 1, 0, byte(Error), 0, 0, 0, 1, 0xff})
	f.Add([]byte{byte(Stop), 0, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		const max = 1 << 18
		r := NewReaderSize(bytes.NewReader(in), 16, max)
		off := 0
		for {
			want, rerr := r.ReadFrame()
			// Decode sees the input one prefix at a time: never a frame
			// before it is whole.
			rest := in[off:]
			var got Frame
			var size int
			var derr error
			for k := 0; k <= len(rest); k++ {
				got, size, derr = Decode(rest[:k], max)
				if derr != nil || size > 0 {
					break
				}
			}
			switch {
			case rerr == nil:
				if derr != nil || size == 0 {
					t.Fatalf("ReadFrame read %v, Decode: size %d, %v", want.Type, size, derr)
				}
				if got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) {
					t.Fatalf("Decode %v %x, ReadFrame %v %x", got.Type, got.Payload, want.Type, want.Payload)
				}
				off += size
				continue
			case errors.Is(rerr, ErrInvalid):
				if derr == nil || !errors.Is(derr, ErrInvalid) {
					t.Fatalf("ReadFrame: %v; Decode: size %d, %v", rerr, size, derr)
				}
			default: // the input ends: Decode wants more
				if derr != nil || size != 0 {
					t.Fatalf("at the end of input Decode gave size %d, %v", size, derr)
				}
			}
			return
		}
	})
}
