package rawio_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is a connected TCP pair on loopback, both ends wrapped.
func pair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	client, server = rawio.Wrap(c), rawio.Wrap(s)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

func TestWrappedConnectionsCarryBytesBothWays(t *testing.T) {
	client, server := pair(t)
	// More than the sockets buffer: the writer waits for room in the poller.
	want := make([]byte, 8<<20)
	_, _ = rand.Read(want)
	done := make(chan error, 1)
	go func() {
		n, err := client.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	got := make([]byte, len(want))
	_, err := io.ReadFull(server, got)
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.True(t, bytes.Equal(want, got))

	_, err = server.Write([]byte("back"))
	require.NoError(t, err)
	buf := make([]byte, 16)
	n, err := client.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "back", string(buf[:n]))
	n, err = client.Read(nil)
	assert.NoError(t, err, "an empty read returns at once")
	assert.Zero(t, n)
}

func TestReadReturnsEOFWhenThePeerCloses(t *testing.T) {
	client, server := pair(t)
	require.NoError(t, client.Close())
	n, err := server.Read(make([]byte, 8))
	assert.Zero(t, n)
	assert.ErrorIs(t, err, io.EOF)
}

func TestDeadlinesAreKept(t *testing.T) {
	client, _ := pair(t)
	require.NoError(t, client.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	start := time.Now()
	_, err := client.Read(make([]byte, 8))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.Less(t, time.Since(start), 5*time.Second)

	// A writer that finds no room waits until its deadline, no longer.
	big := make([]byte, 32<<20)
	require.NoError(t, client.SetWriteDeadline(time.Now().Add(200*time.Millisecond)))
	n, err := client.Write(big)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Positive(t, n, "what the socket took is counted")
	assert.Less(t, n, len(big))
}

func TestCloseEndsABlockedReadAndLaterCalls(t *testing.T) {
	client, _ := pair(t)
	errs := make(chan error, 1)
	go func() {
		_, err := client.Read(make([]byte, 8))
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, client.Close())
	select {
	case err := <-errs:
		assert.ErrorIs(t, err, net.ErrClosed)
		var op *net.OpError
		require.ErrorAs(t, err, &op)
		assert.Equal(t, "read", op.Op, "net/http tells a closed connection's read by its Op")
	case <-time.After(5 * time.Second):
		t.Fatal("a read blocked across Close")
	}
	_, err := client.Write([]byte("x"))
	assert.ErrorIs(t, err, net.ErrClosed)
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	assert.Equal(t, "write", op.Op)
	_, err = client.Read(make([]byte, 1))
	assert.ErrorIs(t, err, net.ErrClosed)
}

func TestWriteToAResetPeerFailsAsNetDoes(t *testing.T) {
	client, server := pair(t)
	// Linger 0: the close sends a reset.
	require.NoError(t, server.(interface{ SetLinger(int) error }).SetLinger(0))
	require.NoError(t, server.Close())
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for err == nil && time.Now().Before(deadline) {
		_, err = client.Write([]byte("after the reset"))
		time.Sleep(time.Millisecond)
	}
	require.Error(t, err)
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	assert.Equal(t, "write", op.Op)
	assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE), "%v", err)
}

func TestWrapKeepsTheConnectionsOtherMethods(t *testing.T) {
	client, _ := pair(t)
	// net/http half-closes through CloseWrite; the frontend's hang-up
	// watcher takes the descriptor through SyscallConn.
	_, ok := client.(interface{ CloseWrite() error })
	assert.True(t, ok)
	_, ok = client.(syscall.Conn)
	assert.True(t, ok)

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.Same(t, a, rawio.Wrap(a), "neither TCP nor Unix: returned as it is")
}

func TestASocketOrdersWhatItCarries(t *testing.T) {
	// What one goroutine writes before it sends a byte, another sees after
	// it reads the byte: with -race, the detector must see that too.
	client, server := pair(t)
	var x int
	done := make(chan struct{})
	go func() {
		defer close(done)
		x = 1
		_, _ = client.Write([]byte{1})
	}()
	_, err := io.ReadFull(server, make([]byte, 1))
	require.NoError(t, err)
	assert.Equal(t, 1, x)
	<-done
}

func TestReadsAndWritesAllocateNothing(t *testing.T) {
	client, server := pair(t)
	msg, buf := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, buf); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

func TestUnixConnectionsAreWrappedToo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	client, server := rawio.Wrap(c), rawio.Wrap(s)
	defer client.Close()
	defer server.Close()
	assert.IsType(t, &rawio.UnixConn{}, client)
	_, err = client.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(server, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	require.NoError(t, server.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err = server.Read(buf)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "deadlines are kept")
	require.NoError(t, client.Close())
	require.NoError(t, server.SetReadDeadline(time.Time{}))
	_, err = server.Read(buf)
	assert.ErrorIs(t, err, io.EOF)
	_, ok := client.(syscall.Conn)
	assert.True(t, ok)
}
