package stream

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

const testIdle = 300 * time.Millisecond

// A worker that connects and then says nothing at all (its process stopped,
// a partition) ends the caller's stream with ErrPeerSilent, an ErrIncomplete.
func TestSilentWorkerDetected(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle))
	in := s.Expect("tok")
	defer in.Close()
	c, w, _ := rawWorker(t, s, "tok")
	_, err := w.WriteBatch([][]byte{item(0)})
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	start := time.Now()
	got, err := recvAll(t, in)
	took := time.Since(start)
	assert.Equal(t, items(0, 1), got)
	assert.ErrorIs(t, err, ErrPeerSilent)
	assert.ErrorIs(t, err, ErrIncomplete)
	assert.GreaterOrEqual(t, took, testIdle/2)
	assert.Less(t, took, waitFor)
	_ = c.Close()
}

// A worker that is quiet but alive (a long prefill: no item for many idle
// timeouts) keeps its stream: its heartbeats are enough.
func TestQuietWorkerKept(t *testing.T) {
	// A longer idle timeout than the other tests: this one must not fail
	// when a loaded machine (-race, two cores) delays a heartbeat by a few
	// hundred milliseconds.
	const idle = time.Second
	s := listen(t, WithIdleTimeout(idle))
	in := s.Expect("tok")
	defer in.Close()
	o, err := Dial(context.Background(), s.Addr().String(), "tok", WithIdleTimeout(idle))
	require.NoError(t, err)
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, o.Send(context.Background(), item(0)))
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, o.Finish())
	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 1), got)
	assert.Equal(t, "EOF", err.Error())
	waitClosed(t, o.Done(), "Done")
}

// A caller that holds its connection open and says nothing (stopped
// process) is lost to the worker after the idle timeout, so the handler is
// killed instead of waiting for credit forever.
func TestSilentCallerLost(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	o, err := Dial(context.Background(), ln.Addr().String(), "tok", WithIdleTimeout(testIdle))
	require.NoError(t, err)
	c := <-accepted
	require.NotNil(t, c)
	defer c.Close()
	w := frame.NewWriter(c)
	require.NoError(t, w.WriteCredit(1))
	require.NoError(t, w.Flush())
	require.NoError(t, o.Send(context.Background(), item(0)))
	// No more credit, no heartbeat: Send blocks until the caller is lost.
	err = o.Send(context.Background(), item(1))
	assert.ErrorIs(t, err, ErrLost)
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
}

// A live caller that withholds credit (its consumer is slow) is not lost:
// its heartbeats keep the worker waiting.
func TestQuietCallerKept(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle), WithWindow(1))
	in := s.Expect("tok")
	defer in.Close()
	o, err := Dial(context.Background(), s.Addr().String(), "tok", WithIdleTimeout(testIdle))
	require.NoError(t, err)
	require.NoError(t, o.Send(context.Background(), item(0)))
	sent := make(chan error, 1)
	go func() { sent <- o.Send(context.Background(), item(1)) }()
	time.Sleep(4 * testIdle)
	assert.False(t, closed(o.Lost()), "a quiet caller is not lost")
	b, err := in.Recv(context.Background())
	require.NoError(t, err)
	assert.Equal(t, string(item(0)), string(b))
	require.NoError(t, <-sent)
	require.NoError(t, o.Finish())
	got, err := recvAll(t, in)
	assert.Equal(t, items(1, 2), got)
	assert.Equal(t, "EOF", err.Error())
	waitClosed(t, o.Done(), "Done")
}

// Heartbeats are real frames on the wire, and only when nothing else is sent.
func TestHeartbeatsOnWire(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle))
	in := s.Expect("tok")
	defer in.Close()
	c, _, r := rawWorker(t, s, "tok")
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	f, err := r.ReadFrame()
	require.NoError(t, err)
	require.Equal(t, frame.Credit, f.Type)
	f, err = r.ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, frame.Heartbeat, f.Type)
}

func TestHeartbeatInterval(t *testing.T) {
	assert.Equal(t, DefaultHeartbeat, heartbeatFor(DefaultIdleTimeout))
	assert.Equal(t, 100*time.Millisecond, heartbeatFor(500*time.Millisecond))
	assert.Equal(t, time.Millisecond, heartbeatFor(time.Microsecond))
}
