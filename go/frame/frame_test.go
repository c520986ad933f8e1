package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func encode(t testing.TB, f func(w *Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := NewWriter(&buf)
	f(w)
	require.NoError(t, w.Flush())
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 3*chunk+17) // exercises the chunked path
	raw := encode(t, func(w *Writer) {
		require.NoError(t, w.WriteHello([]byte("tok")))
		require.NoError(t, w.WriteData([]byte(`{"a":1}`)))
		require.NoError(t, w.WriteData(nil))
		n, err := w.WriteBatch([][]byte{[]byte("b1"), []byte("b2"), big})
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.NoError(t, w.WriteCredit(0xDEADBEEF))
		require.NoError(t, w.WriteStop())
		require.NoError(t, w.WriteKill())
		require.NoError(t, w.WriteError("boom: é"))
		require.NoError(t, w.WriteFinal())
	})
	r := NewReader(bytes.NewReader(raw))
	want := []Frame{
		{Hello, []byte("tok")},
		{Data, []byte(`{"a":1}`)},
		{Data, []byte{}},
		{Data, []byte("b1")},
		{Data, []byte("b2")},
		{Data, big},
		{Credit, []byte{0xDE, 0xAD, 0xBE, 0xEF}},
		{Stop, nil},
		{Kill, nil},
		{Error, []byte("boom: é")},
		{Final, nil},
	}
	for i, w := range want {
		f, err := r.ReadFrame()
		require.NoError(t, err, "frame %d", i)
		assert.Equal(t, w.Type, f.Type, "frame %d", i)
		assert.Equal(t, w.Payload, f.Payload, "frame %d", i)
	}
	_, err := r.ReadFrame()
	assert.Equal(t, io.EOF, err)
}

func TestCreditValue(t *testing.T) {
	raw := encode(t, func(w *Writer) { require.NoError(t, w.WriteCredit(256)) })
	assert.Equal(t, []byte{byte(Credit), 0, 0, 0, 4, 0, 0, 1, 0}, raw)
	f, err := NewReader(bytes.NewReader(raw)).ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, uint32(256), f.Credit())
}

func TestPayloadOwnership(t *testing.T) {
	raw := encode(t, func(w *Writer) {
		_, err := w.WriteBatch([][]byte{[]byte("first"), []byte("second")})
		require.NoError(t, err)
	})
	r := NewReader(bytes.NewReader(raw))
	a, err := r.ReadFrame()
	require.NoError(t, err)
	_, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, "first", string(a.Payload), "a later read must not overwrite an earlier payload")
}

func hdr(t Type, n uint32) []byte {
	b := []byte{byte(t), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], n)
	return b
}

func TestReaderRejects(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"type zero", hdr(0, 0), ErrUnknownType},
		{"type ten", hdr(10, 0), ErrUnknownType},
		{"heartbeat payload", hdr(Heartbeat, 1), ErrBadPayload},
		{"type 255", []byte{0xFF}, ErrUnknownType},
		{"oversize data", hdr(Data, DefaultMaxPayload+1), ErrTooLarge},
		{"max length data", hdr(Data, 0xFFFFFFFF), ErrTooLarge},
		{"short credit", append(hdr(Credit, 3), 1, 2, 3), ErrBadPayload},
		{"long credit", append(hdr(Credit, 5), 1, 2, 3, 4, 5), ErrBadPayload},
		{"empty credit", hdr(Credit, 0), ErrBadPayload},
		{"final with payload", append(hdr(Final, 1), 'x'), ErrBadPayload},
		{"stop with payload", append(hdr(Stop, 1), 'x'), ErrBadPayload},
		{"kill with a 2-byte payload", append(hdr(Kill, 2), 'x', 'y'), ErrBadPayload},
		{"error not utf8", append(hdr(Error, 2), 0xC3, 0x28), ErrBadPayload},
		{"truncated header", []byte{byte(Data), 0, 0}, io.ErrUnexpectedEOF},
		{"truncated payload", append(hdr(Data, 10), 'a', 'b'), io.ErrUnexpectedEOF},
		{"truncated big payload", append(hdr(Data, 1<<20), make([]byte, chunk+5)...), io.ErrUnexpectedEOF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(c.in)).ReadFrame()
			require.Error(t, err)
			assert.ErrorIs(t, err, c.want)
			if errors.Is(c.want, ErrInvalid) {
				assert.ErrorIs(t, err, ErrInvalid)
			}
		})
	}
}

func TestReaderCustomMax(t *testing.T) {
	raw := encode(t, func(w *Writer) {
		require.NoError(t, w.WriteData(make([]byte, 10)))
		require.NoError(t, w.WriteData(make([]byte, 11)))
	})
	r := NewReaderSize(bytes.NewReader(raw), 0, 10)
	assert.Equal(t, 10, r.Max())
	_, err := r.ReadFrame()
	require.NoError(t, err)
	_, err = r.ReadFrame()
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.Equal(t, DefaultMaxPayload, NewReaderSize(nil, 0, 0).Max())
}

// A bogus 16 MiB length followed by a few bytes must not allocate 16 MiB.
func TestReaderBogusLengthAllocation(t *testing.T) {
	in := append(hdr(Data, DefaultMaxPayload), make([]byte, 100)...)
	var err error
	got := bytesAllocated(func() { _, err = NewReader(bytes.NewReader(in)).ReadFrame() })
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Less(t, got, uint64(1<<20), "allocated %d bytes for a 100-byte body", got)
}

func TestWriteErrorSanitises(t *testing.T) {
	raw := encode(t, func(w *Writer) { require.NoError(t, w.WriteError("bad \xff byte")) })
	f, err := NewReader(bytes.NewReader(raw)).ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, "bad \uFFFD byte", string(f.Payload))
}

func TestWriterBuffersUntilFlush(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_, err := w.WriteBatch([][]byte{[]byte("a"), []byte("b")})
	require.NoError(t, err)
	assert.Equal(t, 0, buf.Len())
	assert.Equal(t, 2*(HeaderSize+1), w.Buffered())
	require.NoError(t, w.Flush())
	assert.Equal(t, 2*(HeaderSize+1), buf.Len())
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestWriterError(t *testing.T) {
	w := NewWriterSize(failWriter{}, 16)
	_, err := w.WriteBatch([][]byte{[]byte(strings.Repeat("x", 32))})
	assert.ErrorIs(t, err, io.ErrClosedPipe)
}

func TestTypeString(t *testing.T) {
	assert.Equal(t, "Credit", Credit.String())
	assert.Equal(t, "Session", Session.String())
	assert.False(t, Session.Valid())
	assert.Equal(t, "Fetch", Fetch.String())
	assert.False(t, Fetch.Valid())
	assert.Equal(t, "Type(12)", Type(12).String())
	assert.False(t, Type(0).Valid())
}

func TestIncompleteFrame(t *testing.T) {
	b := encode(t, func(w *Writer) {
		require.NoError(t, w.WriteIncomplete("stopped"))
		require.NoError(t, w.WriteIncomplete("bad \xff utf8"))
	})
	r := NewReader(bytes.NewReader(b))
	f, err := r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, Incomplete, f.Type)
	assert.Equal(t, "stopped", string(f.Payload))
	assert.Equal(t, "Incomplete", f.Type.String())
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, "bad \uFFFD utf8", string(f.Payload))
	// Raw invalid UTF-8 from a peer is rejected.
	raw := []byte{byte(Incomplete), 0, 0, 0, 1, 0xff}
	_, err = NewReader(bytes.NewReader(raw)).ReadFrame()
	assert.ErrorIs(t, err, ErrBadPayload)
}

func TestKillCause(t *testing.T) {
	b := encode(t, func(w *Writer) {
		require.NoError(t, w.WriteKillCause(3))
		require.NoError(t, w.WriteKillCause(0))
	})
	r := NewReader(bytes.NewReader(b))
	f, err := r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, Kill, f.Type)
	assert.Equal(t, []byte{3}, f.Payload)
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, Kill, f.Type)
	assert.Nil(t, f.Payload)
}

func TestHeartbeatFrame(t *testing.T) {
	b := encode(t, func(w *Writer) { require.NoError(t, w.WriteHeartbeat()) })
	assert.Equal(t, []byte{byte(Heartbeat), 0, 0, 0, 0}, b)
	f, err := NewReader(bytes.NewReader(b)).ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, Heartbeat, f.Type)
	assert.Nil(t, f.Payload)
	assert.Equal(t, "Heartbeat", f.Type.String())
	// A heartbeat carries nothing.
	raw := []byte{byte(Heartbeat), 0, 0, 0, 1, 0}
	_, err = NewReader(bytes.NewReader(raw)).ReadFrame()
	assert.ErrorIs(t, err, ErrBadPayload)
}
