package transport

// Connecting a stream: tokens the caller does not expect (unknown, twice,
// abandoned), a Stop or Kill before the worker connects, no connection.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestUnknownTokenRejected(t *testing.T) {
	s := listen(t)
	in := s.Expect("known")
	defer in.Close()

	// A raw connection with an unknown token is closed without a frame.
	c, _, r := rawWorker(t, s, "unknown")
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	_, err := r.ReadFrame()
	assert.Equal(t, io.EOF, err)

	// So is one whose first frame is not a Hello.
	c2, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	w := frame.NewWriter(c2)
	require.NoError(t, w.WriteData([]byte("hi")))
	require.NoError(t, w.Flush())
	_ = c2.SetReadDeadline(time.Now().Add(waitFor))
	_, err = frame.NewReader(c2).ReadFrame()
	assert.Error(t, err, "closed (EOF, or a reset: its payload was never read)")
	assert.NotErrorIs(t, err, os.ErrDeadlineExceeded)

	// A real worker with an unknown token sees its stream lost.
	o := dial(t, s, "unknown")
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")

	// A token is matched once: a second connection with it is unknown.
	o1 := dial(t, s, "known")
	require.NoError(t, o1.Send(context.Background(), item(0)))
	got, err := in.Recv(context.Background()) // o1 is attached
	require.NoError(t, err)
	assert.Equal(t, string(item(0)), string(got))
	o2 := dial(t, s, "known")
	waitClosed(t, o2.Lost(), "second connection Lost")
	require.NoError(t, o1.Finish())
	_, err = recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	waitClosed(t, o1.Done(), "Done")
	waitClosed(t, o2.Done(), "Done")
}

func TestStopBeforeConnect(t *testing.T) {
	s := listen(t)
	in := expect(t, s, "tok")
	in.Stop()
	o := dial(t, s, "tok")
	waitClosed(t, o.Stopped(), "Stopped")
	require.NoError(t, o.Send(context.Background(), item(0)), "credit was granted too")
	finishAndRead(t, in, o, items(0, 1))
	assert.False(t, closed(o.Killed()))
}

func TestKillBeforeConnect(t *testing.T) {
	for _, viaClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", viaClose), func(t *testing.T) {
			s := listen(t)
			in := s.Expect("tok")
			if viaClose {
				require.NoError(t, in.Close())
			} else {
				in.Kill()
				_, err := in.Recv(context.Background())
				assert.Equal(t, ErrKilled, err)
			}
			o := dial(t, s, "tok")
			waitClosed(t, o.Killed(), "Killed")
			waitClosed(t, o.Done(), "Done")
			assert.False(t, closed(o.Lost()))
			assert.ErrorIs(t, o.Send(context.Background(), item(0)), ErrKilled)
			in.Close()
		})
	}
}

func TestNoConnection(t *testing.T) {
	s := listen(t, WithConnectTimeout(time.Hour))
	in := s.Expect("tok", WithConnectTimeout(30*time.Millisecond))
	defer in.Close()
	_, err := in.Recv(context.Background())
	assert.Equal(t, ErrNoConnection, err)
	assert.ErrorIs(t, err, ErrIncomplete)
	// Too late now: the token is no longer known.
	o := dial(t, s, "tok")
	waitClosed(t, o.Lost(), "Lost")
	waitClosed(t, o.Done(), "Done")
}

func TestDuplicateToken(t *testing.T) {
	s := listen(t)
	expect(t, s, "tok")
	dup := s.Expect("tok")
	_, err := dup.Recv(context.Background())
	assert.Equal(t, ErrDuplicateToken, err)
	dup.Close()
}

// A stream its caller abandoned before any worker attached refuses a worker
// that dials it late: no Kill, no credit, the connection ends unanswered
// (the worker's stream is lost, so it starts nothing).
func TestAbandonedStreamRefusesALateWorker(t *testing.T) {
	s := listen(t)
	in := s.Expect("tok")
	require.NoError(t, in.Abandon())
	o, err := Dial(context.Background(), s.Addr().String(), "tok", WithConnectTimeout(200*time.Millisecond))
	require.NoError(t, err)
	defer o.Close()
	waitClosed(t, o.Lost(), "Lost")
	assert.False(t, closed(o.Attached()), "no frame came from the caller")
	assert.False(t, closed(o.Killed()))
}
