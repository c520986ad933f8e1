package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A flood of silent connections to a stream port (anyone who can reach it
// can open them) must not keep workers out: at the bound a new connection
// takes the place of the oldest silent one of the busiest host, and a worker
// whose connection was dropped before its Hello was read dials again.

// flooder holds connections to addr that never send anything.
type flooder struct {
	addr   string
	mu     sync.Mutex
	conns  []net.Conn
	opened atomic.Int64
	stop   chan struct{}
	done   chan struct{}
}

// startFlood opens n silent connections to s at once, then one more every
// every (none if every is 0) until the test ends; it keeps at most keep of
// its own ends open, closing the oldest.
func startFlood(t *testing.T, s *Server, n int, every time.Duration, keep int) *flooder {
	t.Helper()
	f := &flooder{addr: s.Addr().String(), stop: make(chan struct{}), done: make(chan struct{})}
	for range n {
		f.open(t, keep)
	}
	go func() {
		defer close(f.done)
		if every == 0 {
			return
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
				f.open(nil, keep)
			}
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *flooder) open(t *testing.T, keep int) {
	c, err := net.DialTimeout("tcp", f.addr, time.Second)
	if err != nil {
		if t != nil {
			require.NoError(t, err)
		}
		return // the listen queue is full: the flood goes on
	}
	f.opened.Add(1)
	f.mu.Lock()
	f.conns = append(f.conns, c)
	if len(f.conns) > keep {
		_ = f.conns[0].Close()
		f.conns = f.conns[1:]
	}
	f.mu.Unlock()
}

func (f *flooder) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
}

// waitFull waits until s holds MaxPendingConns connections without a Hello,
// all of them old enough to be evicted.
func waitFull(t *testing.T, s *Server) {
	t.Helper()
	require.Eventually(t, func() bool { _, u := held(s); return u == MaxPendingConns }, waitFor, time.Millisecond)
	time.Sleep(EvictAfter + 20*time.Millisecond)
}

// One host floods the port with silent connections, 500 a second, for
// longer than the connect timeout (3 s); each of a run of workers gets its
// stream through meanwhile. Before eviction every one of them waited behind
// the flood until the connect timeout failed its stream (ErrNoConnection).
func TestSilentFloodDoesNotKeepWorkersOut(t *testing.T) {
	s := listen(t)
	f := startFlood(t, s, MaxPendingConns, 2*time.Millisecond, 4*MaxPendingConns)
	waitFull(t, s)
	start := time.Now()
	var slowest time.Duration
	n := 0
	for time.Since(start) < DefaultConnectTimeout+500*time.Millisecond {
		tok := NewToken()
		in := expect(t, s, tok)
		t0 := time.Now()
		o := dial(t, s, tok)
		require.NoError(t, o.Send(context.Background(), item(n)))
		b, err := in.Recv(context.Background())
		require.NoError(t, err, "worker %d, %v into the flood", n, time.Since(start))
		require.Equal(t, string(item(n)), string(b))
		slowest = max(slowest, time.Since(t0))
		finishAndRead(t, in, o, nil)
		n++
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d workers through a flood of %d silent connections; slowest attach %v", n, f.opened.Load(), slowest)
	_, u := held(s)
	assert.LessOrEqual(t, u, MaxPendingConns)
}

// A burst of real workers larger than the bound, arriving while the bound
// is held by silent connections, connects every stream: connections over
// the bound wait in the listen queue, silent ones are evicted to make room,
// and a worker evicted before its Hello was read dials again.
func TestBurstBehindSilentFloodConnectsEveryStream(t *testing.T) {
	s := listen(t)
	startFlood(t, s, MaxPendingConns, 0, MaxPendingConns)
	waitFull(t, s)
	n := MaxPendingConns + 100
	ins := make([]*Incoming, n)
	for i := range ins {
		ins[i] = expect(t, s, NewToken())
	}
	outs := make([]*Outgoing, n)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := Dial(context.Background(), s.Addr().String(), ins[i].token)
			if !assert.NoError(t, err) {
				return
			}
			outs[i] = o
			assert.NoError(t, o.Send(context.Background(), item(i)))
			assert.NoError(t, o.Finish())
		}()
	}
	for i, in := range ins {
		got, err := recvAll(t, in)
		require.Equal(t, io.EOF, err, "stream %d", i)
		require.Equal(t, []string{string(item(i))}, got, "stream %d", i)
	}
	wg.Wait()
	for _, o := range outs {
		if o != nil {
			waitClosed(t, o.Done(), "Done")
		}
	}
}

// fakeCaller listens on loopback and closes the first drop connections as
// soon as it accepts them (without reading their Hello, as an eviction
// does); it hands each later one to handle, on a goroutine of its own (nil:
// closes it too), and closes it when the test ends. It returns its address
// and the count of connections accepted.
func fakeCaller(t *testing.T, drop int, handle func(c net.Conn)) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) <= int64(drop) || handle == nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String(), &accepted
}

// relayTo is a fakeCaller handler that relays the connection to s, each
// direction's end (FIN) passed on.
func relayTo(t *testing.T, s *Server) func(net.Conn) {
	return func(c net.Conn) {
		up, err := net.Dial("tcp", s.Addr().String())
		if !assert.NoError(t, err) {
			return
		}
		t.Cleanup(func() { _ = up.Close() })
		var wg sync.WaitGroup
		relay := func(dst, src net.Conn) {
			defer wg.Done()
			_, _ = io.Copy(dst, src)
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}
		wg.Add(2)
		go relay(up, c)
		go relay(c, up)
		wg.Wait()
	}
}

// A worker whose connection the caller drops before reading its Hello
// dials again; what it sent before the caller's first frame (here the end
// of the stream, at once) is not lost with the dropped connection.
func TestDroppedBeforeHelloRedials(t *testing.T) {
	s := listen(t)
	addr, accepted := fakeCaller(t, 2, relayTo(t, s))
	in := expect(t, s, "tok")
	o, err := Dial(context.Background(), addr, "tok")
	require.NoError(t, err)
	require.NoError(t, o.Finish()) // waits for the caller's first frame
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Empty(t, got)
	waitClosed(t, o.Done(), "Done")
	assert.EqualValues(t, 3, accepted.Load())

	in = expect(t, s, "tok2")
	o, err = Dial(context.Background(), addr, "tok2") // the relay serves every later one
	require.NoError(t, err)
	require.NoError(t, o.Send(context.Background(), item(7)))
	finishAndRead(t, in, o, []string{string(item(7))})
}

// Redials are bounded: a caller that drops every connection (or no longer
// expects the token) is reported Lost after redialLimit more dials, soon.
func TestRedialsAreBounded(t *testing.T) {
	addr, accepted := fakeCaller(t, 0, nil)
	t0 := time.Now()
	o, err := Dial(context.Background(), addr, "tok")
	require.NoError(t, err)
	waitClosed(t, o.Lost(), "Lost")
	t.Logf("lost after %v", time.Since(t0))
	assert.ErrorIs(t, o.Finish(), ErrLost)
	assert.ErrorIs(t, o.Send(context.Background(), item(0)), ErrLost)
	waitClosed(t, o.Done(), "Done")
	assert.EqualValues(t, redialLimit+1, accepted.Load())
}

// A token the caller does not expect: its Server reads the Hello and
// closes; the worker redials as many times, then reports Lost.
func TestUnknownTokenLostAfterRedials(t *testing.T) {
	s := listen(t)
	o := dial(t, s, "nobody-expects-this")
	waitClosed(t, o.Lost(), "Lost")
	assert.True(t, errors.Is(o.Finish(), ErrLost))
}

// A stream ended locally (Close) before the caller's first frame is not
// redialled. The caller drops the connection only after the Close: were it
// dropped at once, the reader could be redials ahead of the Close (it was,
// 7 runs in 50 under -race).
func TestClosedBeforeAttachNotRedialled(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var accepted atomic.Int64
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(conns)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conns <- c
		}
	}()
	defer func() {
		_ = ln.Close()
		for c := range conns {
			_ = c.Close()
		}
	}()
	o, err := Dial(context.Background(), ln.Addr().String(), "tok")
	require.NoError(t, err)
	first := <-conns
	require.NoError(t, o.Close())
	_ = first.Close() // dropped before any frame, after the Close
	waitClosed(t, o.Done(), "Done")
	time.Sleep(20 * time.Millisecond)
	assert.EqualValues(t, 1, accepted.Load(), "no redial after the Close")
}
