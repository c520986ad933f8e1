//go:build !linux

package rawio

import (
	"net"
	"syscall"
)

// Wrap is c itself: raw calls are made on Linux only.
func Wrap(c net.Conn) net.Conn { return c }

// TryWrite writes what the socket fd takes of b now: the count, or the
// call's error (EAGAIN when full).
func TryWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), b)
	if err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return 0, e
		}
		return 0, syscall.EIO
	}
	return n, 0
}
