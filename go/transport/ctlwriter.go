package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// ErrPeerNotReading is what Recv returns when the worker left the caller's
// control frames unread for the idle timeout (or let more than
// maxCtlBacklog bytes of them pile up). It wraps ErrIncomplete.
var ErrPeerNotReading = fmt.Errorf("%w: the worker stopped reading the stream's control frames", ErrIncomplete)

// maxCtlBacklog bounds the control bytes a caller holds for a worker that
// does not read them: thousands of frames (a credit is 9 bytes), far more
// than a reading worker ever leaves behind.
const maxCtlBacklog = 64 << 10

var errCtlBacklog = errors.New("transport: control backlog full")

// ctlWriter is what a caller's control frames (credit, Stop, Kill,
// heartbeat) are written through. A Write never waits for the worker: the
// goroutine that writes is often a host's thread (a kill or a stop from an
// event loop), which must not block on a socket. What the socket takes at
// once is written at once; the rest waits, in order, in a backlog that a
// goroutine writes. A worker that leaves the backlog unwritten for the limit
// (the idle timeout), or lets it outgrow maxCtlBacklog, is treated as gone:
// fail runs once and every later Write fails.
type ctlWriter struct {
	conn  net.Conn
	raw   *rawWriter // nil when conn is not a socket: then Write blocks, as conn.Write does (mu)
	spawn func(func()) bool
	limit time.Duration
	fail  func()

	mu      sync.Mutex
	backlog []byte
	busy    chan struct{} // non-nil while a goroutine writes the backlog; closed when it stops
	err     error         // sticky: the connection failed
}

func newCtlWriter(c net.Conn, spawn func(func()) bool, limit time.Duration, fail func()) *ctlWriter {
	return &ctlWriter{conn: c, raw: newRawWriter(c), spawn: spawn, limit: limit, fail: fail}
}

// Write takes all of b or fails; it never waits for the peer to read.
func (w *ctlWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	if w.busy != nil { // behind the backlog, in order
		if len(w.backlog)+len(b) > maxCtlBacklog {
			w.failLocked(errCtlBacklog)
			return 0, w.err
		}
		w.backlog = append(w.backlog, b...)
		return len(b), nil
	}
	if w.raw == nil {
		return w.conn.Write(b)
	}
	n, err := w.raw.tryWrite(b)
	if err != nil {
		w.failLocked(err)
		return n, err
	}
	if n == len(b) {
		return n, nil
	}
	if len(b)-n > maxCtlBacklog {
		w.failLocked(errCtlBacklog)
		return 0, w.err
	}
	w.backlog = append(w.backlog[:0], b[n:]...)
	w.busy = make(chan struct{})
	if !w.spawn(w.drain) { // the Server is closing its connections
		close(w.busy)
		w.busy = nil
		w.failLocked(ErrServerClosed)
		return 0, w.err
	}
	return len(b), nil
}

// drain writes the backlog until it is empty, each write within the limit.
func (w *ctlWriter) drain() {
	for {
		w.mu.Lock()
		buf := w.backlog
		w.backlog = nil
		if len(buf) == 0 || w.err != nil {
			close(w.busy)
			w.busy = nil
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.limit))
		_, err := w.conn.Write(buf)
		_ = w.conn.SetWriteDeadline(time.Time{}) // before Write may write directly again
		if err != nil {
			w.mu.Lock()
			w.failLocked(err)
			w.mu.Unlock()
		}
	}
}

// failLocked makes err sticky and drops the backlog. Only a worker that does
// not read (a backlog past maxCtlBacklog, a drain past its deadline) is
// reported through fail: any other write error (a reset, a closed
// connection, a closing Server) is the reader's to find, after the frames
// that arrived before it (a worker's Final, then its reset).
func (w *ctlWriter) failLocked(err error) {
	if w.err != nil {
		return
	}
	w.err = err
	w.backlog = nil
	if err == errCtlBacklog || errors.Is(err, os.ErrDeadlineExceeded) {
		w.fail() // fails the reader: quick, and takes none of w's locks
	}
}

// flushed is closed once nothing waits in the backlog.
func (w *ctlWriter) flushed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.busy != nil {
		return w.busy
	}
	return closedChan
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
