package transport

import (
	"container/list"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// chanListener hands the Server the connections pushed into ch (the server
// ends of net.Pipes): the test decides exactly when each is accepted.
type chanListener struct {
	ch     chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// serverOn runs a Server on ln (see Listen).
func serverOn(t *testing.T, ln net.Listener, opts ...Option) *Server {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := serve(ln, opts)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// checkCounts checks the Server's bookkeeping of connections without a
// Hello: the listed ones are those neither evicted nor done.
func checkCounts(t *testing.T, s *Server) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	listed := 0
	for _, l := range s.silent {
		require.Positive(t, l.Len(), "an empty host list is kept")
		listed += l.Len()
	}
	require.Equal(t, s.unhello-s.evicted, listed)
	require.LessOrEqual(t, s.unhello, MaxPendingConns)
	require.GreaterOrEqual(t, s.evicted, 0)
}

// A Hello arriving on the very connection that an eviction picks, over and
// over: either the stream attaches on it (and the connection works), or the
// connection is closed and the token is still expected (a redial attaches
// it). Never a closed connection attached, never a token consumed by an
// evicted connection.
func TestHelloRacesEviction(t *testing.T) {
	ln := &chanListener{ch: make(chan net.Conn), closed: make(chan struct{})}
	s := serverOn(t, ln, WithConnectTimeout(time.Minute), WithIdleTimeout(-1))
	var fifo []net.Conn
	defer func() {
		for _, c := range fifo {
			_ = c.Close()
		}
	}()
	push := func() net.Conn {
		srv, cl := net.Pipe()
		ln.ch <- srv
		return cl
	}
	for range MaxPendingConns {
		fifo = append(fifo, push())
	}
	require.Eventually(t, func() bool { _, u := held(s); return u == MaxPendingConns }, waitFor, time.Millisecond)
	time.Sleep(EvictAfter + 10*time.Millisecond)
	hello := func(c net.Conn, tok string) {
		w := frame.NewWriter(c)
		if w.WriteHello([]byte(tok)) == nil {
			_ = w.Flush()
		}
	}
	// serveRest plays the worker on c once the stream is attached there.
	serveRest := func(c net.Conn, in *Incoming, r *frame.Reader, i int) {
		go func() {
			w := frame.NewWriter(c)
			_ = w.WriteData(item(i))
			_ = w.WriteFinal()
			_ = w.Flush()
			for { // drain, until the caller closes
				if _, err := r.ReadFrame(); err != nil {
					_ = c.Close()
					return
				}
			}
		}()
		got, err := recvAll(t, in)
		require.Equal(t, io.EOF, err, "round %d", i)
		require.Equal(t, []string{string(item(i))}, got, "round %d", i)
	}
	var attachedFirst, evicted int
	for i := range 150 {
		tok := NewToken()
		in := s.Expect(tok)
		cl := fifo[0]
		fifo = fifo[1:]
		go hello(cl, tok)
		// A varying head start for the Hello: from none to its being read.
		for range rand.IntN(40) {
			runtime.Gosched()
		}
		fifo = append(fifo, push()) // at the bound: evicts the oldest due, often cl
		_ = cl.SetReadDeadline(time.Now().Add(waitFor))
		r := frame.NewReader(cl)
		f, err := r.ReadFrame()
		if err == nil {
			require.Equal(t, frame.Credit, f.Type, "round %d", i)
			attachedFirst++
			serveRest(cl, in, r, i)
		} else {
			evicted++
			_ = cl.Close()
			s.mu.Lock()
			still := s.pending[tok] == in
			s.mu.Unlock()
			in.mu.Lock()
			attached := in.conn != nil
			in.mu.Unlock()
			require.True(t, still, "round %d: evicted, yet its token was consumed", i)
			require.False(t, attached, "round %d: a closed connection attached", i)
			// The worker redials.
			srv, c2 := net.Pipe()
			go hello(c2, tok)
			ln.ch <- srv
			_ = c2.SetReadDeadline(time.Now().Add(waitFor))
			r2 := frame.NewReader(c2)
			f, err := r2.ReadFrame()
			require.NoError(t, err, "round %d: redial", i)
			require.Equal(t, frame.Credit, f.Type)
			serveRest(c2, in, r2, i)
		}
		in.Close()
		checkCounts(t, s)
	}
	t.Logf("attached on the raced connection %d times, evicted %d", attachedFirst, evicted)
}

// fromHost is a connection that claims to come from ip (see hostOf).
type fromHost struct {
	net.Conn
	ip net.IP
}

func (c *fromHost) RemoteAddr() net.Addr { return &net.TCPAddr{IP: c.ip, Port: 40000} }

// A peer with many source addresses (any local user has all of
// 127.0.0.0/8) holds one silent connection from each of 510 of them and
// keeps its two newest ones on one more address X, which then holds the
// most. Every silent connection of the 510 is due for eviction, yet the
// Server waits for X's oldest to be due before it makes room: two
// admissions per EvictAfter. A stream of a few dozen silent connections a
// second from X then keeps the connections behind them (workers') in the
// listen queue, as a flood of 200 a second did before eviction.
func TestEvictionNotThrottledByBusiestHost(t *testing.T) {
	ln := &chanListener{ch: make(chan net.Conn), closed: make(chan struct{})}
	s := serverOn(t, ln, WithConnectTimeout(time.Minute), WithIdleTimeout(-1))
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	push := func(ip net.IP) {
		srv, cl := net.Pipe()
		clients = append(clients, cl)
		ln.ch <- &fromHost{srv, ip}
	}
	x := net.IPv4(127, 0, 0, 2)
	for i := range MaxPendingConns - 2 {
		push(net.IPv4(127, 1, byte(i>>8), byte(i)))
	}
	push(x)
	push(x)
	require.Eventually(t, func() bool { _, u := held(s); return u == MaxPendingConns }, waitFor, time.Millisecond)
	time.Sleep(EvictAfter + 10*time.Millisecond)
	// 20 more from X, then a worker's connection: 510 connections are due.
	t0 := time.Now()
	for range 20 {
		push(x)
	}
	srv, cl := net.Pipe()
	clients = append(clients, cl)
	in := s.Expect("tok")
	defer in.Close()
	go func() {
		w := frame.NewWriter(cl)
		_ = w.WriteHello([]byte("tok"))
		_ = w.Flush()
	}()
	ln.ch <- &fromHost{srv, net.IPv4(127, 0, 0, 1)}
	_ = cl.SetReadDeadline(time.Now().Add(waitFor))
	f, err := frame.NewReader(cl).ReadFrame()
	took := time.Since(t0)
	_ = cl.Close() // a pipe: the Kill of in.Close would wait for a reader
	require.NoError(t, err)
	require.Equal(t, frame.Credit, f.Type)
	t.Logf("21 connections admitted at the bound in %v", took)
	require.Less(t, took, EvictAfter, "the Server waited for the busiest host's connections while 510 others were due")
	checkCounts(t, s)
}

// Close while the accept loop waits at the bound for a connection to be
// due, and while it evicts: Close returns at once, and leaves no
// connection, goroutine or host entry behind.
func TestCloseWhileMakingRoom(t *testing.T) {
	for _, due := range []bool{false, true} {
		ln := &chanListener{ch: make(chan net.Conn), closed: make(chan struct{})}
		s := serverOn(t, ln, WithConnectTimeout(time.Minute), WithIdleTimeout(-1))
		var clients []net.Conn
		for i := range MaxPendingConns {
			srv, cl := net.Pipe()
			clients = append(clients, cl)
			ln.ch <- &fromHost{srv, net.IPv4(127, 1, byte(i>>8), byte(i%7))}
		}
		require.Eventually(t, func() bool { _, u := held(s); return u == MaxPendingConns }, waitFor, time.Millisecond)
		if due {
			time.Sleep(EvictAfter + 10*time.Millisecond)
		}
		pushed := make(chan struct{})
		go func() { // evicting (due) or waiting (not due) when Close comes
			defer close(pushed)
			for range 64 {
				srv, cl := net.Pipe()
				select {
				case ln.ch <- srv:
					clients = append(clients, cl)
				case <-ln.closed:
					_ = srv.Close()
					_ = cl.Close()
					return
				}
			}
		}()
		time.Sleep(time.Millisecond)
		t0 := time.Now()
		require.NoError(t, s.Close())
		require.Less(t, time.Since(t0), EvictAfter/2, "due %v", due)
		<-pushed
		s.mu.Lock()
		assert.Empty(t, s.silent, "due %v", due)
		assert.Zero(t, s.unhello, "due %v", due)
		assert.Zero(t, s.evicted, "due %v", due)
		s.mu.Unlock()
		for _, c := range clients {
			_ = c.Close()
		}
	}
}

// victim looks at every host: with MaxPendingConns hosts (the most there
// can be) it costs what one admission at the bound may cost.
func BenchmarkVictimManyHosts(b *testing.B) {
	s := &Server{silent: make(map[string]*list.List)}
	old := time.Now().Add(-time.Second)
	for i := range MaxPendingConns {
		p := &pendingConn{host: string([]byte{127, 1, byte(i >> 8), byte(i)}), since: old.Add(time.Duration(i))}
		l := list.New()
		p.elem = l.PushBack(p)
		s.silent[p.host] = l
	}
	now := time.Now()
	b.ResetTimer()
	for range b.N {
		if v, _ := s.victim(now); v == nil {
			b.Fatal("no victim")
		}
	}
}
