package transport

// The harness of the package's tests: servers, dialers, streams connected
// and attached, raw peers that speak frames by hand, and waiting.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

const waitFor = 5 * time.Second

// listen starts a Server closed at the end of the test, after which no
// goroutine of the test may remain (cleanups run last-registered first).
func listen(t *testing.T, opts ...Option) *Server {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s, err := Listen("127.0.0.1:0", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// ownConnections makes dial give each stream a connection of its own
// (Dial) instead of a stream of the test's session (Dialer.Dial), which is
// what workers use: go test ./go/transport -args -own-connections.
var ownConnections = flag.Bool("own-connections", false, "dial each stream on its own connection")

// dialers holds each test's Dialer: all streams a test dials share one
// session per Server, as a worker's streams to one caller do.
var dialers sync.Map // *testing.T -> *Dialer

// testDialer is the Dialer of t, closed at the end of the test.
func testDialer(t *testing.T) *Dialer {
	if d, ok := dialers.Load(t); ok {
		return d.(*Dialer)
	}
	d := NewDialer(0)
	dialers.Store(t, d)
	t.Cleanup(func() {
		dialers.Delete(t)
		require.NoError(t, d.Close())
	})
	return d
}

func dial(t *testing.T, s *Server, token string, opts ...Option) *Outgoing {
	t.Helper()
	var o *Outgoing
	var err error
	if *ownConnections {
		o, err = Dial(context.Background(), s.Addr().String(), token, opts...)
	} else {
		o, err = testDialer(t).Dial(context.Background(), s.Addr().String(), token, opts...)
	}
	require.NoError(t, err)
	return o
}

// expect is s.Expect(token), closed at the end of the test.
func expect(t *testing.T, s *Server, token string) *Incoming {
	t.Helper()
	in := s.Expect(token)
	t.Cleanup(func() { in.Close() })
	return in
}

// connect makes the two ends of one stream: a Server (listen, with opts),
// the caller's Incoming (closed at the end of the test) and the worker's
// Outgoing, dialled with token "tok".
func connect(t *testing.T, opts ...Option) (*Server, *Incoming, *Outgoing) {
	t.Helper()
	s := listen(t, opts...)
	in := expect(t, s, "tok")
	return s, in, dial(t, s, "tok")
}

// finishAndRead ends o's stream with Finish and checks that in reads want,
// then io.EOF, and that o is Done.
func finishAndRead(t *testing.T, in *Incoming, o *Outgoing, want []string, msg ...any) {
	t.Helper()
	require.NoError(t, o.Finish())
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, want, got, msg...)
	waitClosed(t, o.Done(), "Done")
}

// attach sends one item from o to in and reads it: the stream is connected
// at both ends.
func attach(t *testing.T, in *Incoming, o *Outgoing) {
	t.Helper()
	require.NoError(t, o.Send(context.Background(), item(0)))
	b, err := in.Recv(context.Background())
	require.NoError(t, err)
	require.Equal(t, string(item(0)), string(b))
}

// rawCaller dials a worker's Outgoing (with opts, token "tok") to a bare
// socket that plays the caller, and returns the caller's end of the
// connection (closed at the end of the test); nothing has been sent on it.
func rawCaller(t *testing.T, opts ...Option) (*Outgoing, net.Conn) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	return acceptOne(t, func(addr string) (*Outgoing, error) {
		return Dial(context.Background(), addr, "tok", opts...)
	})
}

// acceptOne listens on loopback, runs dial with the address, and returns
// its Outgoing and the one connection accepted (closed at the end of the
// test), on which nothing has been read.
func acceptOne(t *testing.T, dial func(addr string) (*Outgoing, error)) (*Outgoing, net.Conn) {
	t.Helper()
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
	o, err := dial(ln.Addr().String())
	require.NoError(t, err)
	c := <-accepted
	require.NotNil(t, c)
	t.Cleanup(func() { c.Close() })
	return o, c
}

func item(i int) []byte { return []byte(fmt.Sprintf(`{"i":%d}`, i)) }

// recvAll reads until the end and returns the items and the final error.
func recvAll(t *testing.T, in *Incoming) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var got []string
	for {
		b, err := in.Recv(ctx)
		if err != nil {
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			return got, err
		}
		got = append(got, string(b))
	}
}

func items(from, to int) []string {
	var s []string
	for i := from; i < to; i++ {
		s = append(s, string(item(i)))
	}
	return s
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatalf("%s not closed within %v", what, waitFor)
	}
}

// rawWorker dials s and sends Hello itself, to play a crashing or
// misbehaving worker.
func rawWorker(t *testing.T, s *Server, token string) (net.Conn, *frame.Writer, *frame.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	w := frame.NewWriter(c)
	require.NoError(t, w.WriteHello([]byte(token)))
	require.NoError(t, w.Flush())
	return c, w, frame.NewReader(c)
}
