// Package rawio reads and writes sockets with raw system calls: calls the
// Go runtime does not account as system calls.
//
// Why: every system call a goroutine makes the ordinary way (syscall.Read,
// a net.Conn's Read or Write, syscall.EpollWait) tells the runtime it
// enters a system call, and that wakes the runtime's monitor thread
// (sysmon) from its deep sleep, which then polls every 20 us for as long
// as any P is busy. A process that idles between bursts of work (a
// frontend between an engine's steps, some 60 bursts a second) paid that
// at every burst: about half of its thread switches. A call that never
// blocks (a non-blocking socket's read or write, an epoll_wait with no
// timeout) needs none of that bookkeeping: a raw call is as cheap for the
// scheduler as any other instruction. Waiting for a socket to be ready
// is still done by Go's network poller (syscall.RawConn), with the
// connection's deadlines.
//
// On systems other than Linux, Wrap returns its connection and TryWrite
// makes the ordinary call; under the race detector, reads and writes are
// the ordinary calls too (they tell the detector what a socket orders).
package rawio

import (
	"net"
	"os"
	"syscall"
)

// opError is err as a TCP connection's method reports it (net.OpError
// around an os.SyscallError), so callers see the errors of net.Conn.
func opError(c net.Conn, op string, err error) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError(op, err)}
}

// TryWriteAll writes what the socket fd takes of b now, retrying
// interrupted writes, and never waits: the count, and the error that
// stopped it (EAGAIN when the socket is full; 0 when all of b went, or a
// write took nothing).
func TryWriteAll(fd uintptr, b []byte) (int, syscall.Errno) {
	n := 0
	for n < len(b) {
		m, e := TryWrite(fd, b[n:])
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return n, e
		case m <= 0:
			return n, 0
		}
		n += m
	}
	return n, 0
}
