package transport

import (
	"encoding/binary"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Anyone who can reach the stream port can connect. Before a connection has
// shown a valid token it costs O(1) memory and a bounded time.

// heapInUse is the Go heap plus goroutine stacks in use.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// helloConns opens n connections to s that each send a Hello header
// announcing size bytes, then body; they are closed at the end of the test.
func helloConns(t *testing.T, s *Server, n int, size uint32, body []byte) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		var hdr [frame.HeaderSize]byte
		hdr[0] = byte(frame.Hello)
		binary.BigEndian.PutUint32(hdr[1:], size)
		_, err = c.Write(append(hdr[:], body...))
		require.NoError(t, err)
		conns[i] = c
	}
	return conns
}

// requireClosedByServer waits for each of conns to be closed by the server
// (a read fails before waitFor, not for its deadline).
func requireClosedByServer(t *testing.T, conns []net.Conn) {
	t.Helper()
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err, "conn %d", i)
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "conn %d is closed by the server, not left open", i)
	}
}

// A Hello that announces 16 MiB is refused from its header: 100 of them
// hold no memory and are closed at once.
func TestOversizedHelloRefused(t *testing.T) {
	s := listen(t)
	before := heapInUse()
	requireClosedByServer(t, helloConns(t, s, 100, 16<<20, make([]byte, 4096)))
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap growth for 100 oversized Hellos: %d bytes", grew)
	assert.Less(t, grew, int64(2<<20))
}

// held reports how many connections s holds (accepted, not yet released)
// and how many of them have not presented a Hello.
func held(s *Server) (conns, unhello int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns), s.unhello
}

// Silent connections (no Hello at all) are dropped after the connect
// timeout, and at most MaxPendingConns are held at once: the rest wait in
// the listen queue and are accepted as the first ones are evicted or
// dropped, and are dropped in turn; a real worker gets through.
func TestSilentConnectionsBounded(t *testing.T) {
	s := listen(t, WithConnectTimeout(time.Second))
	n := MaxPendingConns + 50
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	require.Eventually(t, func() bool { c, _ := held(s); return c == MaxPendingConns }, waitFor, time.Millisecond)
	for range 20 { // the bound holds while they wait
		time.Sleep(10 * time.Millisecond)
		c, u := held(s)
		require.LessOrEqual(t, c, MaxPendingConns)
		require.LessOrEqual(t, u, MaxPendingConns)
	}
	requireClosedByServer(t, conns) // the first ones at their timeout, the rest at theirs
	in := s.Expect("tok")
	o := dial(t, s, "tok")
	finishAndRead(t, in, o, nil)
}

// Half-open connections (a Hello header announcing a token, then nothing)
// hold O(1) memory each while they wait for the connect timeout, and are
// released by it.
func TestHalfOpenHellosHoldLittle(t *testing.T) {
	s := listen(t, WithConnectTimeout(2*time.Second))
	before := heapInUse()
	conns := helloConns(t, s, 100, 32, []byte("half")) // 4 of the 32 bytes announced
	time.Sleep(200 * time.Millisecond)                 // every connection accepted and waiting
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap and stacks held by 100 half-open stream connections: %d bytes (%d per connection)", grew, grew/100)
	assert.Less(t, grew, int64(4<<20))
	requireClosedByServer(t, conns) // by the connect timeout
}
