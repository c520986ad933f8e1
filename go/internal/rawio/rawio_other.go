//go:build !linux

package rawio

import (
	"net"
	"syscall"
)

// Wrap is c itself: raw calls are made on Linux only.
func Wrap(c net.Conn) net.Conn { return c }

// TryRead reads what fd holds now into b: the count, or the call's error
// (EAGAIN when empty).
func TryRead(fd uintptr, b []byte) (int, syscall.Errno) {
	return errno(syscall.Read(int(fd), b))
}

// TryWrite writes what the socket fd takes of b now: the count, or the
// call's error (EAGAIN when full).
func TryWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	return errno(syscall.Write(int(fd), b))
}

func errno(n int, err error) (int, syscall.Errno) {
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return 0, e
		}
		return 0, syscall.EIO
	}
	return n, 0
}
