package rawio

import (
	"io"
	"net"
	"sync"
	"syscall"
)

// Queue writes a socket's (or a pipe's) bytes for callers that must never
// wait (a reader's goroutine that other streams wait on, a Kill's): Write
// writes what the socket takes at once, with a raw write, while nothing is
// queued before it, and queues the rest for the Queue's writer, a goroutine
// that waits for room. Bytes go out in the order written. The queue is not
// bounded: its user bounds what it writes. Once the socket fails, or once
// Close, nothing more is written and what was queued is dropped.
type Queue struct {
	c      io.WriteCloser
	raw    syscall.RawConn // nil: every write is queued
	failed func()          // NewQueue's, run once when the socket fails

	mu      sync.Mutex
	out     []byte
	writing bool // the writer holds bytes taken from out
	broken  bool // the socket failed, or Close: nothing more goes
	closed  bool // Close ran
	kick    chan struct{}
	done    chan struct{} // closed when the writer returned
}

// NewQueue starts c's Queue: a connection, or a pipe's write end in Go's
// network poller (an *os.File of a non-blocking descriptor). raw is c's
// descriptor (from its SyscallConn); nil has every write queued. failed,
// when not nil, runs once when a write to c fails (outside the Queue's
// lock), not on Close. Closing c must end a Write of c's that waits.
func NewQueue(c io.WriteCloser, raw syscall.RawConn, failed func()) *Queue {
	q := &Queue{c: c, raw: raw, failed: failed, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go q.write()
	return q
}

// Write writes or queues all of b, never waiting (it keeps no reference to
// b); net.ErrClosed, with nothing of b kept, once the socket failed or the
// Queue was closed.
func (q *Queue) Write(b []byte) (int, error) {
	q.mu.Lock()
	if q.broken {
		q.mu.Unlock()
		return 0, net.ErrClosed
	}
	if len(q.out) > 0 || q.writing || q.raw == nil {
		q.out = append(q.out, b...)
		q.poke()
		q.mu.Unlock()
		return len(b), nil
	}
	n := 0
	var errno syscall.Errno
	err := q.raw.Write(func(fd uintptr) bool {
		n, errno = TryWriteAll(fd, b) // raw: no runtime bookkeeping (the package's doc)
		return true
	})
	if err != nil || (errno != 0 && errno != syscall.EAGAIN) {
		q.broken = true
		q.mu.Unlock()
		q.fail()
		return 0, net.ErrClosed
	}
	if n < len(b) {
		q.out = append(q.out, b[n:]...)
		q.poke()
	}
	q.mu.Unlock()
	return len(b), nil
}

// Failed reports whether a write to the socket failed, or Close ran:
// nothing more goes.
func (q *Queue) Failed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.broken
}

// poke tells the writer that out has bytes (mu held, not broken: Close
// closes kick under mu once broken).
func (q *Queue) poke() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *Queue) fail() {
	if q.failed != nil {
		q.failed()
	}
}

// Close drops what is queued, closes c and returns once the writer did;
// nothing is written after it. Idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		<-q.done
		return
	}
	q.closed, q.broken, q.out = true, true, nil
	close(q.kick)
	q.mu.Unlock()
	_ = q.c.Close() // a writer waiting for room returns
	<-q.done
}

// keptBuffer is the largest queue buffer the writer keeps once drained
// (a burst's goes back to the garbage collector).
const keptBuffer = 1 << 20

// write writes what Write queued, waiting for the socket as it must,
// until Close.
func (q *Queue) write() {
	defer close(q.done)
	var buf []byte
	for range q.kick {
		for {
			q.mu.Lock()
			if len(q.out) == 0 || q.broken {
				q.writing = false
				q.mu.Unlock()
				if cap(buf) > keptBuffer {
					buf = nil
				}
				break
			}
			buf, q.out = q.out, buf[:0]
			if cap(q.out) > keptBuffer {
				q.out = nil
			}
			q.writing = true
			q.mu.Unlock()
			if _, err := q.c.Write(buf); err != nil {
				q.mu.Lock()
				closing := q.closed // Close closed c under the write: not a failure
				q.broken, q.out, q.writing = true, nil, false
				q.mu.Unlock()
				if !closing {
					q.fail()
				}
				break
			}
		}
	}
}
