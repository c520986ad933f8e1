//go:build linux

// Package wake provides a FIFO queue whose readiness is signalled through a
// file descriptor, so that Go code can hand values to a foreign event loop
// (Python asyncio's loop.add_reader, or any poll/select loop) without ever
// calling into that loop's runtime.
//
// A Queue guarantees:
//
//   - Readiness: Fd is readable exactly when the queue holds at least one
//     value, whenever no Push or Drain is mid-call, however they interleave;
//     so a wake-up is never lost and a spurious one never persists.
//   - Bounded signalling: at most one byte is ever pending in the pipe, so
//     Push never blocks and never fails because the pipe is full.
//   - Order: values are returned by Drain in the order their Pushes took the
//     queue's lock.
//   - Safety: Push, Drain, Len, Fd and Close may be called from any goroutine
//     or thread, concurrently.
//   - Closing: after Close, Push returns ErrClosed, Drain returns 0, false,
//     and both descriptors are released. Close is idempotent.
//
// The pipe is never wrapped in an os.File, so Go's netpoller never registers
// the descriptor: the foreign loop is its only watcher.
package wake

import (
	"errors"
	"sync"
	"syscall"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// ErrClosed is returned by Push after Close.
var ErrClosed = errors.New("wake: queue closed")

// Queue is a FIFO queue of values of type T with a readiness descriptor.
// The zero value is not usable; create one with New.
type Queue[T any] struct {
	mu sync.Mutex
	// buf[head:] holds the queued values; head lets Drain pop from the front
	// without shifting, and Push compacts when the dead prefix dominates.
	buf  []T
	head int
	// signaled records that a byte is (or is about to be) in the pipe. It
	// changes only under mu, together with the emptiness of buf, so the pipe
	// holds a byte if and only if the queue is non-empty.
	signaled bool
	closed   bool
	rfd, wfd int
}

// New creates an empty Queue backed by a non-blocking, close-on-exec pipe.
// Non-blocking so that neither Push nor Drain can ever stall on the pipe;
// close-on-exec so that child processes do not inherit it.
func New[T any]() (*Queue[T], error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	return &Queue[T]{rfd: p[0], wfd: p[1]}, nil
}

// Fd returns the read end of the pipe, for registration with an event loop.
// The caller must not read from, write to, or close it; Drain reads it.
// After Close the number is stale and may have been reused by the process.
func (q *Queue[T]) Fd() int {
	return q.rfd
}

// Push appends v to the queue. It never blocks on I/O: the only system call
// is one write on the empty-to-non-empty transition, into a pipe that holds
// at most that one byte.
func (q *Queue[T]) Push(v T) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	// Reclaim the drained prefix once it is at least half the backing array,
	// so a queue that never fully empties does not grow without bound.
	if q.head > 0 && q.head >= len(q.buf)-q.head {
		n := copy(q.buf, q.buf[q.head:])
		clear(q.buf[n:]) // release references held by the stale tail
		q.buf = q.buf[:n]
		q.head = 0
	}
	q.buf = append(q.buf, v)
	if q.signaled {
		return nil
	}
	if err := q.signal(); err != nil {
		// Undo the append so a failed Push leaves no value the reader would
		// never be woken for.
		var zero T
		q.buf[len(q.buf)-1] = zero
		q.buf = q.buf[:len(q.buf)-1]
		return err
	}
	q.signaled = true
	return nil
}

// signal writes the wake-up byte. Caller holds mu.
func (q *Queue[T]) signal() error {
	// A full pipe (unreachable while the one-byte invariant holds) is
	// readable already: the wake-up is delivered either way.
	_, err := write(q.wfd, []byte{1})
	return err
}

// write writes b to the non-blocking descriptor fd in one system call,
// retried when interrupted; full reports that the pipe had no room (EAGAIN),
// and b was not written. A raw call (go/internal/rawio): a write that never
// blocks needs none of the runtime's system-call bookkeeping, which would
// wake its monitor thread from its deep sleep when the process idled. b is
// at most 8 bytes, which a pipe takes whole or not at all.
func write(fd int, b []byte) (full bool, err error) {
	switch _, errno := rawio.TryWriteAll(uintptr(fd), b); errno {
	case 0:
		return false, nil
	case syscall.EAGAIN:
		return true, nil
	default:
		return false, errno
	}
}

// Drain moves up to len(dst) values from the front of the queue into dst and
// returns how many it moved and whether values remain. When it empties the
// queue it also empties the pipe, under the same lock as Push, so Fd is
// unreadable exactly when the queue is empty. When values remain Fd stays
// readable, so a level-triggered loop will call back for the rest.
func (q *Queue[T]) Drain(dst []T) (n int, more bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, false
	}
	n = copy(dst, q.buf[q.head:])
	// Zero the moved slots so the queue does not keep values alive.
	clear(q.buf[q.head : q.head+n])
	q.head += n
	if q.head < len(q.buf) {
		return n, true
	}
	// Empty: reuse the backing array from the start.
	q.buf = q.buf[:0]
	q.head = 0
	if q.signaled {
		q.unsignal()
		q.signaled = false
	}
	return n, false
}

// unsignal reads the pipe until it is empty. Caller holds mu. It reads
// until empty rather than exactly one byte so that the descriptor cannot
// stay readable forever should a stray byte ever get in.
func (q *Queue[T]) unsignal() {
	var b [64]byte
	for {
		n, errno := rawio.TryRead(uintptr(q.rfd), b[:]) // raw, as write's
		if errno == syscall.EINTR {
			continue
		}
		// A pipe read returns everything available up to len(b), and no one
		// can write while we hold mu, so a short read means the pipe is
		// empty: stop without paying for a second read that would return
		// EAGAIN. EAGAIN itself means empty too. Other errors and EOF cannot
		// occur on our own open descriptor and could not be acted on here.
		if errno != 0 || n < len(b) {
			return
		}
	}
}

// Peek returns the oldest value without removing it; ok is false when the
// queue is empty (or closed). The fd's readiness is unchanged.
func (q *Queue[T]) Peek() (v T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.buf) == q.head {
		return v, false
	}
	return q.buf[q.head], true
}

// Len returns the number of values currently queued.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.buf) - q.head
}

// Close releases both descriptors and drops any queued values. It is
// idempotent; calls after the first return nil. The caller should unregister
// Fd from its event loop first, since the number may be reused afterwards.
func (q *Queue[T]) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	q.buf, q.head, q.signaled = nil, 0, false
	// Close both even if the first fails, so neither descriptor leaks.
	return errors.Join(syscall.Close(q.wfd), syscall.Close(q.rfd))
}
