//go:build !unix

package transport

import (
	"net"
	"syscall"
)

// directConn: no direct writes here; the session's writer writes
// everything.
func directConn(net.Conn) syscall.RawConn { return nil }

// writeNow is never called without a raw connection.
func (s *session) writeNow(p []byte) (int, error) { return 0, nil }
