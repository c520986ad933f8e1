package natsbus

// Server addresses: a URL's host and port, the default address, URLs with
// credentials (kept out of messages), and timeouts of a dial.

import (
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
)

// splitAddr returns the host and port of a single-server URL, and false for
// a server list or an address it cannot parse (which is then only dialed).
func splitAddr(raw string) (host, port string, ok bool) {
	if strings.Contains(raw, ",") {
		return "", "", false
	}
	s := raw
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "nats" || u.Hostname() == "" {
		return "", "", false
	}
	port = u.Port()
	if port == "" {
		port = "4222"
	}
	return u.Hostname(), port, true
}

// isDefault reports whether host:port is DefaultURL's address.
func isDefault(host, port string) bool {
	dh, dp, _ := splitAddr(DefaultURL)
	return host == dh && port == dp
}

// redact hides credentials embedded in a URL before it appears in an error.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// urlHasUser reports whether a server URL carries credentials (user,
// user:password or a token) in its user part.
func urlHasUser(raw string) bool {
	for _, one := range strings.Split(raw, ",") {
		if u, err := url.Parse(strings.TrimSpace(one)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, nats.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
}
