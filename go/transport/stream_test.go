package transport

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

func TestErrIncompleteText(t *testing.T) {
	assert.Equal(t, "Stream ended before generation completed", ErrIncomplete.Error())
	assert.ErrorIs(t, ErrNoConnection, ErrIncomplete)
	assert.NotErrorIs(t, ErrServerClosed, ErrIncomplete)
}

func TestNormalStream(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	finishAndRead(t, in, o, items(0, 100))
	_, err := in.Recv(ctx)
	assert.Equal(t, io.EOF, err, "the end is sticky")

	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Stopped()))
	assert.False(t, closed(o.Killed()))
	assert.False(t, closed(o.Lost()), "a normal end is not a loss")
	assert.ErrorIs(t, o.Send(ctx, item(0)), ErrClosed)
	assert.ErrorIs(t, o.Finish(), ErrClosed)
	assert.NoError(t, o.Close(), "Close after Finish is a no-op")
}

func TestSendBatch(t *testing.T) {
	s := listen(t, WithWindow(16)) // batches larger than the window must wait for credit
	in := expect(t, s, "tok")
	o := dial(t, s, "tok")
	var batch [][]byte
	for i := 0; i < 1000; i++ {
		batch = append(batch, item(i))
	}
	errc := make(chan error, 1)
	go func() {
		n, err := o.SendBatch(context.Background(), batch)
		if err == nil && n != len(batch) {
			err = fmt.Errorf("sent %d", n)
		}
		if err == nil {
			err = o.Finish()
		}
		errc <- err
	}()
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, items(0, 1000), got)
	require.NoError(t, <-errc)
	waitClosed(t, o.Done(), "Done")
}

func TestStop(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	for i := 0; i < 3; i++ {
		b, err := in.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, string(item(i)), string(b))
	}
	in.Stop()
	in.Stop() // at most once on the wire (see TestControlFramesOnWire)
	waitClosed(t, o.Stopped(), "Stopped")
	// Data keeps flowing after Stop.
	for i := 10; i < 15; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	finishAndRead(t, in, o, items(3, 15), "items already sent still arrive")
	assert.False(t, closed(o.Killed()), "Stop is not Kill")
	assert.False(t, closed(o.Lost()))
}

func TestKill(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()

	// The worker produces until the stream refuses.
	sendErr := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := o.Send(ctx, item(i)); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	for i := 0; i < 5; i++ {
		_, err := in.Recv(ctx)
		require.NoError(t, err)
	}
	in.Kill()
	_, err := in.Recv(ctx)
	assert.Equal(t, ErrKilled, err)

	waitClosed(t, o.Killed(), "Killed")
	assert.ErrorIs(t, <-sendErr, ErrKilled)
	start := time.Now()
	assert.ErrorIs(t, o.Send(ctx, item(0)), ErrKilled)
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Send after Kill fails at once")
	assert.ErrorIs(t, o.Finish(), ErrKilled)
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Lost()), "a Kill is not a loss")
	assert.False(t, closed(o.Stopped()))
	in.Kill() // idempotent
	_, err = in.Recv(ctx)
	assert.Equal(t, ErrKilled, err)
}

func TestCloseKillsUnfinished(t *testing.T) {
	_, in, o := connect(t)
	attach(t, in, o)
	require.NoError(t, in.Close())
	require.NoError(t, in.Close())
	waitClosed(t, o.Killed(), "Killed")
	waitClosed(t, o.Done(), "Done")
	_, err := in.Recv(context.Background())
	assert.Equal(t, ErrClosed, err)
}

func TestKillAfterEndIsNoop(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	require.NoError(t, o.Finish())
	waitClosed(t, o.Done(), "Done") // the caller has received Final
	in.Kill()
	in.Stop()
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, items(0, 1), got)
}

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

func TestHandlerError(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	msg := "a python exception was caught while processing the async generator: ValueError: boom"
	require.NoError(t, o.Fail(msg))
	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 1), got)
	var he *HandlerError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, msg, he.Message)
	assert.Equal(t, msg, err.Error())
	assert.NotErrorIs(t, err, ErrIncomplete)
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Lost()))
}

func TestIncompleteOnPurpose(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	require.NoError(t, o.Incomplete("the handler stopped the request"))
	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 1), got)
	assert.ErrorIs(t, err, ErrStoppedByHandler)
	assert.ErrorIs(t, err, ErrIncomplete, "callers that only know ErrIncomplete still match")
	assert.Equal(t, "Stream ended before generation completed", err.Error())
	waitClosed(t, o.Done(), "Done")
}

func TestKillCause(t *testing.T) {
	_, in, o := connect(t)
	in.KillCause(3)
	waitClosed(t, o.Killed(), "Killed")
	assert.Equal(t, byte(3), o.KillCause())
	waitClosed(t, o.Done(), "Done")
}

func TestOnControl(t *testing.T) {
	_, in, o := connect(t)
	events := make(chan Event, 4)
	in.Stop()
	waitClosed(t, o.Stopped(), "Stopped")
	o.OnControl(func(ev Event) { events <- ev }) // the Stop that already happened is replayed
	in.Kill()
	waitClosed(t, o.Killed(), "Killed")
	assert.Equal(t, EventStop, <-events)
	assert.Equal(t, EventKill, <-events)
	assert.Empty(t, events)
	waitClosed(t, o.Done(), "Done")
}

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

// Exactly the expected control frames reach the worker: the window, one Stop
// however many calls, one Kill.
func TestControlFramesOnWire(t *testing.T) {
	s := listen(t, WithWindow(4))
	in := s.Expect("tok")
	c, w, r := rawWorker(t, s, "tok")
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	next := func() frame.Frame {
		for {
			f, err := r.ReadFrame()
			require.NoError(t, err)
			if f.Type != frame.Heartbeat { // liveness, at any time
				return f
			}
		}
	}
	f := next()
	require.Equal(t, frame.Credit, f.Type)
	assert.Equal(t, uint32(4), f.Credit())

	in.Stop()
	in.Stop()
	assert.Equal(t, frame.Stop, next().Type)

	// Consuming half the window grants it back.
	_, err := w.WriteBatch([][]byte{item(0), item(1), item(2)})
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	for i := 0; i < 3; i++ {
		_, err := in.Recv(context.Background())
		require.NoError(t, err)
	}
	f = next()
	require.Equal(t, frame.Credit, f.Type)
	assert.Equal(t, uint32(2), f.Credit())

	in.Stop()
	in.Kill()
	in.Kill()
	assert.Equal(t, frame.Kill, next().Type)
	_, err = r.ReadFrame()
	assert.Equal(t, io.EOF, err, "Kill is followed by the caller's FIN")
	require.NoError(t, c.Close())
	in.Close()
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

func TestRecvContext(t *testing.T) {
	_, in, o := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := in.Recv(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	// The stream is unaffected.
	require.NoError(t, o.Send(context.Background(), item(7)))
	finishAndRead(t, in, o, items(7, 8))
}

func TestSendBlocksWithoutCredit(t *testing.T) {
	_, in, o := connect(t, WithWindow(1))
	require.NoError(t, o.Send(context.Background(), item(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, o.Send(ctx, item(1)), context.DeadlineExceeded)
	// A blocked Send is released by Close.
	errc := make(chan error, 1)
	go func() { errc <- o.Send(context.Background(), item(1)) }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, o.Close())
	assert.ErrorIs(t, <-errc, ErrClosed)
	got, err := recvAll(t, in)
	assert.Equal(t, ErrIncomplete, err)
	assert.Equal(t, items(0, 1), got)
	waitClosed(t, o.Done(), "Done")
}

func TestFlowControl(t *testing.T) {
	const window, total = 8, 200
	_, in, o := connect(t, WithWindow(window))

	var sent atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < total; i++ {
			if err := o.Send(context.Background(), item(i)); err != nil {
				errc <- err
				return
			}
			sent.Add(1)
		}
		errc <- o.Finish()
	}()

	// The consumer does not read: the producer stalls at the window.
	require.Eventually(t, func() bool { return sent.Load() == window }, waitFor, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(window), sent.Load(), "producer must block when the consumer does not read")
	in.mu.Lock()
	assert.LessOrEqual(t, in.q.len(), window)
	in.mu.Unlock()

	// Reading slowly: sent never runs ahead of received by more than the window.
	ctx := context.Background()
	for i := 0; i < total; i++ {
		b, err := in.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, string(item(i)), string(b))
		assert.LessOrEqual(t, sent.Load(), int64(i+1+window))
		in.mu.Lock()
		assert.LessOrEqual(t, in.q.len(), window)
		in.mu.Unlock()
	}
	_, err := in.Recv(ctx)
	assert.Equal(t, io.EOF, err)
	require.NoError(t, <-errc)
	waitClosed(t, o.Done(), "Done")
}

func TestManyConcurrentStreams(t *testing.T) {
	const streams, perStream = 50, 300
	s := listen(t, WithWindow(16))
	var wg sync.WaitGroup
	errs := make(chan error, 2*streams)
	for k := 0; k < streams; k++ {
		tok := NewToken()
		in := s.Expect(tok)
		wg.Add(2)
		go func() { // worker
			defer wg.Done()
			o, err := Dial(context.Background(), s.Addr().String(), tok)
			if err != nil {
				errs <- err
				return
			}
			for i := 0; i < perStream; i++ {
				if err := o.Send(context.Background(), []byte(fmt.Sprintf("%s/%d", tok, i))); err != nil {
					errs <- err
					return
				}
			}
			if err := o.Finish(); err != nil {
				errs <- err
			}
			<-o.Done()
		}()
		go func() { // consumer
			defer wg.Done()
			defer in.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := 0; ; i++ {
				b, err := in.Recv(ctx)
				if errors.Is(err, io.EOF) && i == perStream {
					return
				}
				if err != nil {
					errs <- fmt.Errorf("stream %s item %d: %w", tok, i, err)
					return
				}
				if want := fmt.Sprintf("%s/%d", tok, i); string(b) != want {
					errs <- fmt.Errorf("got %q want %q", b, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestNewToken(t *testing.T) {
	a, b := NewToken(), NewToken()
	assert.Len(t, a, 32)
	assert.NotEqual(t, a, b)
}

func TestRing(t *testing.T) {
	var r ring
	next, want := 0, 0
	for round := 0; round < 50; round++ {
		for i := 0; i < round%7+1; i++ { // pushes outpace pops: wraps and grows
			r.push(item(next))
			next++
		}
		for i := 0; i < round%5; i++ {
			b, ok := r.pop()
			if !ok {
				break
			}
			require.Equal(t, string(item(want)), string(b))
			want++
		}
		require.Equal(t, next-want, r.len())
	}
	for {
		b, ok := r.pop()
		if !ok {
			break
		}
		require.Equal(t, string(item(want)), string(b))
		want++
	}
	assert.Equal(t, next, want)
	r.reset()
	assert.Equal(t, 0, r.len())
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
