package transport

// Sessions (session.go, dialer.go, server_session.go) at their limits: a
// congested session, a worker that does not read, silent or stale peers,
// the Dialer's bookkeeping under churn, what an unproven session costs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// rawSessionCaller listens on loopback, accepts one session from a
// Dialer, reads its preamble and first Open and returns the connection
// (closed at the end of the test).
func rawSessionCaller(t *testing.T, d *Dialer, token string, opts ...Option) (*Outgoing, net.Conn) {
	t.Helper()
	o, c := acceptOne(t, func(addr string) (*Outgoing, error) {
		return d.Dial(context.Background(), addr, token, opts...)
	})
	pre := make([]byte, frame.HeaderSize+1)
	_, err := io.ReadFull(c, pre)
	require.NoError(t, err)
	require.Equal(t, byte(frame.Session), pre[0])
	var h [sessHeaderSize]byte
	_, err = io.ReadFull(c, h[:])
	require.NoError(t, err)
	require.Equal(t, sessOpen, h[0])
	tok := make([]byte, binary.BigEndian.Uint32(h[5:9]))
	_, err = io.ReadFull(c, tok)
	require.NoError(t, err)
	require.Equal(t, token, string(tok))
	return o, c
}

// discardListener listens on loopback and reads and discards whatever each
// connection sends, until the test ends; it returns its address.
func discardListener(t *testing.T) string {
	t.Helper()
	addr, _ := fakeCaller(t, 0, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	return addr
}

// streamFrames encodes stream frames with w, for a session Data frame.
func streamFrames(write func(w *frame.Writer) error) []byte {
	var b bytes.Buffer
	w := frame.NewWriter(&b)
	if err := write(w); err != nil {
		panic(err)
	}
	if err := w.Flush(); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// blockedSend starts a goroutine that Sends 1 MiB items on o until a Send
// fails, and waits until a Send has been blocked for 200 ms (the session's
// queue and the socket buffers are full: the caller does not read). The
// returned channel receives the error of the Send that failed.
func blockedSend(t *testing.T, o *Outgoing) <-chan error {
	t.Helper()
	var mu sync.Mutex
	last := time.Now()
	res := make(chan error, 1)
	go func() {
		big := make([]byte, 1<<20)
		for {
			if err := o.Send(context.Background(), big); err != nil {
				res <- err
				return
			}
			mu.Lock()
			last = time.Now()
			mu.Unlock()
		}
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(last) > 200*time.Millisecond
	}, waitFor, 10*time.Millisecond, "the Send never blocked")
	return res
}

// a Send blocked in vstream.Write (the session's write queue full) is
// not released when the stream is Lost. On a connection of its own, the
// reader's deferred conn.Close fails the blocked Write at once ("After Kill
// or loss, Send fails immediately"); vstream.Close only clears the write
// deadline (wdl.set(time.Time{})), which does not close the channel the
// blocked Write waits on, so the Send waits until the whole session's writer
// makes progress: for a stopped or partitioned caller, until TCP gives up
// (minutes), holding the handler's goroutine and the Outgoing's wmu.
func TestSessionCongestedSendFailsWhenLost(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	d := NewDialer(0)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	// The caller grants credit, then goes silent (SIGSTOP): it neither reads
	// nor heartbeats.
	o, c := rawSessionCaller(t, d, "tok", WithIdleTimeout(time.Second))
	_, err := c.Write(sessFrame(sessData, 1, streamFrames(func(w *frame.Writer) error { return w.WriteCredit(1 << 20) })))
	require.NoError(t, err)
	res := blockedSend(t, o)
	waitClosed(t, o.Lost(), "Lost") // the liveness check declared the caller gone
	select {
	case err := <-res:
		assert.ErrorIs(t, err, ErrLost)
	case <-time.After(time.Second):
		t.Errorf("Send still blocked 1 s after Lost")
		_ = c.Close() // release it: the session fails
		<-res
	}
}

// a Send blocked on a congested session is not released
// by the caller's Kill either; the worker's reader reads the Kill (the
// session's reader is independent of its writer) and closes its vstream,
// which does not wake the blocked Write.
func TestSessionCongestedSendFailsWhenKilled(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	d := NewDialer(0)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	o, c := rawSessionCaller(t, d, "tok", WithIdleTimeout(-1))
	_, err := c.Write(sessFrame(sessData, 1, streamFrames(func(w *frame.Writer) error { return w.WriteCredit(1 << 20) })))
	require.NoError(t, err)
	res := blockedSend(t, o)
	_, err = c.Write(sessFrame(sessData, 1, streamFrames(func(w *frame.Writer) error { return w.WriteKill() })))
	require.NoError(t, err)
	waitClosed(t, o.Killed(), "Killed")
	select {
	case err := <-res:
		assert.ErrorIs(t, err, ErrKilled)
	case <-time.After(time.Second):
		t.Errorf("Send still blocked 1 s after Killed")
		_ = c.Close()
		<-res
	}
}

// a proven worker that opens streams with unknown tokens and never
// reads makes the caller queue one Fin (9 bytes) per refused stream without
// bound: CloseWrite appends to s.out without the sessWriteQueue check that
// vstream.Write applies (which fails the session with errCtlBacklog). Up to
// 2^31 ids, ~19 GB of Fins, from ~10 bytes of input each. Shown on the
// session itself over a pipe that nobody reads, with the accept that
// openStream is for a proven session (errRefused for an unknown token).
func TestSessionRefusalsBounded(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	sess := newSession(a, false, 1<<20)
	sess.accept = func(*vstream, string) error { return errRefused }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); sess.writeLoop() }()
	go func() { defer wg.Done(); sess.readLoop(bufio.NewReaderSize(a, sessReadBuf)) }()
	defer wg.Wait()
	defer sess.close()
	// The worker writes Opens; it never reads (the pipe has no buffer: the
	// writer blocks in its first write).
	n := 2 * sessWriteQueue / sessHeaderSize
	buf := make([]byte, 0, 64<<10)
	for id := 1; id <= n; id++ {
		buf = append(buf, sessFrame(sessOpen, uint32(id), []byte("x"))...)
		if len(buf) > 60<<10 || id == n {
			if _, err := b.Write(buf); err != nil {
				break // the session failed: what the bound should do
			}
			buf = buf[:0]
		}
	}
	sess.mu.Lock()
	queued, failed := len(sess.out), sess.err
	sess.mu.Unlock()
	t.Logf("refused streams: %d, queued Fins: %d bytes, session error: %v", n, queued, failed)
	assert.True(t, failed != nil || queued <= sessWriteQueue,
		"a worker that does not read made the caller queue %d bytes (bound %d) and the session is still up", queued, sessWriteQueue)
}

// (docs/security.md: security.md "Before a token is shown a connection costs O(1)
// memory ... ~2.3-2.7 KB each"; "no stream, buffer or goroutine exists for a
// token nobody expects"): a connection that sends the 6-byte session
// preamble and then nothing gets, before any token, a 64 KiB bufio.Reader
// (sessReadBuf), a writer goroutine and a session. At MaxPendingConns that
// is ~35 MB instead of ~1.3 MB.
func TestSessionUnprovenHoldsLittle(t *testing.T) {
	s := listen(t, WithConnectTimeout(2*time.Second))
	before := heapInUse()
	var conns []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", s.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, writePreamble(c))
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond)
	grew := int64(heapInUse()) - int64(before)
	t.Logf("heap and stacks held by 100 silent sessions: %d bytes (%d per connection)", grew, grew/100)
	assert.Less(t, grew/100, int64(8<<10), "per unproven session")
	for _, c := range conns {
		_ = c.Close()
	}
}

// dialed.s and dialed.err are written by the dialling goroutine
// without d.mu (dialer.go, session: "e.s, e.err = d.connect(ctx, addr)"),
// while forget, idleSession and stream read e.s of whatever entry is in
// d.sessions[addr] under d.mu, before e.ready is closed. E.g. the idle
// timer deletes the entry and closes its session; a Dial starts a new one;
// the old session's onClosed (forget) reads the new entry's s as it is
// written. Here an old session's forget runs while a new dial is under way.
func TestDialerEntryUnderChurn(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr := discardListener(t)
	d := NewDialer(0)
	t.Cleanup(func() { require.NoError(t, d.Close()) })

	ctx := context.Background()
	for range 20 {
		old, err := d.session(ctx, addr)
		require.NoError(t, err)
		d.forget(addr, old, false) // as its onClosed would
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = d.session(ctx, addr) // dials a new session
		}()
		for spin := true; spin; {
			select {
			case <-done:
				spin = false
			default:
				d.forget(addr, old, false) // the old session's late onClosed
			}
		}
		old.close()
		cur, err := d.session(ctx, addr)
		require.NoError(t, err)
		cur.close()
	}
}

// the idle timer can be left armed but spent, and then the session
// never idles out. remove() runs onEmpty after releasing s.mu; if a new
// stream opens in between (stream() sees no timer to stop), idleSession
// arms the timer while the session has a stream; it fires, sees
// count() > 0 and returns without clearing e.timer; when that stream
// closes, idleSession sees e.timer != nil and arms nothing. The session
// (a TCP connection and two goroutines) stays until the next Dial.
// Shown by calling idleSession as the late onEmpty would.
func TestDialerIdleTimerRearmed(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr := discardListener(t)
	d := NewDialer(20 * time.Millisecond)
	t.Cleanup(func() { require.NoError(t, d.Close()) })

	ctx := context.Background()
	v, err := d.stream(ctx, addr, "a") // a stream open (its token unknown: refused later, irrelevant)
	require.NoError(t, err)
	sess := v.(*vstream).s
	d.idleSession(addr, sess) // the late onEmpty of a stream closed just before v opened
	time.Sleep(60 * time.Millisecond)
	assert.Equal(t, 1, d.Sessions(), "the session has a stream: kept")
	_ = v.Close()
	assert.Eventually(t, func() bool { return d.Sessions() == 0 }, time.Second, 5*time.Millisecond,
		"the session stays without streams, past the idle time (20 ms)")
}

// a session whose ids are exhausted (lastID == 1<<31: ~2^31 streams,
// days at 10k streams/s, as a Dialer's session is long-lived) is
// forgotten as "full" with onEmpty set to close it; but it has no stream
// left (they ran one after another), so onEmpty never runs and the idle
// timer was stopped by forget: the session's connection and goroutines are
// never released (until the Dialer closes).
func TestDialerExhaustedSessionClosed(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	addr := discardListener(t)
	d := NewDialer(0)
	t.Cleanup(func() { require.NoError(t, d.Close()) })

	ctx := context.Background()
	v, err := d.stream(ctx, addr, "a")
	require.NoError(t, err)
	old := v.(*vstream).s
	_ = v.Close()
	old.mu.Lock()
	old.lastID = 1 << 31 // as after 2^31 streams
	old.mu.Unlock()
	v, err = d.stream(ctx, addr, "b") // a new session
	require.NoError(t, err)
	assert.NotSame(t, old, v.(*vstream).s)
	_ = v.Close()
	assert.Eventually(t, func() bool {
		old.mu.Lock()
		defer old.mu.Unlock()
		return old.err != nil
	}, time.Second, 5*time.Millisecond, "the exhausted session, without streams, is closed")
}

// an unknown token on a session that no token has proved
// closes the whole session, with every stream opened on it. A worker that
// gets requests after their callers' connect timeout expired (overload:
// exactly when bursts happen) opens their streams, and these stale tokens
// keep killing the fresh session (and each redial's) under the good
// streams, which exhaust their redials: here 1 good stream beside 20 stale
// ones on a fresh session. On connections of their own the stale streams
// hurt nobody.
func TestSessionStaleTokensRefusedAlone(t *testing.T) {
	s := listen(t)
	d := NewDialer(0)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	addr := s.Addr().String()
	ctx := context.Background()
	in := expect(t, s, "good")
	var wg sync.WaitGroup
	var good *Outgoing
	for i := range 21 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := fmt.Sprintf("stale-%d", i)
			if i == 10 {
				tok = "good"
			}
			o, err := d.Dial(ctx, addr, tok)
			if !assert.NoError(t, err) {
				return
			}
			if tok == "good" {
				good = o
				return
			}
			t.Cleanup(func() { <-o.Done() })
		}()
	}
	wg.Wait()
	require.NotNil(t, good)
	select {
	case <-good.Attached():
	case <-good.Lost():
		t.Errorf("the good stream was Lost: stale tokens closed every session it was opened on")
	case <-time.After(waitFor):
		t.Errorf("the good stream never attached")
	}
	_ = good.Finish()
	_, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	waitClosed(t, good.Done(), "Done")
}

// a caller's session outlives every stream of a
// wedged worker (SIGSTOP, or a host gone with unacknowledged data, where
// keepalive does not run). Each stream ends with ErrPeerSilent, but the
// session has no liveness of its own and no idle close on the caller's
// side (only the worker's Dialer closes it), so its connection, its two
// goroutines and its 64 KiB read buffer stay until TCP gives up. A stream
// on a connection of its own releases it when it ends.
func TestSessionOfSilentWorkerReleased(t *testing.T) {
	s := listen(t, WithIdleTimeout(300*time.Millisecond), func(c *config) { c.sessionIdle = 100 * time.Millisecond })
	in := expect(t, s, "tok")
	c := rawSession(t, s)
	_, err := c.Write(sessFrame(sessOpen, 1, []byte("tok")))
	require.NoError(t, err)
	// then nothing, ever: the worker is stopped
	_, err = recvAll(t, in)
	require.ErrorIs(t, err, ErrPeerSilent)
	assert.Eventually(t, func() bool { n, _ := held(s); return n == 0 }, 2*time.Second, 10*time.Millisecond,
		"the session of a worker whose every stream went silent is released")
}

// A consumer that falls behind holds up its producer by credit alone: items
// within the window wait in the stream's queue, however large, and nothing
// of the session breaks (its reader decodes each stream's frames as they
// arrive, so no stream's bytes pile up behind a slow consumer).
func TestSessionSlowConsumerWithinCredit(t *testing.T) {
	s := listen(t)
	in := s.Expect("tok", WithWindow(16))
	t.Cleanup(func() { in.Close() })
	o := dial(t, s, "tok")
	attach(t, in, o)
	ctx := context.Background()
	big := make([]byte, 8<<20)
	for range 8 { // all within credit, none received yet
		require.NoError(t, o.Send(ctx, big))
	}
	require.NoError(t, o.Finish())
	for i := range 8 {
		b, err := in.Recv(ctx)
		require.NoError(t, err, "item %d of a stream within its credit", i)
		require.Len(t, b, len(big))
	}
	_, err := in.Recv(ctx)
	assert.Equal(t, io.EOF, err)
}

// A session without streams stays up as long as both sides live (each side
// pings when it has written nothing for a while), and a peer that falls
// silent loses its session after sessSilence.
func TestSessionPings(t *testing.T) {
	every, silence := sessPingEvery, sessSilence
	t.Cleanup(func() { sessPingEvery, sessSilence = every, silence }) // first: runs last
	sessPingEvery, sessSilence = 10*time.Millisecond, 150*time.Millisecond
	s, cl := countedServer(t)
	d := testDialer(t)
	ctx := context.Background()
	for _, tok := range []string{"a", "b"} {
		in := expect(t, s, tok)
		o, err := d.Dial(ctx, s.Addr().String(), tok)
		require.NoError(t, err)
		finishAndRead(t, in, o, nil)
		time.Sleep(4 * sessSilence) // no stream meanwhile: only pings
	}
	assert.EqualValues(t, 1, cl.n.Load(), "one session throughout")

	// A worker that proves its session, then says nothing, ever.
	in := expect(t, s, "c")
	c := rawSession(t, s)
	_, err := c.Write(sessFrame(sessOpen, 1, []byte("c")))
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	_, err = io.Copy(io.Discard, c) // the caller's credit and pings, then its close
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the silent worker's session is closed")
	_, err = recvAll(t, in)
	assert.ErrorIs(t, err, ErrIncomplete)
}
