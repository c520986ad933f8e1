//go:build linux && race

package rawio

import "syscall"

// Under the race detector the ordinary calls: they tell it that what one
// goroutine wrote to a socket happens before another's read of it (raw
// calls do not, and it would report races that are not there).

// sysRead is read(2) on a non-empty b.
func sysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	return errno(syscall.Read(int(fd), b))
}

// sysWrite is write(2) of a non-empty b.
func sysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
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
