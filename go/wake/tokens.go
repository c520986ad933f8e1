//go:build linux

package wake

import (
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// TokenQueue is a FIFO of 64-bit tokens carried in its pipe: each Push
// writes the token's 8 bytes (native byte order), so that the foreign loop
// learns its tokens by reading the descriptor, without calling into Go
// (which, from a thread that is not Go's, first waits for a P: the cost an
// event loop's wake-up paid on every kill). A token that does not fit (the
// pipe is full) waits in memory, and so does every later one until Drain has
// taken them, so that order is kept.
//
// It guarantees:
//
//   - Order: tokens are read (from the pipe, then by Drain) in the order their
//     Pushes took the queue's lock.
//   - Readiness: Fd is readable while tokens are in the pipe; while tokens
//     wait in memory the pipe is full, hence readable, until a reader empties
//     it. A reader that reads the pipe itself must call Drain when, since it
//     last found the pipe empty, it read more than DrainAfter bytes: only
//     then can tokens be waiting in memory.
//   - Push never blocks (the pipe is non-blocking) and writes nothing while
//     tokens wait in memory.
//   - Safety: every method may be called from any goroutine or thread.
//   - Capture: while a Capture is open, Push hands tokens to it instead of
//     the pipe; its end returns them, in Push order, and whoever opened it
//     delivers them. They are not ordered with tokens pushed before it.
//   - Closing: after Close, Push returns ErrClosed, Drain returns 0, false, and
//     both descriptors are released. Close is idempotent.
type TokenQueue struct {
	mu       sync.Mutex
	over     []uint64 // tokens that did not fit in the pipe, oldest first
	caught   []uint64 // tokens pushed while a Capture is open
	catching bool     // a Capture is open
	closed   bool
	rfd, wfd int
	capacity int // the pipe's capacity in bytes
}

// tokenPipeSize is the capacity asked for the pipe: Linux's default, set
// explicitly so that systems with larger pages or another default behave
// alike (the request may be refused, e.g. past the user's pipe quota: the
// capacity is then what the kernel gave).
const tokenPipeSize = 64 << 10

// NewTokenQueue creates an empty TokenQueue backed by a non-blocking,
// close-on-exec pipe.
func NewTokenQueue() (*TokenQueue, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	_, _ = fcntl(p[1], syscall.F_SETPIPE_SZ, tokenPipeSize)
	capacity, err := fcntl(p[1], syscall.F_GETPIPE_SZ, 0)
	if err != nil {
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, err
	}
	return &TokenQueue{rfd: p[0], wfd: p[1], capacity: capacity}, nil
}

func fcntl(fd, cmd, arg int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), uintptr(arg))
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// Fd returns the read end of the pipe. A reader may read whole tokens from it
// (reads of a multiple of 8 bytes return a multiple of 8), keeping to the
// rule of DrainAfter. After Close the number is stale.
func (q *TokenQueue) Fd() int { return q.rfd }

// DrainAfter is the rule for a reader that reads the pipe itself: when it
// read more than this many bytes since it last found the pipe empty, tokens
// may wait in memory and it must call Drain. A Push finds the pipe full only
// when every page of the pipe is in use and the last one is full, so when it
// holds more than its capacity minus a page; all of that is read before the
// reader finds the pipe empty again. At most 0 (a one-page pipe): after any
// read.
func (q *TokenQueue) DrainAfter() int { return q.capacity - os.Getpagesize() }

// Push appends tok: into the pipe (one write of 8 bytes, which the pipe takes
// whole or refuses), or into memory when the pipe is full or tokens already
// wait there.
func (q *TokenQueue) Push(tok uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ErrClosed
	}
	if q.catching {
		q.caught = append(q.caught, tok)
		return nil
	}
	if len(q.over) > 0 {
		q.over = append(q.over, tok)
		return nil
	}
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], tok)
	full, err := write(q.wfd, b[:]) // 8 bytes: the pipe takes them whole or refuses
	if full {
		q.over = append(q.over, tok)
	}
	return err
}

// Capture makes Push keep tokens for the returned end function instead of
// writing them to the pipe, until end is called; end returns them, oldest
// first (nil for none), and the caller must deliver them (or Push them
// again). It is for a reader that pushes tokens to its own queue from its own
// thread (a cancel made by the event loop that reads this queue): they reach
// it without a write and a read of the pipe. Only one Capture is open at a
// time: a Capture made while another is open catches nothing (its end
// returns nil; the open one gets the tokens). After Close, end returns nil;
// a second call of end returns nil and ends nothing.
func (q *TokenQueue) Capture() (end func() []uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.catching || q.closed {
		return func() []uint64 { return nil }
	}
	q.catching = true
	ended := false
	return func() []uint64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		if ended {
			return nil // a later capture is not this one's to end
		}
		ended = true
		caught := q.caught
		q.caught, q.catching = nil, false
		if q.closed {
			return nil
		}
		return caught
	}
}

// Drain moves up to len(dst) tokens, oldest first, into dst: those in the
// pipe, then those waiting in memory. more reports that dst was filled (there
// may be more; a reader calls again).
func (q *TokenQueue) Drain(dst []uint64) (n int, more bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(dst) == 0 {
		return 0, false
	}
	for n < len(dst) {
		buf := unsafe.Slice((*byte)(unsafe.Pointer(&dst[n])), (len(dst)-n)*8)
		r, errno := rawio.TryRead(uintptr(q.rfd), buf) // raw, as write's (wake.go)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 || r <= 0 {
			break // EAGAIN: the pipe is empty
		}
		n += r / 8 // tokens are written whole, so read whole
		if r < len(buf) {
			break // short: the pipe is empty (Push waits for the lock we hold)
		}
	}
	if n < len(dst) && len(q.over) > 0 {
		m := copy(dst[n:], q.over)
		n += m
		clear(q.over[:m])
		q.over = q.over[m:]
		if len(q.over) == 0 {
			q.over = nil // Push writes to the pipe again
		}
	}
	return n, n == len(dst)
}

// Close releases both descriptors and drops the queued tokens. It is
// idempotent. The caller should unregister Fd from its event loop first.
func (q *TokenQueue) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.closed = true
	q.over, q.caught = nil, nil
	return errors.Join(syscall.Close(q.wfd), syscall.Close(q.rfd))
}
