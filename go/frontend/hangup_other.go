//go:build !linux

package frontend

import "net"

// hangups: none here; net/http alone tells of a hang-up (hangup.go).
type hangups struct{}

func newHangups() *hangups { return nil }

func (h *hangups) watch(net.Conn, func()) func() { return func() {} }

func (h *hangups) close() {}

func (h *hangups) touch() {}
