package frontend

import (
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pair returns the server's side of a loopback TCP connection, wrapped as
// the listener wraps it, and the client's side.
func pair(t *testing.T) (*clientConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return &clientConn{Conn: server}, client
}

func TestClientGoneRunsOnTheReadThatSeesIt(t *testing.T) {
	c, client := pair(t)
	var calls atomic.Int32
	stop := c.onGone(func() { calls.Add(1) })
	defer stop()
	require.NoError(t, client.Close())
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	// Run before Read returned: the reading goroutine is the one that learns it.
	assert.Equal(t, int32(1), calls.Load())
}

func TestClientGoneIgnoresDataAndDeadlines(t *testing.T) {
	c, client := pair(t)
	var calls atomic.Int32
	stop := c.onGone(func() { calls.Add(1) })
	defer stop()
	// A pipelined byte is not a disconnect.
	_, err := client.Write([]byte("x"))
	require.NoError(t, err)
	n, err := c.Read(make([]byte, 1))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	// Nor is a deadline: net/http ends its read ahead with one after a response.
	require.NoError(t, c.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.Equal(t, int32(0), calls.Load())
}

func TestClientGoneStopsWithItsRequest(t *testing.T) {
	c, client := pair(t)
	var first, second atomic.Int32
	c.onGone(func() { first.Add(1) })()
	stop := c.onGone(func() { second.Add(1) })
	stop()
	stop() // idempotent
	require.NoError(t, client.Close())
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.Equal(t, int32(0), first.Load())
	assert.Equal(t, int32(0), second.Load())
}

func TestOldStopLeavesTheNextRequestsHandler(t *testing.T) {
	c, client := pair(t)
	stopOld := c.onGone(func() {})
	var calls atomic.Int32
	stopNew := c.onGone(func() { calls.Add(1) })
	defer stopNew()
	stopOld() // a late stop of the previous request must not remove this one's
	require.NoError(t, client.Close())
	_, _ = c.Read(make([]byte, 1))
	assert.Equal(t, int32(1), calls.Load())
}

func TestClientConnClosesWriteSideFirst(t *testing.T) {
	c, client := pair(t)
	require.NoError(t, c.CloseWrite())
	// The client reads EOF while the connection is still open for reading.
	_, err := client.Read(make([]byte, 1))
	assert.Error(t, err)
	_, err = client.Write([]byte("still open"))
	assert.NoError(t, err)
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "still open", string(buf[:n]))
}

func TestOnClientGoneWithoutTheListenersConnIsANoOp(t *testing.T) {
	r, err := http.NewRequest(http.MethodGet, "http://x/", nil)
	require.NoError(t, err)
	onClientGone(r, func() { t.Fatal("called") })()
}
