//go:build linux

package rawio

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// Conn is a TCP connection whose Read and Write make raw system calls and
// wait in Go's network poller. Every other method is the connection's
// own (CloseWrite, SyscallConn, ReadFrom, ...). A read or a write
// allocates nothing: each direction keeps its call's state, under its own
// lock (net.Conn's methods may be called concurrently).
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
	r  direction
	w  direction
}

// direction is the state of one direction's call, and its callback made
// once.
type direction struct {
	mu    sync.Mutex
	fn    func(fd uintptr) bool
	b     []byte
	n     int
	errno syscall.Errno
}

// UnixConn is Conn for a Unix stream connection.
type UnixConn struct {
	*net.UnixConn
	rc syscall.RawConn
	r  direction
	w  direction
}

// Wrap is c as a Conn when it is a TCP connection, as a UnixConn when it
// is a Unix one, else c itself.
func Wrap(c net.Conn) net.Conn {
	switch tc := c.(type) {
	case *net.TCPConn:
		rc, err := tc.SyscallConn()
		if err != nil {
			return c
		}
		w := &Conn{TCPConn: tc, rc: rc}
		w.r.fn, w.w.fn = w.r.read, w.w.write
		return w
	case *net.UnixConn:
		rc, err := tc.SyscallConn()
		if err != nil {
			return c
		}
		w := &UnixConn{UnixConn: tc, rc: rc}
		w.r.fn, w.w.fn = w.r.read, w.w.write
		return w
	}
	return c
}

// Read is net.Conn's Read, as Conn's.
func (c *UnixConn) Read(b []byte) (int, error) { return read(c, c.rc, &c.r, b) }

// Write is net.Conn's Write, as Conn's.
func (c *UnixConn) Write(b []byte) (int, error) { return write(c, c.rc, &c.w, b) }

// Read is net.Conn's Read: it waits (within the read deadline) until
// there is something to read, the peer's end (io.EOF) or an error.
func (c *Conn) Read(b []byte) (int, error) { return read(c, c.rc, &c.r, b) }

// read is a Read of connection c (its RawConn rc, its read direction d).
func read(c net.Conn, rc syscall.RawConn, d *direction, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, errno, err := call(rc, d, b, false)
	switch {
	case err != nil:
		return 0, netOp(err, "read") // closed, or past the deadline
	case errno != 0:
		return 0, opError(c, "read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// call runs direction d's callback on b in the poller (RawConn's Write
// when write, else its Read): what it did, its errno, and the poller's
// error (closed, past the deadline).
func call(rc syscall.RawConn, d *direction, b []byte, write bool) (int, syscall.Errno, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.b, d.n, d.errno = b, 0, 0
	var err error
	if write {
		err = rc.Write(d.fn)
	} else {
		err = rc.Read(d.fn)
	}
	d.b = nil
	return d.n, d.errno, err
}

// read is a Read's callback: false to wait for readiness.
func (d *direction) read(fd uintptr) bool {
	for {
		n, e := sysRead(fd, d.b)
		switch e {
		case 0:
			d.n = n
			return true
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false // wait for something to read
		default:
			d.errno = e
			return true
		}
	}
}

// Write is net.Conn's Write: all of b, waiting (within the write
// deadline) for room, or an error with what was written.
func (c *Conn) Write(b []byte) (int, error) { return write(c, c.rc, &c.w, b) }

// write is a Write of connection c (its RawConn rc, its write direction d).
func write(c net.Conn, rc syscall.RawConn, d *direction, b []byte) (int, error) {
	n, errno, err := call(rc, d, b, true)
	if err != nil {
		return n, netOp(err, "write")
	}
	if errno != 0 {
		return n, opError(c, "write", errno)
	}
	return n, nil
}

// write is a Write's callback: false to wait for room.
func (d *direction) write(fd uintptr) bool {
	m, e := TryWriteAll(fd, d.b[d.n:])
	d.n += m
	switch {
	case e != 0 && e != syscall.EAGAIN:
		d.errno = e
		return true
	case d.n < len(d.b):
		return false // full (EAGAIN, or a write that took nothing): wait for room
	}
	return true
}

// netOp is err from a RawConn with the operation a net.Conn names
// ("read", not "raw-read"): net/http tells a closed connection's read
// by it.
func netOp(err error, op string) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "raw-"+op {
		c := *oe
		c.Op = op
		return &c
	}
	return err
}

// TryRead reads what fd holds now into b, with one raw read(2): the count,
// or the call's error (EAGAIN when empty).
func TryRead(fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	return sysRead(fd, b)
}

// TryWrite writes what the socket fd takes of b now, with one raw
// write(2): the count, or the call's error (EAGAIN when full).
func TryWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	return sysWrite(fd, b)
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

// Readable reports whether fd is readable now (ppoll(2) with a zero
// timeout, raw): for a descriptor whose readiness Go's poller may not
// have recorded.
func Readable(fd uintptr) bool {
	pfd := struct {
		fd             int32
		events, revent int16
	}{fd: int32(fd), events: 0x1} // POLLIN
	var zero syscall.Timespec
	n, _, e := syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	return e == 0 && n == 1 && pfd.revent&0x1 != 0
}

// EpollCtl is epoll_ctl(2), raw (it never waits).
func EpollCtl(epfd, op, fd int, ev *syscall.EpollEvent) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return e
}
