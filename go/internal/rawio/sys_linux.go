//go:build linux && !race

package rawio

import (
	"syscall"
	"unsafe"
)

// sysRead is read(2) on a non-empty b, raw.
func sysRead(fd uintptr, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// sysWrite is write(2) of a non-empty b, raw.
func sysWrite(fd uintptr, b []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}
