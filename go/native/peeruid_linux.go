package main

import (
	"net"
	"os"
	"syscall"
)

// ownerOnly accepts the connections of processes of this process's user
// only (the peer's credentials, SO_PEERCRED), closing any other at once:
// the engine-output socket's mode (0600) is set after it exists, and a
// permissive umask would leave a moment in which others could connect.
type ownerOnly struct{ net.Listener }

func (l ownerOnly) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || sameUser(c) {
			return c, err
		}
		_ = c.Close()
	}
}

func sameUser(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == uint32(os.Getuid())
}
