// Package frame is the wire codec of dynamo-ctx response streams.
//
// A frame is a 1-byte type, a 4-byte big-endian payload length and the
// payload:
//
//	+------+----------------+-----------------+
//	| type | length (BE u32)| payload (length)|
//	+------+----------------+-----------------+
//
// Worker -> caller frames: Hello (the stream token), Data (one item, opaque),
// Final (normal end, empty) and Error (a UTF-8 message: the handler failed).
// Caller -> worker frames: Stop (stop generating, empty), Kill (abort,
// empty) and Credit (4-byte big-endian count of additional Data frames the
// worker may send). Heartbeat (empty) goes both ways.
//
// The codec guarantees:
//
//   - Validation: a Reader returns an error, never panics, for an unknown
//     type, a payload longer than its maximum, a Final, Stop or
//     Heartbeat frame with a payload, a Kill payload over 1 byte, a Credit payload that is
//     not exactly 4 bytes, an Error
//     payload that is not UTF-8 (each wrapping ErrInvalid), and for input
//     that ends inside a frame (io.ErrUnexpectedEOF).
//   - Bounded memory: the length is checked against the type and the maximum
//     before any allocation, and payloads above 64 KiB grow as their bytes
//     arrive, so a length not backed by data costs at most 64 KiB plus twice
//     the bytes actually received, and never more than the maximum.
//   - Ownership: the payload of a Frame returned by ReadFrame is freshly
//     allocated and belongs to the caller; it is never overwritten by later
//     reads, so items can be queued without copying.
//   - Batching: a Writer buffers; nothing reaches the underlying writer until
//     the buffer is full or Flush is called. WriteBatch encodes many Data
//     frames into the buffer at once, so one Flush (one syscall) carries them.
//
// Neither Reader nor Writer is safe for concurrent use; the stream package
// serialises access to them.
package frame

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Type is the frame type, the first byte of every frame. The values are part
// of the wire format.
type Type byte

const (
	Hello  Type = 1 // worker -> caller, first frame: the stream token
	Data   Type = 2 // worker -> caller: one item
	Final  Type = 3 // worker -> caller: normal end, empty payload
	Error  Type = 4 // worker -> caller: handler failed, UTF-8 message
	Stop   Type = 5 // caller -> worker: stop generating, empty payload
	Kill   Type = 6 // caller -> worker: abort; empty, or one byte: the cause (a reason code)
	Credit Type = 7 // caller -> worker: 4-byte BE count of more Data frames allowed
	// Incomplete: worker -> caller, the handler stopped its own request and
	// returned; UTF-8 detail (may be empty). Unlike a broken connection it is
	// deliberate, so it is never retried elsewhere.
	Incomplete Type = 8
	// Heartbeat: either direction, empty. Sent by a side that has written
	// nothing for a while, so that its peer can tell a quiet stream from a
	// dead one (see package transport, Liveness).
	Heartbeat Type = 9
	// Session: worker -> caller, the first frame of a connection that
	// carries many streams (package transport, session.go); its payload is
	// one byte, the session protocol's version. It never appears inside a
	// stream, and a Reader refuses it (Valid is false): the transport reads
	// it, like the Hello, straight from the connection.
	Session Type = 10
	// Fetch: worker -> caller, the first frame of a connection that fetches
	// the request of a stream (its payload the stream's token) when the
	// request was too large to travel in its envelope (package transport,
	// fetch.go). Like Session it never appears inside a stream, and a
	// Reader refuses it.
	Fetch Type = 11
)

func (t Type) String() string {
	switch t {
	case Hello:
		return "Hello"
	case Data:
		return "Data"
	case Final:
		return "Final"
	case Error:
		return "Error"
	case Stop:
		return "Stop"
	case Kill:
		return "Kill"
	case Credit:
		return "Credit"
	case Incomplete:
		return "Incomplete"
	case Heartbeat:
		return "Heartbeat"
	case Session:
		return "Session"
	case Fetch:
		return "Fetch"
	}
	return fmt.Sprintf("Type(%d)", byte(t))
}

// Valid reports whether t is one of the frame types a stream carries (all
// but Session and Fetch).
func (t Type) Valid() bool { return t >= Hello && t <= Heartbeat }

const (
	// HeaderSize is the size of the type byte plus the length field.
	HeaderSize = 5
	// DefaultMaxPayload is the largest payload a Reader accepts unless told
	// otherwise (see NewReaderSize).
	DefaultMaxPayload = 16 << 20
	// CreditSize is the payload size of a Credit frame.
	CreditSize = 4
	// defaultBufSize is the default buffer size on both sides: large enough
	// that one syscall carries hundreds of small frames.
	defaultBufSize = 64 << 10
	// chunk is the allocation step for large payloads (see Bounded memory).
	chunk = 64 << 10
)

// Errors returned by Reader. Each wraps ErrInvalid; ReadFrame adds details
// (the offending type or length) around them.
var (
	ErrInvalid     = errors.New("frame: invalid frame")
	ErrUnknownType = fmt.Errorf("%w: unknown type", ErrInvalid)
	ErrTooLarge    = fmt.Errorf("%w: payload too large", ErrInvalid)
	ErrBadPayload  = fmt.Errorf("%w: malformed payload", ErrInvalid)
)

// Frame is one decoded frame.
type Frame struct {
	Type    Type
	Payload []byte
}

// Credit returns the count carried by a Credit frame. It is only meaningful
// for frames returned by ReadFrame, which has validated the payload size.
func (f Frame) Credit() uint32 {
	if len(f.Payload) != CreditSize {
		return 0
	}
	return binary.BigEndian.Uint32(f.Payload)
}

// Writer encodes frames into a buffer in front of an io.Writer.
type Writer struct {
	bw  *bufio.Writer
	hdr [HeaderSize + CreditSize]byte
}

// NewWriter returns a Writer with a 64 KiB buffer.
func NewWriter(w io.Writer) *Writer { return NewWriterSize(w, defaultBufSize) }

// NewWriterSize returns a Writer with a buffer of at least size bytes.
func NewWriterSize(w io.Writer, size int) *Writer {
	return &Writer{bw: bufio.NewWriterSize(w, size)}
}

// WriteFrame buffers one frame. It does not validate the payload against the
// type (the typed helpers below produce only valid frames); it refuses
// payloads that do not fit the length field.
func (w *Writer) WriteFrame(t Type, payload []byte) error {
	if uint64(len(payload)) > 0xFFFFFFFF {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, len(payload))
	}
	w.hdr[0] = byte(t)
	binary.BigEndian.PutUint32(w.hdr[1:HeaderSize], uint32(len(payload)))
	if _, err := w.bw.Write(w.hdr[:HeaderSize]); err != nil {
		return err
	}
	_, err := w.bw.Write(payload)
	return err
}

// WriteHello buffers the Hello frame carrying the stream token.
func (w *Writer) WriteHello(token []byte) error { return w.WriteFrame(Hello, token) }

// WriteData buffers one Data frame.
func (w *Writer) WriteData(item []byte) error { return w.WriteFrame(Data, item) }

// WriteBatch buffers one Data frame per item, in order, stopping at the
// first error. It returns how many frames were buffered (or written through,
// for items larger than the buffer).
func (w *Writer) WriteBatch(items [][]byte) (int, error) {
	for i, it := range items {
		if err := w.WriteFrame(Data, it); err != nil {
			return i, err
		}
	}
	return len(items), nil
}

// WriteFinal buffers the Final frame.
func (w *Writer) WriteFinal() error { return w.WriteFrame(Final, nil) }

// WriteError buffers an Error frame. Invalid UTF-8 in msg is replaced by
// U+FFFD so that the frame is always accepted by a Reader.
func (w *Writer) WriteError(msg string) error {
	return w.WriteFrame(Error, []byte(validUTF8(msg)))
}

// WriteIncomplete buffers an Incomplete frame; msg is treated as WriteError's.
func (w *Writer) WriteIncomplete(msg string) error {
	return w.WriteFrame(Incomplete, []byte(validUTF8(msg)))
}

func validUTF8(s string) string {
	if !utf8.ValidString(s) {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}

// WriteHeartbeat buffers a Heartbeat frame.
func (w *Writer) WriteHeartbeat() error { return w.WriteFrame(Heartbeat, nil) }

// WriteStop buffers the Stop frame.
func (w *Writer) WriteStop() error { return w.WriteFrame(Stop, nil) }

// WriteKill buffers the Kill frame.
func (w *Writer) WriteKill() error { return w.WriteFrame(Kill, nil) }

// WriteKillCause buffers a Kill frame carrying the cancellation's cause (a
// reason code, opaque to this package); 0 writes a plain Kill.
func (w *Writer) WriteKillCause(cause byte) error {
	if cause == 0 {
		return w.WriteKill()
	}
	return w.WriteFrame(Kill, []byte{cause})
}

// WriteCredit buffers a Credit frame granting n more Data frames.
func (w *Writer) WriteCredit(n uint32) error {
	w.hdr[0] = byte(Credit)
	binary.BigEndian.PutUint32(w.hdr[1:HeaderSize], CreditSize)
	binary.BigEndian.PutUint32(w.hdr[HeaderSize:], n)
	_, err := w.bw.Write(w.hdr[:])
	return err
}

// Flush writes the buffered frames to the underlying writer.
func (w *Writer) Flush() error { return w.bw.Flush() }

// Buffered returns the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return w.bw.Buffered() }

// Reader decodes frames from an io.Reader.
type Reader struct {
	br  *bufio.Reader
	max int
	hdr [HeaderSize]byte
}

// NewReader returns a Reader with a 64 KiB buffer that accepts payloads up
// to DefaultMaxPayload.
func NewReader(r io.Reader) *Reader { return NewReaderSize(r, 0, 0) }

// NewReaderSize returns a Reader with a buffer of bufSize bytes (<= 0: 64
// KiB) that rejects payloads longer than maxPayload bytes (<= 0:
// DefaultMaxPayload). The buffer only decides how many frames one read
// syscall can fetch; payloads larger than it are still read whole.
func NewReaderSize(r io.Reader, bufSize, maxPayload int) *Reader {
	if bufSize <= 0 {
		bufSize = defaultBufSize
	}
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	return &Reader{br: bufio.NewReaderSize(r, bufSize), max: maxPayload}
}

// Max returns the largest payload the Reader accepts.
func (r *Reader) Max() int { return r.max }

// Buffered returns the number of bytes already read from the underlying
// reader and not yet decoded: frames that ReadFrame can return without a
// syscall.
func (r *Reader) Buffered() int { return r.br.Buffered() }

// ReadFrame reads the next frame. At a clean end of input (between frames)
// it returns io.EOF; inside a frame, io.ErrUnexpectedEOF; for a malformed
// frame an error wrapping ErrInvalid (the input is then unusable: the
// caller must drop the connection, since framing is lost).
func (r *Reader) ReadFrame() (Frame, error) {
	if _, err := io.ReadFull(r.br, r.hdr[:1]); err != nil {
		return Frame{}, err // io.EOF at a frame boundary
	}
	t := Type(r.hdr[0])
	if !t.Valid() {
		return Frame{}, fmt.Errorf("%w %d", ErrUnknownType, r.hdr[0])
	}
	if _, err := io.ReadFull(r.br, r.hdr[1:]); err != nil {
		return Frame{}, unexpected(err)
	}
	n := binary.BigEndian.Uint32(r.hdr[1:])
	// Check the length against the type and the maximum before allocating.
	if empty, err := checkHeader(t, n, r.max); err != nil {
		return Frame{}, err
	} else if empty {
		return Frame{Type: t}, nil
	}
	p, err := r.readPayload(int(n))
	if err != nil {
		return Frame{}, err
	}
	return checkPayload(t, p)
}

// checkHeader checks a frame's length against its type and the maximum,
// before anything is allocated for the payload; empty reports a frame
// without one (complete with its header).
func checkHeader(t Type, n uint32, max int) (empty bool, err error) {
	switch t {
	case Kill:
		// An optional one-byte cause (the reason code of the cancellation).
		if n > 1 {
			return false, fmt.Errorf("%w: Kill with %d-byte payload", ErrBadPayload, n)
		}
		return n == 0, nil
	case Final, Stop, Heartbeat:
		if n != 0 {
			return false, fmt.Errorf("%w: %v with %d-byte payload", ErrBadPayload, t, n)
		}
		return true, nil
	case Credit:
		if n != CreditSize {
			return false, fmt.Errorf("%w: Credit with %d-byte payload", ErrBadPayload, n)
		}
	}
	if uint64(n) > uint64(max) {
		return false, fmt.Errorf("%w: %d bytes (max %d)", ErrTooLarge, n, max)
	}
	return false, nil
}

// checkPayload checks a payload against its type.
func checkPayload(t Type, p []byte) (Frame, error) {
	if (t == Error || t == Incomplete) && !utf8.Valid(p) {
		return Frame{}, fmt.Errorf("%w: Error message is not UTF-8", ErrBadPayload)
	}
	return Frame{Type: t, Payload: p}, nil
}

// Decode decodes the frame at the start of b, for input that arrives in
// pieces (a stream of a session, package transport). It returns the frame
// and how many bytes of b it took, or 0 and no error while b holds less than
// a whole frame; an invalid frame is refused as soon as its header is in,
// by the rules of ReadFrame, with max the largest payload (<= 0:
// DefaultMaxPayload). The payload is a fresh copy that belongs to the
// caller.
func Decode(b []byte, max int) (Frame, int, error) {
	if max <= 0 {
		max = DefaultMaxPayload
	}
	if len(b) == 0 {
		return Frame{}, 0, nil
	}
	t := Type(b[0])
	if !t.Valid() {
		return Frame{}, 0, fmt.Errorf("%w %d", ErrUnknownType, b[0])
	}
	if len(b) < HeaderSize {
		return Frame{}, 0, nil
	}
	n := binary.BigEndian.Uint32(b[1:HeaderSize])
	empty, err := checkHeader(t, n, max)
	if err != nil {
		return Frame{}, 0, err
	}
	if empty {
		return Frame{Type: t}, HeaderSize, nil
	}
	if len(b)-HeaderSize < int(n) {
		return Frame{}, 0, nil
	}
	f, err := checkPayload(t, append([]byte(nil), b[HeaderSize:HeaderSize+int(n)]...))
	if err != nil {
		return Frame{}, 0, err
	}
	return f, HeaderSize + int(n), nil
}

// readPayload reads n bytes into a new slice. Small payloads are allocated at
// once; large ones grow chunk by chunk as bytes arrive, so that a peer that
// announces 16 MiB and sends 10 bytes does not make us allocate 16 MiB.
func (r *Reader) readPayload(n int) ([]byte, error) {
	if n <= chunk {
		p := make([]byte, n)
		if _, err := io.ReadFull(r.br, p); err != nil {
			return nil, unexpected(err)
		}
		return p, nil
	}
	p := make([]byte, 0, chunk)
	for len(p) < n {
		step := min(n-len(p), chunk)
		if cap(p)-len(p) < step {
			// Double, but never past n: the final slice is exactly n.
			p2 := make([]byte, len(p), min(max(2*cap(p), len(p)+step), n))
			copy(p2, p)
			p = p2
		}
		m, err := io.ReadFull(r.br, p[len(p):len(p)+step])
		p = p[:len(p)+m]
		if err != nil {
			return nil, unexpected(err)
		}
	}
	return p, nil
}

// unexpected maps a clean EOF inside a frame to io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
