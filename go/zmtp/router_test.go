package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// router serves a Router on a fresh Unix socket.
func router(t *testing.T, o Options) (*Router, *sink, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	s := newSink()
	if o.Log == nil {
		o.Log = s.log
	}
	r := ServeRouter(ln, s.handle, o)
	t.Cleanup(func() { _ = r.Close() })
	return r, s, path
}

// dealer is a DEALER socket's side of one connection, by hand: it greets
// with identity and reads the ROUTER's messages.
type dealer struct {
	c net.Conn
	r *bufio.Reader
}

func readyWith(socketType, identity string) []byte {
	body := []byte("\x05READY")
	for _, kv := range [][2]string{{"Socket-Type", socketType}, {"Identity", identity}} {
		body = append(body, byte(len(kv[0])))
		body = append(body, kv[0]...)
		body = binary.BigEndian.AppendUint32(body, uint32(len(kv[1])))
		body = append(body, kv[1]...)
	}
	return commandFrame(body)
}

func dial(t *testing.T, path, socketType, identity string) *dealer {
	t.Helper()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write(append(append([]byte(nil), greeting...), readyWith(socketType, identity)...))
	require.NoError(t, err)
	d := &dealer{c: c, r: bufio.NewReader(c)}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	var head [64]byte
	_, err = io.ReadFull(d.r, head[:])
	require.NoError(t, err)
	var p Pull
	flags, body, err := p.frame(d.r, 1<<16)
	require.NoError(t, err)
	require.NotZero(t, flags&flagCommand)
	props, err := readyProps(body)
	require.NoError(t, err)
	require.Equal(t, "ROUTER", props["socket-type"])
	return d
}

// recv reads one message (answering nothing: commands are returned as
// a one-frame message prefixed "cmd:").
func (d *dealer) recv(t *testing.T) [][]byte {
	t.Helper()
	require.NoError(t, d.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	var p Pull
	var msg [][]byte
	for {
		flags, body, err := p.frame(d.r, 1<<30)
		require.NoError(t, err)
		if flags&flagCommand != 0 {
			return [][]byte{append([]byte("cmd:"), body...)}
		}
		msg = append(msg, body)
		if flags&flagMore == 0 {
			return msg
		}
	}
}

func TestRouterSendsToThePeerOfAnIdentity(t *testing.T) {
	r, _, path := router(t, Options{})
	a, b := dial(t, path, "DEALER", "\x00\x00"), dial(t, path, "DEALER", "b")
	require.Eventually(t, func() bool { return r.Peers() == 2 }, 10*time.Second, time.Millisecond)
	assert.True(t, r.Send([]byte("\x00\x00"), []byte("\x01"), []byte("to a")))
	assert.True(t, r.Send([]byte("b"), []byte("to b")))
	assert.False(t, r.Send([]byte("c"), []byte("to nobody")), "no peer has it: dropped, as a ROUTER drops it")
	assert.Equal(t, [][]byte{[]byte("\x01"), []byte("to a")}, a.recv(t))
	assert.Equal(t, [][]byte{[]byte("to b")}, b.recv(t))
}

func TestRouterHandsOnAPeersMessagesAfterItsIdentity(t *testing.T) {
	_, s, path := router(t, Options{})
	d := dial(t, path, "DEALER", "eng")
	_, err := d.c.Write(Encode([]byte("ready"), []byte("x")))
	require.NoError(t, err)
	assert.Equal(t, [][][]byte{{[]byte("eng"), []byte("ready"), []byte("x")}}, s.wait(t, 1))
}

func TestRouterTurnsAwayASecondPeerOfAnIdentityAndOtherSocketTypes(t *testing.T) {
	r, s, path := router(t, Options{})
	first := dial(t, path, "DEALER", "eng")
	require.Eventually(t, func() bool { return r.Peers() == 1 }, 10*time.Second, time.Millisecond)
	dial(t, path, "DEALER", "eng")
	assert.Contains(t, ended(t, s), ErrIdentity.Error())
	assert.True(t, r.Send([]byte("eng"), []byte("still the first's")))
	assert.Equal(t, [][]byte{[]byte("still the first's")}, first.recv(t))

	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(append(append([]byte(nil), greeting...), ready("PUSH")...))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, l := range s.logged() {
			if strings.Contains(l, ErrSocketType.Error()) {
				return true
			}
		}
		return false
	}, 10*time.Second, time.Millisecond)
}

func TestRouterSendNeverWaitsForAPeerThatDoesNotRead(t *testing.T) {
	r, _, path := router(t, Options{})
	d := dial(t, path, "DEALER", "eng")
	require.Eventually(t, func() bool { return r.Peers() == 1 }, 10*time.Second, time.Millisecond)
	big := bytes.Repeat([]byte("y"), 64<<10)
	start := time.Now()
	const n = 200 // 12.8 MB: far beyond what the socket holds
	for i := range n {
		require.True(t, r.Send([]byte("eng"), []byte(fmt.Sprint(i)), big))
	}
	assert.Less(t, time.Since(start), 5*time.Second, "Send queued; it never waited for the reader")
	// A PING meanwhile is answered after what was queued before it.
	_, err := d.c.Write(commandFrame([]byte("\x04PING\x00\x00ctx")))
	require.NoError(t, err)
	for i := range n {
		m := d.recv(t)
		require.Len(t, m, 2)
		require.Equal(t, fmt.Sprint(i), string(m[0]), "in order, whole")
		require.Equal(t, big, m[1])
	}
	// The PONG came after the queued messages, or before them where the
	// reader took the PING first; either way whole and once.
	assert.Equal(t, [][]byte{[]byte("cmd:\x04PONGctx")}, d.recv(t))
}

func TestRouterDropsWhatGoesToAPeerThatLeft(t *testing.T) {
	r, _, path := router(t, Options{})
	d := dial(t, path, "DEALER", "eng")
	require.Eventually(t, func() bool { return r.Peers() == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, d.c.Close())
	require.Eventually(t, func() bool { return !r.Send([]byte("eng"), []byte("late")) }, 10*time.Second, time.Millisecond)
	// The same identity may connect again, as the engine's DEALER reconnects.
	again := dial(t, path, "DEALER", "eng")
	require.Eventually(t, func() bool { return r.Send([]byte("eng"), []byte("again")) }, 10*time.Second, time.Millisecond)
	assert.Equal(t, [][]byte{[]byte("again")}, again.recv(t))
}

// Sends from many goroutines while their peer comes and goes, and while the
// Router closes: none waits, none panics (a poke of a writer that left), and
// every goroutine of the Router ends with Close.
func TestRouterSendRacesWithPeersLeavingAndClose(t *testing.T) {
	for round := range 20 {
		r, _, path := router(t, Options{})
		stop := make(chan struct{})
		done := make(chan struct{})
		for range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				big := bytes.Repeat([]byte("z"), 256<<10) // queues: the peer reads nothing
				for {
					select {
					case <-stop:
						return
					default:
					}
					r.Send([]byte("eng"), []byte("m"), big)
				}
			}()
		}
		for range 5 {
			d := dial(t, path, "DEALER", "eng")
			require.Eventually(t, func() bool { return r.Peers() == 1 }, 10*time.Second, time.Millisecond)
			require.NoError(t, d.c.Close())
			require.Eventually(t, func() bool { return r.Peers() == 0 }, 10*time.Second, time.Millisecond)
		}
		if round%2 == 0 {
			dial(t, path, "DEALER", "eng")
			require.Eventually(t, func() bool { return r.Peers() == 1 }, 10*time.Second, time.Millisecond)
			require.NoError(t, r.Close()) // with a peer and its queue
		}
		close(stop)
		for range 4 {
			<-done
		}
		require.NoError(t, r.Close())
	}
}
