//go:build linux

package natsbus

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The library must never write to the process's stdout or stderr, which
// belong to the host application (for the Python module, to the user). The
// descriptors themselves are redirected, so writes through any path count:
// os.Stderr, the log package, or a logger the server might set up.
func TestNothingWrittenToStdoutOrStderr(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "out")
	require.NoError(t, err)
	defer f.Close()
	saved := [2]int{}
	for i, fd := range []int{1, 2} {
		saved[i], err = syscall.Dup(fd)
		require.NoError(t, err)
		require.NoError(t, syscall.Dup3(int(f.Fd()), fd, 0))
	}
	var once sync.Once
	restore := func() {
		once.Do(func() {
			for i, fd := range []int{1, 2} {
				_ = syscall.Dup3(saved[i], fd, 0)
				_ = syscall.Close(saved[i])
			}
		})
	}
	defer restore()

	// Embed, join, lose the host, take over, close: every path that starts
	// or stops a server or fires a client callback. Client events go to the
	// Logger given (slog is the application's to route), so a discarding one
	// is used: anything left in the file came from somewhere else.
	url := "nats://127.0.0.1:" + freePort(t)
	host, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	client, err := Connect(context.Background(), Options{URL: url, EmbedIfAbsent: true, Logger: quiet})
	require.NoError(t, err)
	host.Close()
	require.Eventually(t, func() bool { return client.Embedded() && client.Conn().IsConnected() },
		5*time.Second, 10*time.Millisecond)
	client.Close()
	eph, err := Connect(context.Background(), Options{URL: "nats://127.0.0.1:0", Logger: quiet})
	require.NoError(t, err)
	eph.Close()

	restore()
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	assert.Empty(t, string(out))
}
