package transport

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// connPair is a connected pair on loopback: (the dialled side, the
// accepted side), both closed at the end of the test.
func connPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	var c net.Conn
	_, peer := acceptOne(t, func(addr string) (*Outgoing, error) {
		var err error
		c, err = net.Dial("tcp", addr)
		return nil, err
	})
	t.Cleanup(func() { c.Close() })
	return c, peer
}

// readSessFrame reads one session frame from r.
func readSessFrame(t *testing.T, r *bufio.Reader) (kind byte, id uint32, p []byte) {
	t.Helper()
	var h [sessHeaderSize]byte
	_, err := io.ReadFull(r, h[:])
	require.NoError(t, err)
	kind, id, n := parseSessHeader(&h)
	p = make([]byte, n)
	_, err = io.ReadFull(r, p)
	require.NoError(t, err)
	return kind, id, p
}

// A session's streams write directly (urgent: flushDirect) while the peer does not
// read, so that the socket fills, writes come back partial or refused, and
// the writer takes over what is left; then the peer reads. Every stream's
// bytes arrive whole and in order, behind its Open, and every frame is
// whole (the frames parse to the end).
func TestSessionDirectWritesKeepOrderWhenTheSocketFills(t *testing.T) {
	c, peer := connPair(t)
	require.NoError(t, c.(*net.TCPConn).SetWriteBuffer(16<<10))
	require.NoError(t, peer.(*net.TCPConn).SetReadBuffer(16<<10))

	s := newSession(c, true, maxCtlBacklog)
	require.NotNil(t, s.raw)
	done := make(chan struct{})
	go func() { defer close(done); s.writeLoop() }()

	const streams, writes = 8, 400
	var wg sync.WaitGroup
	for k := 0; k < streams; k++ {
		v, err := s.open(fmt.Sprintf("tok-%d", k))
		require.NoError(t, err)
		wg.Add(1)
		v.setUrgent(true) // every Write writes directly (flushDirect)
		go func(v *vstream, k int) {
			defer wg.Done()
			for i := 0; i < writes; i++ {
				p := make([]byte, 100+(i*37+k*11)%900)
				binary.BigEndian.PutUint32(p, uint32(i))
				_, err := v.Write(p)
				if err != nil {
					t.Errorf("stream %d write %d: %v", k, i, err)
					return
				}
			}
		}(v, k)
	}
	wrote := make(chan struct{})
	go func() { wg.Wait(); close(wrote) }()
	time.Sleep(50 * time.Millisecond) // the socket fills: later writes are the writer's

	next := make(map[uint32]uint32)
	opened := make(map[uint32]bool)
	r := bufio.NewReader(peer)
	for total := 0; total < streams*writes; {
		kind, id, p := readSessFrame(t, r)
		switch kind {
		case sessOpen:
			opened[id] = true
		case sessData:
			require.True(t, opened[id], "data of stream %d before its Open", id)
			require.Equal(t, next[id], binary.BigEndian.Uint32(p), "stream %d out of order", id)
			next[id]++
			total++
		}
	}
	<-wrote
	for id := uint32(1); id <= streams; id++ {
		require.EqualValues(t, writes, next[id])
	}
	s.close()
	<-done
}

// Frames queued through a Batch are written by its Flush at the latest
// (the writer may take them sooner, when something else woke it), each
// session once, in order; frames that follow go behind them.
func TestBatchWritesOnFlush(t *testing.T) {
	c, peer := connPair(t)
	s := newSession(c, true, maxCtlBacklog)
	done := make(chan struct{})
	go func() { defer close(done); s.writeLoop() }()

	va, err := s.open("tok-a")
	require.NoError(t, err)
	vb, err := s.open("tok-b")
	require.NoError(t, err)
	r := bufio.NewReader(peer)
	for range 2 { // the Opens: written by the writer
		readSessFrame(t, r)
	}
	var b Batch
	for i, v := range []*vstream{va, vb, va} {
		v.setEager(true, &b)
		_, err := v.Write([]byte{byte(i)})
		require.NoError(t, err)
		v.setEager(false, nil)
	}
	require.Len(t, b.sessions, 1, "one session to flush")
	b.Flush()
	require.Empty(t, b.sessions)
	_, err = vb.Write([]byte{3})
	require.NoError(t, err)

	require.NoError(t, peer.SetReadDeadline(time.Now().Add(5*time.Second)))
	var got []string
	for len(got) < 4 {
		kind, id, p := readSessFrame(t, r)
		if kind == sessOpen {
			got = append(got, fmt.Sprintf("open %d", id))
		} else {
			got = append(got, fmt.Sprintf("data %d %d", id, p[0]))
		}
	}
	require.Equal(t, []string{"data 1 0", "data 2 1", "data 1 2", "data 2 3"}, got)
	s.close()
	<-done
}
