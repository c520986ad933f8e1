//go:build !linux

package main

import "net"

// ownerOnly leaves the listener as it is where the peer's credentials are
// not read this way: the socket's mode (0600) is the only guard.
type ownerOnly struct{ net.Listener }
