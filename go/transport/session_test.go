package transport

import (
	"bufio"
	"context"
	"encoding/binary"
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

// countingListener counts the connections a Server accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// countedServer is listen with a count of accepted connections.
func countedServer(t *testing.T, opts ...Option) (*Server, *countingListener) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cl := &countingListener{Listener: ln}
	s := serve(cl, opts)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s, cl
}

// Every stream a Dialer sends to one caller shares one connection, whether
// the streams follow one another or run at once, and each keeps its items,
// its order and its end.
func TestSessionOneConnectionForAllStreams(t *testing.T) {
	s, cl := countedServer(t)
	d := testDialer(t)
	ctx := context.Background()
	for i := 0; i < 50; i++ { // one after another
		tok := fmt.Sprintf("seq-%d", i)
		in := expect(t, s, tok)
		o, err := d.Dial(ctx, s.Addr().String(), tok)
		require.NoError(t, err)
		require.NoError(t, o.Send(ctx, item(i)))
		finishAndRead(t, in, o, items(i, i+1))
	}
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ { // all at once
		tok := fmt.Sprintf("par-%d", i)
		in := expect(t, s, tok)
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := d.Dial(ctx, s.Addr().String(), tok)
			if !assert.NoError(t, err) {
				return
			}
			batch := make([][]byte, 300)
			for k := range batch {
				batch[k] = item(k)
			}
			_, err = o.SendBatch(ctx, batch)
			assert.NoError(t, err)
			assert.NoError(t, o.Finish())
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := recvAll(t, in)
			assert.Equal(t, io.EOF, err)
			assert.Equal(t, items(0, 300), got)
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 1, cl.n.Load(), "connections accepted")
	assert.Equal(t, 1, d.Sessions())
}

// A stream whose consumer does not read holds up no other stream of its
// session: its own credit stops its producer only.
func TestSessionSlowStreamHoldsUpNoOther(t *testing.T) {
	s := listen(t)
	ctx := context.Background()
	slow := s.Expect("slow", WithWindow(4))
	t.Cleanup(func() { slow.Close() })
	fast := expect(t, s, "fast")
	oslow := dial(t, s, "slow")
	of := dial(t, s, "fast")
	sent := make(chan error, 1)
	go func() { // blocks after 4 items: nobody reads the slow stream
		_, err := oslow.SendBatch(ctx, [][]byte{item(0), item(1), item(2), item(3), item(4)})
		sent <- err
	}()
	go func() {
		batch := make([][]byte, 10000)
		for k := range batch {
			batch[k] = item(k)
		}
		_, _ = of.SendBatch(ctx, batch)
		_ = of.Finish()
	}()
	got, err := recvAll(t, fast)
	assert.Equal(t, io.EOF, err)
	assert.Len(t, got, 10000)
	select {
	case err := <-sent:
		t.Fatalf("the slow stream's producer went past its credit: %v", err)
	default:
	}
	slow.Kill()
	assert.ErrorIs(t, <-sent, ErrKilled)
}

// When the worker's process goes (its Dialer closes every session), every
// stream of the session ends with ErrIncomplete for its caller, so that
// migration retries each; and the next Dial opens a new session.
func TestSessionLossEndsEveryStream(t *testing.T) {
	s, cl := countedServer(t)
	d := NewDialer(0)
	ctx := context.Background()
	var ins []*Incoming
	var outs []*Outgoing
	for i := 0; i < 20; i++ {
		tok := fmt.Sprintf("t%d", i)
		in := expect(t, s, tok)
		o, err := d.Dial(ctx, s.Addr().String(), tok)
		require.NoError(t, err)
		attach(t, in, o)
		ins, outs = append(ins, in), append(outs, o)
	}
	require.NoError(t, d.Close())
	for i, in := range ins {
		_, err := recvAll(t, in)
		assert.ErrorIs(t, err, ErrIncomplete, "stream %d", i)
		waitClosed(t, outs[i].Lost(), "Lost")
	}
	_, err := d.Dial(ctx, s.Addr().String(), "late")
	assert.ErrorIs(t, err, ErrDialerClosed)

	// The caller's side of the connection breaking: every worker stream
	// is Lost, every caller stream incomplete; a new Dial reconnects.
	d2 := testDialer(t)
	in := expect(t, s, "a")
	o, err := d2.Dial(ctx, s.Addr().String(), "a")
	require.NoError(t, err)
	attach(t, in, o)
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	waitClosed(t, o.Lost(), "Lost")
	_, err = recvAll(t, in)
	assert.ErrorIs(t, err, ErrIncomplete)
	in2 := expect(t, s, "b")
	o2, err := d2.Dial(ctx, s.Addr().String(), "b")
	require.NoError(t, err)
	attach(t, in2, o2)
	finishAndRead(t, in2, o2, nil)
	assert.EqualValues(t, 3, cl.n.Load(), "two sessions, then one after the loss")
}

// A session without streams closes after the Dialer's idle time; the next
// stream dials a new one.
func TestSessionIdleCloses(t *testing.T) {
	s := listen(t)
	d := NewDialer(30 * time.Millisecond)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	in := expect(t, s, "a")
	o, err := d.Dial(context.Background(), s.Addr().String(), "a")
	require.NoError(t, err)
	finishAndRead(t, in, o, nil)
	require.Eventually(t, func() bool { return d.Sessions() == 0 }, waitFor, time.Millisecond)
	in = expect(t, s, "b")
	o, err = d.Dial(context.Background(), s.Addr().String(), "b")
	require.NoError(t, err)
	finishAndRead(t, in, o, nil)
}

// A kill of one stream reaches its worker while 200 other streams of the
// session flood items, and no item follows it.
func TestSessionKillAmidFlood(t *testing.T) {
	s := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		tok := fmt.Sprintf("f%d", i)
		in := expect(t, s, tok)
		o := dial(t, s, tok)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for o.Send(ctx, item(1)) == nil {
			}
		}()
		go func() {
			defer wg.Done()
			for {
				if _, err := in.Recv(ctx); err != nil {
					return
				}
			}
		}()
	}
	victim := expect(t, s, "victim")
	o := dial(t, s, "victim")
	attach(t, victim, o)
	start := time.Now()
	victim.Kill()
	waitClosed(t, o.Killed(), "Killed")
	t.Logf("kill reached the worker in %v amid 200 flooding streams", time.Since(start))
	assert.ErrorIs(t, o.Send(ctx, item(2)), ErrKilled)
	_, err := victim.Recv(ctx)
	assert.ErrorIs(t, err, ErrKilled)
	cancel()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	wg.Wait()
}

// rawSession opens a connection to s and sends the session preamble.
func rawSession(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, writePreamble(c))
	return c
}

// sessFrame encodes one session frame.
func sessFrame(kind byte, id uint32, p []byte) []byte {
	h := sessHeader(kind, id, uint32(len(p)))
	return append(h[:], p...)
}

// A session is refused, connection and all, for anything but a worker that
// shows an expected token: a wrong version, more unknown tokens than a
// worker with stale requests would show, an Open without a token or with
// one too long, malformed or forged frames, silence. (A few unknown tokens
// are refused one by one: TestSessionStaleTokensRefusedAlone.)
func TestSessionHostileInput(t *testing.T) {
	s := listen(t, WithConnectTimeout(300*time.Millisecond))
	send := func(c net.Conn, b ...[]byte) {
		for _, p := range b {
			_, _ = c.Write(p)
		}
	}
	cases := map[string]func(c net.Conn){
		"unknown tokens": func(c net.Conn) {
			for i := uint32(1); i <= maxUnprovenRefusals+1; i++ {
				send(c, sessFrame(sessOpen, i, []byte("nobody")))
			}
		},
		"a refused stream's bytes, then its id again": func(c net.Conn) {
			send(c, sessFrame(sessOpen, 1, []byte("nobody")), sessFrame(sessData, 1, []byte("x")), sessFrame(sessOpen, 1, []byte("x")))
		},
		"open without token": func(c net.Conn) { send(c, sessFrame(sessOpen, 1, nil)) },
		"token too long":     func(c net.Conn) { send(c, sessFrame(sessOpen, 1, make([]byte, MaxTokenLen+1))) },
		"data on a stream never opened": func(c net.Conn) {
			send(c, sessFrame(sessData, 7, []byte("x")))
		},
		"unknown kind": func(c net.Conn) { send(c, sessFrame(99, 1, nil)) },
		"silence":      func(net.Conn) {},
	}
	for name, attack := range cases {
		t.Run(name, func(t *testing.T) {
			c := rawSession(t, s)
			attack(c)
			// Refusals' Fins may come first; then the server closes.
			_ = c.SetReadDeadline(time.Now().Add(waitFor))
			_, err := io.Copy(io.Discard, c)
			require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "closed by the server, not left open")
		})
	}
	t.Run("wrong version", func(t *testing.T) {
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte{byte(frame.Session), 0, 0, 0, 1, SessionVersion + 1})
		require.NoError(t, err)
		requireClosedByServer(t, []net.Conn{c})
	})
	// A proven session: an unknown token is refused alone (the stream's
	// Fin); out-of-order ids, oversized chunks, a Fin with a payload and a
	// forged stream id close the session, and its streams end incomplete.
	proven := func(t *testing.T, tok string) (net.Conn, *Incoming) {
		in := expect(t, s, tok)
		c := rawSession(t, s)
		send(c, sessFrame(sessOpen, 1, []byte(tok)))
		r := make([]byte, 64)
		_ = c.SetReadDeadline(time.Now().Add(waitFor))
		n, err := c.Read(r) // the caller's initial credit, on stream 1
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, sessHeaderSize)
		assert.Equal(t, sessData, r[0])
		assert.EqualValues(t, 1, binary.BigEndian.Uint32(r[1:5]))
		return c, in
	}
	t.Run("proven session", func(t *testing.T) {
		c, in := proven(t, "good")
		send(c, sessFrame(sessOpen, 2, []byte("wrong")))
		r := make([]byte, 64)
		_, err := c.Read(r) // stream 2 is refused: its Fin
		require.NoError(t, err)
		assert.Equal(t, sessFin, r[0])
		assert.EqualValues(t, 2, binary.BigEndian.Uint32(r[1:5]))
		send(c, sessFrame(sessData, 9, []byte("x")))
		requireClosedByServer(t, []net.Conn{c})
		_, err = recvAll(t, in)
		assert.ErrorIs(t, err, ErrIncomplete)
	})
	for name, attack := range map[string][]byte{
		"open out of order": sessFrame(sessOpen, 1, []byte("again")),
		"oversized data":    sessFrame(sessData, 1, make([]byte, sessChunk+1)),
		"fin with payload":  sessFrame(sessFin, 1, []byte("x")),
	} {
		t.Run("proven, "+name, func(t *testing.T) {
			c, in := proven(t, "tok-"+name)
			send(c, attack)
			requireClosedByServer(t, []net.Conn{c})
			_, err := recvAll(t, in)
			assert.ErrorIs(t, err, ErrIncomplete)
		})
	}
}

// A stream whose unread bytes pass its bound is broken alone.
func TestSessionStreamBound(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	sess := newSession(a, false, 16)
	v := newVstream(sess, 1)
	go func() {
		_, _ = b.Write(make([]byte, 20))
	}()
	r := bufio.NewReader(a)
	require.NoError(t, v.fill(r, 10))
	require.NoError(t, v.fill(r, 10)) // over the bound: discarded
	buf := make([]byte, 32)
	n, err := v.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, 10, n, "the bytes within the bound first")
	_, err = v.Read(buf)
	assert.ErrorIs(t, err, errStreamBacklog, "then the stream is broken")
}

// A thousand streams opened at once on a fresh session, before the caller
// has read any of them, all get through (a session is proven by its first
// expected token, whatever the order of the Opens).
func TestSessionBurstOnFreshSession(t *testing.T) {
	s, cl := countedServer(t)
	d := testDialer(t)
	ctx := context.Background()
	const n = 1000
	ins := make([]*Incoming, n)
	for i := range ins {
		ins[i] = expect(t, s, fmt.Sprintf("b%d", i))
	}
	var wg sync.WaitGroup
	for i := range ins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := d.Dial(ctx, s.Addr().String(), fmt.Sprintf("b%d", i))
			if assert.NoError(t, err) {
				assert.NoError(t, o.Send(ctx, item(i)))
				assert.NoError(t, o.Finish())
			}
		}()
	}
	for i, in := range ins {
		got, err := recvAll(t, in)
		assert.Equal(t, io.EOF, err, "stream %d", i)
		assert.Equal(t, items(i, i+1), got)
	}
	wg.Wait()
	assert.EqualValues(t, 1, cl.n.Load())
}

// Dialer.Close right after streams finished: every caller still reads its
// items and its end frame. Close writes what is queued, closes its sending
// side, and waits for the caller to close (a close with unread bytes would
// reset the connection, and a reset discards what the caller has not read).
func TestDialerCloseDeliversWhatIsQueued(t *testing.T) {
	s := listen(t)
	ctx := context.Background()
	for round := 0; round < 20; round++ {
		d := NewDialer(0)
		const streams = 16
		ins := make([]*Incoming, streams)
		for i := range ins {
			tok := fmt.Sprintf("r%d-%d", round, i)
			ins[i] = expect(t, s, tok)
			o, err := d.Dial(ctx, s.Addr().String(), tok)
			require.NoError(t, err)
			attach(t, ins[i], o)
			_, err = o.SendBatch(ctx, [][]byte{item(1), item(2)})
			require.NoError(t, err)
			require.NoError(t, o.Finish())
		}
		require.NoError(t, d.Close())
		for i, in := range ins {
			got, err := recvAll(t, in)
			require.Equal(t, io.EOF, err, "round %d stream %d", round, i)
			require.Equal(t, items(1, 3), got)
		}
	}
}

// A caller that reads nothing holds Dialer.Close for closeFlushWait at
// most; its streams are lost, as at any close.
func TestDialerCloseBoundedByCallerThatDoesNotRead(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	d := NewDialer(0)
	o, c := rawSessionCaller(t, d, "tok", WithIdleTimeout(-1))
	defer c.Close()
	_, err := c.Write(sessFrame(sessData, 1, streamFrames(func(w *frame.Writer) error { return w.WriteCredit(1 << 30) })))
	require.NoError(t, err)
	res := blockedSend(t, o) // the socket and the session's queue are full
	start := time.Now()
	require.NoError(t, d.Close())
	took := time.Since(start)
	assert.GreaterOrEqual(t, took, closeFlushWait/2, "Close gave up before its bound")
	assert.Less(t, took, closeFlushWait+waitFor/2, "Close waited past its bound")
	select {
	case err := <-res:
		assert.Error(t, err)
	case <-time.After(waitFor):
		t.Fatal("a Send blocked on the session was not released by Close")
	}
}
