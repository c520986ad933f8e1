package listener_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/listener"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 5 * time.Second

func listen(t *testing.T, opts listener.Options) *listener.Server {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	s, err := listener.Listen(opts, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		assert.ErrorIs(t, s.Wait(), http.ErrServerClosed)
	})
	return s
}

// dialSilent opens n connections that send nothing.
func dialSilent(t *testing.T, s *listener.Server, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", s.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	return conns
}

// closedWithin: the server closed c within d.
func closedWithin(t *testing.T, c net.Conn, d time.Duration) bool {
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// With EvictAfter 0, a connection past the bound closes the oldest waiting
// one at once.
func TestEvictAtOnce(t *testing.T) {
	s := listen(t, listener.Options{MaxIdleConnections: 4})
	conns := dialSilent(t, s, 6)
	require.Eventually(t, func() bool { _, closed := s.IdleConnections(); return closed == 2 }, wait, time.Millisecond)
	held, _ := s.IdleConnections()
	assert.Equal(t, 4, held)
	assert.True(t, closedWithin(t, conns[0], wait))
	assert.True(t, closedWithin(t, conns[1], wait))
	assert.False(t, closedWithin(t, conns[5], 50*time.Millisecond))
}

// With EvictAfter, the oldest is closed only once it has waited that long;
// the new connection waits meanwhile, then is served.
func TestEvictAfterWaits(t *testing.T) {
	const after = 300 * time.Millisecond
	s := listen(t, listener.Options{MaxIdleConnections: 2, EvictAfter: after})
	begin := time.Now()
	conns := dialSilent(t, s, 2)
	c := &http.Client{Timeout: wait}
	resp, err := c.Get("http://" + s.Addr() + "/")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(begin), after-10*time.Millisecond)
	assert.True(t, closedWithin(t, conns[0], wait))
	c.CloseIdleConnections()
}

// DisableKeepAlives closes each connection after its response.
func TestDisableKeepAlives(t *testing.T) {
	s := listen(t, listener.Options{MaxIdleConnections: 4, DisableKeepAlives: true})
	c, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	all, err := io.ReadAll(c)
	require.NoError(t, err, "the server closed it")
	assert.Contains(t, string(all), "Connection: close")
}

func TestListenError(t *testing.T) {
	s := listen(t, listener.Options{MaxIdleConnections: 1})
	_, err := listener.Listen(listener.Options{Addr: s.Addr()}, http.NotFoundHandler())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "address already in use")
}
