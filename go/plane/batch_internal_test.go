package plane

import (
	"encoding/binary"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
)

// bufferedStream is a stream that already holds items and, with end, its
// terminal error, without a network behind it.
func bufferedStream(end error, items ...string) *Stream {
	s := &Stream{ctx: ctxtree.New("batch"), wake: make(chan struct{}, 1), err: end}
	for _, it := range items {
		s.items = append(s.items, []byte(it))
	}
	return s
}

func unframe(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	for len(b) > 0 {
		require.GreaterOrEqual(t, len(b), 4)
		n := int(binary.LittleEndian.Uint32(b))
		out = append(out, string(b[4:4+n]))
		b = b[4+n:]
	}
	return out
}

func TestBatchKeepsWhatDidNotFit(t *testing.T) {
	b := NewBatch(bufferedStream(io.EOF, `"aaaaaa"`, `"bbbbbb"`, `"cccccc"`))
	dst := make([]byte, 30) // two framed 8-byte items (24 bytes), not three
	used, n, err := b.TakeInto(dst)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, []string{`"aaaaaa"`, `"bbbbbb"`}, unframe(t, dst[:used]))

	fired := false
	b.Arm(func() { fired = true })
	assert.True(t, fired, "a kept item arms at once")

	used, n, err = b.TakeInto(dst)
	require.NoError(t, err)
	assert.Equal(t, []string{`"cccccc"`}, unframe(t, dst[:used]))
	assert.Equal(t, 1, n)

	_, _, err = b.TakeInto(dst)
	assert.ErrorIs(t, err, io.EOF)
}

func TestBatchShortBuffer(t *testing.T) {
	b := NewBatch(bufferedStream(nil, `"aaaaaa"`))
	used, n, err := b.TakeInto(make([]byte, 5))
	assert.ErrorIs(t, err, ErrShortBuffer)
	assert.Equal(t, 12, used, "the size the next item needs")
	assert.Equal(t, 0, n)
	used, n, err = b.TakeInto(make([]byte, 12))
	require.NoError(t, err, "the item stayed first in line")
	assert.Equal(t, 12, used)
	assert.Equal(t, 1, n)
	_, _, err = b.TakeInto(nil)
	assert.ErrorIs(t, err, ErrAgain)
}

func TestBatchKillDropsKeptItems(t *testing.T) {
	s := bufferedStream(nil, `"aaaaaa"`, `"bbbbbb"`)
	b := NewBatch(s)
	dst := make([]byte, 12)
	_, n, err := b.TakeInto(dst)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	s.ctx.Kill()
	_, n, err = b.TakeInto(dst)
	assert.ErrorIs(t, err, io.EOF, "a kill is a hard abort: the kept item is dropped")
	assert.Equal(t, 0, n)
}
