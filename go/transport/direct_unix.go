//go:build unix

package transport

import (
	"net"
	"syscall"
)

// directConn is c's raw connection, for the session's direct writes
// (session.flushDirect), or nil when c has no descriptor.
func directConn(c net.Conn) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// writeNow writes p with non-blocking writes until the socket would block,
// and says how much it took.
func (s *session) writeNow(p []byte) (int, error) {
	n := 0
	var werr error
	err := s.rawc.Write(func(fd uintptr) bool {
		for n < len(p) {
			k, e := syscall.Write(int(fd), p[n:])
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return true // the rest is the writer's: it waits for room
			case e != nil:
				werr = e
				return true
			case k <= 0:
				return true
			}
			n += k
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return n, err
}
