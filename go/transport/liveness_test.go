package transport

import (
	"context"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testIdle = 300 * time.Millisecond

// A worker that connects and then says nothing at all (its process stopped,
// a partition) ends the caller's stream with ErrPeerSilent, an ErrIncomplete.
func TestSilentWorkerDetected(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle))
	in := expect(t, s, "tok")
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
	in := expect(t, s, "tok")
	o := dial(t, s, "tok", WithIdleTimeout(idle))
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, o.Send(context.Background(), item(0)))
	time.Sleep(2500 * time.Millisecond)
	finishAndRead(t, in, o, items(0, 1))
}

// A caller that holds its connection open and says nothing (stopped
// process) is lost to the worker after the idle timeout, so the handler is
// killed instead of waiting for credit forever.
func TestSilentCallerLost(t *testing.T) {
	o, c := rawCaller(t, WithIdleTimeout(testIdle))
	w := frame.NewWriter(c)
	require.NoError(t, w.WriteCredit(1))
	require.NoError(t, w.Flush())
	require.NoError(t, o.Send(context.Background(), item(0)))
	// No more credit, no heartbeat: Send blocks until the caller is lost.
	assert.ErrorIs(t, o.Send(context.Background(), item(1)), ErrLost)
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
}

// A live caller that withholds credit (its consumer is slow) is not lost:
// its heartbeats keep the worker waiting.
func TestQuietCallerKept(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle), WithWindow(1))
	in := expect(t, s, "tok")
	o := dial(t, s, "tok", WithIdleTimeout(testIdle))
	require.NoError(t, o.Send(context.Background(), item(0)))
	sent := make(chan error, 1)
	go func() { sent <- o.Send(context.Background(), item(1)) }()
	time.Sleep(4 * testIdle)
	assert.False(t, closed(o.Lost()), "a quiet caller is not lost")
	b, err := in.Recv(context.Background())
	require.NoError(t, err)
	assert.Equal(t, string(item(0)), string(b))
	require.NoError(t, <-sent)
	finishAndRead(t, in, o, items(1, 2))
}

// Heartbeats are real frames on the wire, and only when nothing else is sent.
func TestHeartbeatsOnWire(t *testing.T) {
	s := listen(t, WithIdleTimeout(testIdle))
	expect(t, s, "tok")
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
