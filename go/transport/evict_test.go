package transport

import (
	"container/list"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
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
func startFlood(t testing.TB, s *Server, n int, every time.Duration, keep int) *flooder {
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

func (f *flooder) open(t testing.TB, keep int) {
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
func waitFull(t testing.TB, s *Server) {
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
