package transport

import (
	"net"
	"syscall"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// rawWriter writes to a socket what it takes now, never waiting for room:
// for writes made on a thread that must not block (often the host's: a
// Kill from an event loop), the rest being left to a goroutine that may
// wait. Its calls must not overlap (its user's lock, or its one writer at
// a time); a write allocates nothing.
type rawWriter struct {
	raw syscall.RawConn
	fn  func(uintptr) bool // w.write, made once
	b   []byte
	n   int
	err error
}

// newRawWriter is c's, or nil when c is not a socket.
func newRawWriter(c net.Conn) *rawWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &rawWriter{raw: raw}
	w.fn = w.write
	return w
}

// tryWrite writes what the socket takes of b now, and says how much.
func (w *rawWriter) tryWrite(b []byte) (int, error) {
	w.b, w.n, w.err = b, 0, nil
	rerr := w.raw.Write(w.fn)
	n, err := w.n, w.err
	w.b, w.err = nil, nil
	if err == nil {
		err = rerr
	}
	return n, err
}

// write is tryWrite's callback: it writes what the socket takes of w.b.
func (w *rawWriter) write(fd uintptr) bool {
	m, e := rawio.TryWriteAll(fd, w.b[w.n:])
	w.n += m
	if e != 0 && e != syscall.EAGAIN {
		w.err = e
	}
	return true // done either way: never wait here
}
