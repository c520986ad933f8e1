package transport

// Streams that break: a side that closes, crashes or vanishes mid-stream
// (a loss, or an incomplete stream), and a peer that violates the protocol.

import (
	"context"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestServerCloseLosesWorker(t *testing.T) {
	s, in, o := connect(t)
	attach(t, in, o)

	require.NoError(t, s.Close())
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Killed()), "the caller died: Lost, not Killed")
	assert.ErrorIs(t, o.Send(context.Background(), item(1)), ErrLost)
	_, err := in.Recv(context.Background())
	assert.Equal(t, ErrServerClosed, err)
	assert.Equal(t, ErrServerClosed, func() error { _, err := s.Expect("late").Recv(context.Background()); return err }())
}

// The caller's raw connection breaking (its process dying) is a loss.
func TestCallerConnDroppedLosesWorker(t *testing.T) {
	_, in, o := connect(t)
	attach(t, in, o)

	in.mu.Lock()
	conn := in.conn
	in.mu.Unlock()
	require.NoError(t, conn.Close())

	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Killed()))
	_, err := in.Recv(context.Background())
	assert.ErrorIs(t, err, ErrIncomplete)
}

// A caller that is just a socket: it accepts, reads Hello, grants credit and
// disappears with data unread (an RST, as when a process is killed).
func TestRawCallerVanishes(t *testing.T) {
	o, c := rawCaller(t)
	w := frame.NewWriter(c)
	require.NoError(t, w.WriteCredit(10))
	require.NoError(t, w.Flush())
	require.NoError(t, o.Send(context.Background(), item(0)))
	require.NoError(t, c.Close())
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
	assert.ErrorIs(t, o.Send(context.Background(), item(1)), ErrLost)
	assert.ErrorIs(t, o.Finish(), ErrLost)
}

func TestWorkerCloseMidStream(t *testing.T) {
	_, in, o := connect(t)
	for i := 0; i < 20; i++ {
		require.NoError(t, o.Send(context.Background(), item(i)))
	}
	require.NoError(t, o.Close())
	got, err := recvAll(t, in)
	assert.Equal(t, ErrIncomplete, err)
	assert.Equal(t, items(0, 20), got, "items sent before Close are delivered")
	waitClosed(t, o.Done(), "Done")
	assert.ErrorIs(t, o.Send(context.Background(), item(0)), ErrClosed)
}

func TestWorkerCrashMidStream(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail []byte // written after the items, before the connection drops
	}{
		{"between frames", nil},
		{"inside a frame", []byte{byte(frame.Data), 0, 0, 0, 9, 'x'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := listen(t)
			in := expect(t, s, "tok")
			c, w, _ := rawWorker(t, s, "tok")
			for i := 0; i < 3; i++ {
				require.NoError(t, w.WriteData(item(i)))
			}
			require.NoError(t, w.Flush())
			_, err := c.Write(tc.tail)
			require.NoError(t, err)
			require.NoError(t, c.Close())
			got, err := recvAll(t, in)
			assert.Equal(t, ErrIncomplete, err)
			assert.Equal(t, items(0, 3), got)
		})
	}
}

func TestProtocolViolations(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w *frame.Writer) error
	}{
		{"data beyond credit", func(w *frame.Writer) error {
			_, err := w.WriteBatch([][]byte{item(0), item(1), item(2)})
			return err
		}},
		{"control frame from worker", func(w *frame.Writer) error { return w.WriteStop() }},
		{"unknown type", func(w *frame.Writer) error { return w.WriteFrame(42, nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := listen(t, WithWindow(2))
			in := expect(t, s, "tok")
			_, w, _ := rawWorker(t, s, "tok")
			require.NoError(t, tc.write(w))
			require.NoError(t, w.Flush())
			// Not consuming until the stream ended keeps the credit at 2
			// (consuming would grant more and legitimise a third item).
			require.Eventually(t, func() bool {
				in.mu.Lock()
				defer in.mu.Unlock()
				return in.err != nil
			}, waitFor, time.Millisecond)
			_, err := recvAll(t, in)
			assert.ErrorIs(t, err, ErrIncomplete)
			assert.NotEqual(t, ErrIncomplete, err, "a violation says what happened")
		})
	}
}
