//go:build linux

package rawio

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose Read and Write make raw system calls and
// wait in Go's network poller. Every other method is the connection's
// own (CloseWrite, SyscallConn, ReadFrom, ...).
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// Wrap is c as a Conn when it is a TCP connection, else c itself.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{TCPConn: tc, rc: rc}
}

// Read is net.Conn's Read: it waits (within the read deadline) until
// there is something to read, the peer's end (io.EOF) or an error.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			switch e {
			case 0:
				n = int(r)
				return true
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait in the poller
			default:
				errno = e
				return true
			}
		}
	})
	switch {
	case err != nil:
		return 0, err // closed, or past the deadline: net's own error
	case errno != 0:
		return 0, opError(c, "read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write is net.Conn's Write: all of b, waiting (within the write
// deadline) for room, or an error with what was written.
func (c *Conn) Write(b []byte) (int, error) {
	n := 0
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, e := TryWrite(fd, b[n:])
			switch e {
			case 0:
				n += m
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait in the poller
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = opError(c, "write", errno)
	}
	return n, err
}

// TryWrite writes what the socket fd takes of b now, with one raw
// write(2): the count, or the call's error (EAGAIN when full).
func TryWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// EpollWait reads the ready events of the epoll set epfd into events
// without waiting (epoll_pwait(2) with a zero timeout, raw).
func EpollWait(epfd int, events []syscall.EpollEvent) (int, syscall.Errno) {
	if len(events) == 0 {
		return 0, 0
	}
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// EpollCtl is epoll_ctl(2), raw (it never waits).
func EpollCtl(epfd, op, fd int, ev *syscall.EpollEvent) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return e
}
