package natsbus

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// ErrForeignServer means that the NATS server answering at a loopback
// address runs as another user of the machine: a process of that user bound
// the address first (or while the user's embedded host was being replaced),
// so it must be sent neither the user's token nor any request.
var ErrForeignServer = errors.New("the NATS server at this address runs as another user")

// ownerDialer dials like net.Dialer, then checks that the listening end of
// the new connection belongs to this user (see ownerOf); nats.go then reads
// the server's INFO and sends its CONNECT line, with the token, only to a
// server that passed. It is used for loopback addresses reached without
// explicit credentials: those where the user's own embedded server is
// expected, and the token file's token is presented.
type ownerDialer struct {
	timeout time.Duration
	refused func(uid int) // called when a server of another user was refused
}

func (d ownerDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, d.timeout)
	if err != nil {
		return nil, err
	}
	uid, known, err := ownerOf(c)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("natsbus: cannot tell who serves %s: %w", address, err)
	}
	if known && uid != os.Getuid() {
		_ = c.Close()
		if d.refused != nil {
			d.refused(uid)
		}
		return nil, fmt.Errorf("%w (%s: uid %d)", ErrForeignServer, address, uid)
	}
	return c, nil
}

// isLoopback reports whether host names the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
