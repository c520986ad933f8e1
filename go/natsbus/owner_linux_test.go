package natsbus

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ownerOf finds the server's end of a loopback connection, whether the
// listener is IPv4, IPv6, or dual-stack (the IPv4 client then appears in
// /proc/net/tcp6 as an IPv4-mapped address), and reports its user.
func TestOwnerOfLoopbackConnection(t *testing.T) {
	for _, tc := range []struct{ listen, dial string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"[::1]:0", "::1"},
		{"[::]:0", "127.0.0.1"},
	} {
		l, err := net.Listen("tcp", tc.listen)
		if err != nil {
			t.Logf("%s: %v (skipped)", tc.listen, err)
			continue
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		c, err := net.Dial("tcp", net.JoinHostPort(tc.dial, port))
		require.NoError(t, err)
		uid, known, err := ownerOf(c) // before the listener even accepts
		require.NoError(t, err, tc.listen)
		assert.True(t, known, tc.listen)
		assert.Equal(t, os.Getuid(), uid, tc.listen)
		c.Close()
		l.Close()
	}
}
