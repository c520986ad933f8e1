package natsbus

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
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
// expected, and the token file's token is presented. Its connections are
// raw, as rawDialer's.
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
	return rawio.Wrap(c), nil
}

// rawDialer dials like net.Dialer and reads and writes the connection with
// raw system calls (rawio's doc says why: an ordinary call wakes the
// runtime's monitor thread from its deep sleep). A request's envelope
// crosses the NATS connection on both sides, so each request woke it
// there. nats.go adds TLS over it where asked.
type rawDialer struct{ timeout time.Duration }

func (d rawDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, d.timeout)
	if err != nil {
		return nil, err
	}
	return rawio.Wrap(c), nil
}

// isLoopback reports whether host names the loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
