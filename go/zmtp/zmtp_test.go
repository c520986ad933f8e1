package zmtp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sink collects the messages a Pull hands over, and why connections ended.
type sink struct {
	mu   sync.Mutex
	msgs [][][]byte
	logs []string
	got  chan struct{}
}

func newSink() *sink { return &sink{got: make(chan struct{}, 1<<16)} }

func (s *sink) handle(frames [][]byte) error {
	s.mu.Lock()
	s.msgs = append(s.msgs, frames)
	s.mu.Unlock()
	s.got <- struct{}{}
	return nil
}

func (s *sink) log(format string, args ...any) {
	s.mu.Lock()
	s.logs = append(s.logs, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *sink) wait(t *testing.T, n int) [][][]byte {
	t.Helper()
	for range n {
		select {
		case <-s.got:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d messages of %d", len(s.messages()), n)
		}
	}
	return s.messages()
}

func (s *sink) messages() [][][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][][]byte(nil), s.msgs...)
}

func (s *sink) logged() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.logs...)
}

// pull serves a Pull on a fresh Unix socket, as ZeroMQ's ipc:// binds one.
func pull(t *testing.T, o Options) (*Pull, *sink, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "out")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	s := newSink()
	if o.Log == nil {
		o.Log = s.log
	}
	p := Serve(ln, s.handle, o)
	t.Cleanup(func() { _ = p.Close() })
	return p, s, path
}

func push(t *testing.T, path string) *Push {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	p, err := NewPush(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func TestMessagesArriveWholeAndInOrder(t *testing.T) {
	_, s, path := pull(t, Options{})
	p := push(t, path)
	long := bytes.Repeat([]byte("x"), 70_000)
	var want [][][]byte
	for i := range 200 {
		frames := [][]byte{[]byte(fmt.Sprintf("m%d", i))}
		if i%3 == 0 {
			frames = append(frames, long, []byte{})
		}
		want = append(want, frames)
		require.NoError(t, p.Send(frames...))
	}
	assert.Equal(t, want, s.wait(t, len(want)))
}

func TestPeersAreReadSideBySide(t *testing.T) {
	_, s, path := pull(t, Options{})
	a, b := push(t, path), push(t, path)
	for i := range 50 {
		require.NoError(t, a.Send([]byte(fmt.Sprintf("a%d", i))))
		require.NoError(t, b.Send([]byte(fmt.Sprintf("b%d", i))))
	}
	got := s.wait(t, 100)
	next := map[byte]int{}
	for _, m := range got {
		name := m[0]
		assert.Equal(t, fmt.Sprintf("%c%d", name[0], next[name[0]]), string(name), "each peer's order holds")
		next[name[0]]++
	}
	assert.Equal(t, map[byte]int{'a': 50, 'b': 50}, next)
}

// rawPeer greets like a PUSH socket by hand, then lets the test write.
func rawPeer(t *testing.T, path string, socketType string) (net.Conn, *bytes.Buffer) {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write(append(append([]byte(nil), greeting...), ready(socketType)...))
	require.NoError(t, err)
	got := &bytes.Buffer{}
	var head [64 + 2]byte
	_, err = io.ReadFull(c, head[:])
	require.NoError(t, err)
	got.Write(head[:])
	return c, got
}

func TestAPingIsAnsweredWithItsContext(t *testing.T) {
	_, s, path := pull(t, Options{})
	c, _ := rawPeer(t, path, "PUSH")
	// The rest of the Pull's READY, then a PING of TTL 0 and context "abc".
	rest := make([]byte, len(ready("PULL"))-2)
	_, err := io.ReadFull(c, rest)
	require.NoError(t, err)
	_, err = c.Write(commandFrame([]byte("\x04PING\x00\x00abc")))
	require.NoError(t, err)
	pong := make([]byte, 2+5+3)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadFull(c, pong)
	require.NoError(t, err)
	assert.Equal(t, commandFrame([]byte("\x04PONGabc")), pong)
	// Messages go on after it.
	_, err = c.Write(Encode([]byte("after")))
	require.NoError(t, err)
	assert.Equal(t, [][][]byte{{[]byte("after")}}, s.wait(t, 1))
}

// ended waits until the Pull logged a connection's end, and returns it.
func ended(t *testing.T, s *sink) string {
	t.Helper()
	require.Eventually(t, func() bool { return len(s.logged()) > 0 }, 10*time.Second, time.Millisecond)
	return s.logged()[0]
}

func TestPeersThatAreNotPushAreTurnedAway(t *testing.T) {
	for _, typ := range []string{"PULL", "DEALER", "PUB", ""} {
		t.Run(typ, func(t *testing.T) {
			_, s, path := pull(t, Options{})
			c, _ := rawPeer(t, path, typ)
			_, _ = c.Write(Encode([]byte("no")))
			assert.Contains(t, ended(t, s), ErrSocketType.Error())
			assert.Empty(t, s.messages())
		})
	}
}

func TestBadInputEndsItsConnectionOnly(t *testing.T) {
	mech := append([]byte(nil), greeting...)
	copy(mech[12:32], "PLAIN\x00")
	v2 := append([]byte(nil), greeting...)
	v2[10] = 2
	long := []byte{flagLong}
	long = binary.BigEndian.AppendUint64(long, 1<<40)
	cases := map[string][]byte{
		"not zmtp":               []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 40))),
		"another mechanism":      mech,
		"zmtp 2":                 v2,
		"a message before ready": append(append([]byte(nil), greeting...), Encode([]byte("x"))...),
		"bad flags":              append(append(append([]byte(nil), greeting...), ready("PUSH")...), 0x80, 0),
		"a huge frame":           append(append(append([]byte(nil), greeting...), ready("PUSH")...), long...),
		"a command with more":    append(append(append([]byte(nil), greeting...), ready("PUSH")...), flagCommand|flagMore, 0),
		"a ready cut short":      append(append([]byte(nil), greeting...), commandFrame([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x09PU"))...),
		"a command mid-message":  append(append(append(append([]byte(nil), greeting...), ready("PUSH")...), Encode([]byte("a"), []byte("b"))[:3]...), commandFrame([]byte("\x04PING\x00\x00"))...),
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			_, s, path := pull(t, Options{})
			c, err := net.Dial("unix", path)
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write(input)
			require.NoError(t, err)
			ended(t, s)
			assert.Empty(t, s.messages())
			// The Pull still serves others.
			require.NoError(t, push(t, path).Send([]byte("ok")))
			assert.Equal(t, [][][]byte{{[]byte("ok")}}, s.wait(t, 1))
		})
	}
}

func TestAMessageOverTheLimitEndsItsConnection(t *testing.T) {
	_, s, path := pull(t, Options{MaxMessage: 1000})
	p := push(t, path)
	require.NoError(t, p.Send(make([]byte, 600)))
	require.NoError(t, p.Send(make([]byte, 500), make([]byte, 500)))
	assert.Contains(t, ended(t, s), ErrTooLarge.Error())
	assert.Len(t, s.messages(), 1, "the first message, under the limit, came")
}

func TestAConnectionThatEndsMidMessageDeliversNothingOfIt(t *testing.T) {
	_, s, path := pull(t, Options{})
	c, _ := rawPeer(t, path, "PUSH")
	rest := make([]byte, len(ready("PULL"))-2) // read all the Pull sent, so the close is orderly
	_, err := io.ReadFull(c, rest)
	require.NoError(t, err)
	whole := Encode([]byte("first"), []byte("second"))
	_, err = c.Write(whole[:len(whole)-3])
	require.NoError(t, err)
	require.NoError(t, c.Close())
	assert.Contains(t, ended(t, s), io.ErrUnexpectedEOF.Error())
	assert.Empty(t, s.messages())
}

func TestCloseEndsEveryConnectionAndHandlerCall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	release := make(chan struct{})
	calls := make(chan struct{}, 1)
	p := Serve(ln, func([][]byte) error {
		calls <- struct{}{}
		<-release
		return nil
	}, Options{})
	busy := push(t, path)
	idle := push(t, path)
	require.NoError(t, busy.Send([]byte("x")))
	<-calls
	closed := make(chan struct{})
	go func() {
		assert.NoError(t, p.Close())
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a handler call ran")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	require.NoError(t, p.Close(), "idempotent")
	// Both peers see their connection closed.
	for _, peer := range []*Push{busy, idle} {
		require.NoError(t, peer.c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := peer.r.ReadByte()
		var ne net.Error
		if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			assert.False(t, errors.As(err, &ne) && ne.Timeout(), "closed, not silent: %v", err)
		}
		assert.Error(t, err)
	}
	_, err = net.Dial("unix", path)
	assert.Error(t, err, "nothing listens after Close")
}

func TestAHandlerErrorEndsItsConnection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	s := newSink()
	p := Serve(ln, func(frames [][]byte) error {
		if string(frames[0]) == "bad" {
			return fmt.Errorf("refused")
		}
		return s.handle(frames)
	}, Options{Log: s.log})
	defer p.Close()
	c := push(t, path)
	require.NoError(t, c.Send([]byte("bad")))
	_ = c.Send([]byte("lost")) // may find the connection closed already
	assert.Contains(t, ended(t, s), "refused")
	assert.Empty(t, s.messages())
}

func FuzzPullNeverPanics(f *testing.F) {
	f.Add(append(append([]byte(nil), greeting...), ready("PUSH")...))
	f.Add(append(append(append([]byte(nil), greeting...), ready("PUSH")...), Encode([]byte("a"), []byte("b"))...))
	f.Add([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0})
	f.Fuzz(func(t *testing.T, input []byte) {
		a, b := net.Pipe()
		p := newPull(nil, func([][]byte) error { return nil }, Options{MaxMessage: 1 << 16}, "PULL", "PUSH")
		done := make(chan error, 1)
		go func() { done <- p.read(a, nil) }()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		_, _ = b.Write(input)
		_ = b.Close()
		<-done
		_ = a.Close()
	})
}

func TestEmptyFramesCountTowardTheLimit(t *testing.T) {
	_, s, path := pull(t, Options{MaxMessage: 100 * FrameOverhead})
	p := push(t, path)
	frames := make([][]byte, 200)
	_ = p.Send(frames...)
	assert.Contains(t, ended(t, s), ErrTooLarge.Error())
	assert.Empty(t, s.messages())
}

func TestPeersBeyondTheCapAreClosedAndSilentOnesTimeOut(t *testing.T) {
	p, s, path := pull(t, Options{MaxPeers: 2, HandshakeTimeout: 100 * time.Millisecond})
	a, b := push(t, path), push(t, path)
	require.Eventually(t, func() bool { return p.Peers() == 2 }, 10*time.Second, time.Millisecond)
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err, "the third is closed at once")
	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return p.Peers() == 1 }, 10*time.Second, time.Millisecond)
	silent, err := net.Dial("unix", path) // greets nothing
	require.NoError(t, err)
	defer silent.Close()
	start := time.Now()
	_, _ = io.Copy(io.Discard, silent) // until the Pull closes it
	assert.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, b.Send([]byte("still")))
	assert.Equal(t, [][][]byte{{[]byte("still")}}, s.wait(t, 1))
}

func TestAPeerThatPingsAndNeverReadsIsDropped(t *testing.T) {
	p, s, path := pull(t, Options{HandshakeTimeout: 100 * time.Millisecond})
	c, _ := rawPeer(t, path, "PUSH")
	// PINGs, their PONGs never read: once the socket's buffers are full, a
	// PONG waits, and the Pull gives up on the peer after HandshakeTimeout.
	ping := bytes.Repeat(commandFrame([]byte("\x04PING\x00\x00abcdefghijklmnop")), 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := c.Write(ping); err != nil {
				return // the Pull closed it
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a peer that never reads its PONGs is held")
	}
	assert.Contains(t, ended(t, s), "i/o timeout")
	require.Eventually(t, func() bool { return p.Peers() == 0 }, 10*time.Second, time.Millisecond)
}
