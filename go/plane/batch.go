package plane

import (
	"encoding/binary"
	"errors"
	"sync"
)

// ErrShortBuffer is returned by Batch.TakeInto when not even the next item
// fits the caller's buffer.
var ErrShortBuffer = errors.New("plane: buffer too small for the next item")

// Batch reads a Stream into a caller's buffer: each Take's items are written
// as many as fit, and those that did not fit are kept, in order, for the next
// call. It is how the C ABI hands a stream's items over (dc_stream_take).
type Batch struct {
	s    *Stream
	mu   sync.Mutex
	rest [][]byte
}

// NewBatch wraps s.
func NewBatch(s *Stream) *Batch { return &Batch{s: s} }

// Stream is the wrapped stream.
func (b *Batch) Stream() *Stream { return b.s }

// TakeInto moves as many whole items as fit into dst, each as a 4-byte
// little-endian length followed by the item, and returns the bytes used and
// the item count. With nothing kept nor buffered it returns Take's error
// (ErrAgain, io.EOF, ...). If the next item does not fit it returns
// ErrShortBuffer with used set to the size that item needs. After a kill no
// item is returned, kept ones included (see Stream.Take).
func (b *Batch) TakeInto(dst []byte) (used, count int, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.s.Killed() {
		b.rest = nil
	}
	if len(b.rest) == 0 {
		items, err := b.s.Take(0)
		if err != nil {
			return 0, 0, err
		}
		b.rest = items
	}
	off, n := 0, 0
	for n < len(b.rest) {
		item := b.rest[n]
		need := 4 + len(item)
		if off+need > len(dst) {
			if n == 0 {
				return need, 0, ErrShortBuffer
			}
			break
		}
		binary.LittleEndian.PutUint32(dst[off:], uint32(len(item)))
		copy(dst[off+4:], item)
		off += need
		n++
	}
	b.rest = b.rest[n:]
	return off, n, nil
}

// Arm runs f once when TakeInto or Stream.Started may return something new:
// at once if items are kept from an earlier call.
func (b *Batch) Arm(f func()) {
	b.mu.Lock()
	ready := len(b.rest) > 0
	b.mu.Unlock()
	if ready {
		f()
		return
	}
	b.s.Arm(f)
}
