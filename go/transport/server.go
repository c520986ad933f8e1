package transport

import (
	"container/list"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// Limits on connections that have not presented a token yet: anyone who can
// reach the port can open them, so each costs O(1) memory (the Hello is
// read into a fixed array, before any buffer is allocated), is refused as
// soon as its Hello is longer than a token, is dropped after the connect
// timeout, and there are at most MaxPendingConns of them.
//
// At the bound, a new connection takes the place of a silent one: the
// oldest of those from the source host (IPv4 address, IPv6 /64) that holds
// the most, among the hosts whose oldest has been silent for EvictAfter;
// until one has, the new one waits, and those behind it wait in the
// kernel's listen queue. So a flood of silent connections (a few hundred a
// second from anyone who can reach the port, from one source address or
// many) cannot keep workers out, and costs the flooder its own connections
// first. A worker whose connection is dropped that way, before
// its Hello was read (a burst of real workers larger than the bound, slow
// to write their Hellos), dials again: see Dial.
const (
	// MaxTokenLen is the longest Hello payload accepted; NewToken makes 32.
	MaxTokenLen = 64
	// MaxPendingConns bounds connections accepted and still without a Hello.
	MaxPendingConns = 512
	// EvictAfter is how long a connection without a Hello is safe from
	// eviction at the bound: far above how long a worker takes to write
	// its Hello on a machine that is not starved of CPU.
	EvictAfter = 100 * time.Millisecond
)

// pendingConn is an accepted connection whose Hello has not been read.
type pendingConn struct {
	c       net.Conn
	host    string
	since   time.Time
	elem    *list.Element // in Server.silent[host] until the Hello is read or it is evicted
	evicted bool
	// A session's (see serveSession): proven once an Open showed an
	// expected token. settled: off the count of connections without Hello.
	proven  bool
	settled bool
}

// hostOf is the key by which eviction groups connections: the IPv4
// address, or the IPv6 /64 (one host may hold a whole /64).
func hostOf(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ip4 := ta.IP.To4(); ip4 != nil {
		return string(ip4)
	}
	return string(ta.IP.Mask(net.CIDRMask(64, 128)))
}

// Server accepts the connections of workers on behalf of a caller and routes
// each to the Incoming stream registered with the token of its Hello.
// All methods are safe for concurrent use.
type Server struct {
	ln  net.Listener
	cfg config

	mu      sync.Mutex
	closed  bool
	pending map[string]*Incoming  // expected, not yet connected
	conns   map[net.Conn]struct{} // accepted, not yet released
	unhello int                   // accepted connections still without a Hello
	silent  map[string]*list.List // by host: those of them not evicted, oldest first
	evicted int                   // of unhello: evicted, not yet released
	room    sync.Cond             // on mu: unhello fell, or closed (or an eviction is due)
	wg      sync.WaitGroup        // accept loop + one goroutine per connection

	fetches map[string]*fetchOffer // requests offered for fetching, by token (mu; fetch.go)
}

// Listen starts a Server on the TCP address addr (for example
// "127.0.0.1:0"). The options are the defaults of every stream it expects.
func Listen(addr string, opts ...Option) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return serve(ln, opts), nil
}

// serve runs a Server that accepts on ln.
func serve(ln net.Listener, opts []Option) *Server {
	s := &Server{
		ln:      ln,
		cfg:     newConfig(nil, opts),
		pending: make(map[string]*Incoming),
		conns:   make(map[net.Conn]struct{}),
		silent:  make(map[string]*list.List),
	}
	s.room.L = &s.mu
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Addr returns the address workers must dial.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops accepting, drops every connection abruptly (workers see Lost,
// not Killed: the caller is going away, as if its process had died) and ends
// every stream not yet ended with ErrServerClosed. It returns once every
// goroutine of the Server has exited. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	pending, conns := s.pending, s.conns
	s.pending, s.conns = nil, nil
	s.room.Broadcast()
	s.mu.Unlock()

	err := s.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
	for _, in := range pending {
		in.timer.Stop()
		in.end(ErrServerClosed)
	}
	s.wg.Wait()
	return err
}

// spawn runs f on a goroutine of the Server (one that Close waits for),
// unless the Server is closed: Close has dropped every connection then.
func (s *Server) spawn(f func()) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.wg.Add(1) // under mu, so never after Close's Wait has started
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Resource exhaustion (EMFILE...): retry after a pause rather than
			// spin, like net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		p := &pendingConn{c: c, host: hostOf(c.RemoteAddr())}
		s.mu.Lock()
		if !s.makeRoom() {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.unhello++
		p.since = time.Now()
		l := s.silent[p.host]
		if l == nil {
			l = list.New()
			s.silent[p.host] = l
		}
		p.elem = l.PushBack(p)
		s.conns[c] = struct{}{}
		s.wg.Add(1) // under mu, so never after Close's Wait has started
		s.mu.Unlock()
		go s.serveConn(p)
	}
}

// makeRoom waits (mu held) until there is room for one more connection
// without a Hello, evicting a silent one when one is due (see EvictAfter).
// It returns false if the Server closed.
func (s *Server) makeRoom() bool {
	for s.unhello >= MaxPendingConns && !s.closed {
		if s.unhello-s.evicted < MaxPendingConns {
			s.room.Wait() // an evicted connection is on its way out
			continue
		}
		v, wait := s.victim(time.Now())
		if v == nil {
			t := time.AfterFunc(wait, func() {
				s.mu.Lock()
				s.room.Broadcast()
				s.mu.Unlock()
			})
			s.room.Wait()
			t.Stop()
			continue
		}
		s.unlist(v)
		v.evicted = true
		s.evicted++
		s.mu.Unlock()
		_ = v.c.Close() // its serveConn's read fails at once
		s.mu.Lock()
	}
	return !s.closed
}

// victim (mu held) is the connection to evict: the oldest of the host
// holding the most silent connections, among the hosts whose oldest is due;
// otherwise nil and how long until one is. Hosts whose connections are all
// recent are passed over, not waited for: else a peer with many source
// addresses (one silent connection on each, two recent ones on another)
// would hold the Server to two admissions per EvictAfter.
func (s *Server) victim(now time.Time) (*pendingConn, time.Duration) {
	var most *list.List
	wait := EvictAfter
	for _, l := range s.silent {
		front := l.Front().Value.(*pendingConn)
		if age := now.Sub(front.since); age < EvictAfter {
			wait = min(wait, EvictAfter-age)
			continue
		}
		if most == nil || l.Len() > most.Len() ||
			l.Len() == most.Len() && front.since.Before(most.Front().Value.(*pendingConn).since) {
			most = l
		}
	}
	if most == nil {
		return nil, wait
	}
	return most.Front().Value.(*pendingConn), 0
}

// unlist removes p from the silent connections (mu held).
func (s *Server) unlist(p *pendingConn) {
	l := s.silent[p.host]
	l.Remove(p.elem)
	p.elem = nil
	if l.Len() == 0 {
		delete(s.silent, p.host)
	}
}

// serveConn is the one goroutine of an accepted connection: it reads the
// Hello, attaches the connection to its Incoming and then is that stream's
// reader until the stream ends.
func (s *Server) serveConn(p *pendingConn) {
	c := p.c
	defer s.wg.Done()
	defer s.release(c)
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // Go's default, made explicit: control frames must not wait
	}
	_ = c.SetReadDeadline(p.since.Add(s.cfg.connectTimeout))
	kind, token, ok := readHello(c)
	if ok && kind == frame.Session {
		s.serveSession(p)
		return
	}
	if ok && kind == frame.Fetch {
		s.serveFetch(p, token)
		return
	}
	s.mu.Lock()
	if p.evicted {
		// Evicted (closed) as, or before, its Hello was read: its worker
		// dials again, and finds its stream still expected.
		ok = false
	}
	s.settle(p)
	var in *Incoming
	if ok {
		if in = s.pending[token]; in != nil {
			delete(s.pending, in.token) // one connection per token
		}
	}
	if in == nil {
		delete(s.conns, c) // before room is used: conns stays within the bound too (nil after Close: no-op)
	}
	s.mu.Unlock()
	if in == nil {
		return // no Hello, or an unknown token: the caller does not await it
	}
	_ = c.SetReadDeadline(time.Time{})
	in.timer.Stop()
	in.serve(c, frame.NewReaderSize(c, callerReadBuf, s.cfg.maxPayload))
}

// readHello reads the first frame of a connection straight from it into a
// fixed array: no buffer is allocated for a peer that has not shown a token,
// and nothing beyond the frame is consumed (the worker sends nothing else
// before its first credit, but a heartbeat may follow). It is either a Hello
// (the token of the connection's one stream; one longer than MaxTokenLen is
// refused from its header), the frame.Session frame of a session, whose
// streams then show their tokens in their Open frames, or a frame.Fetch
// with the token whose request the connection fetches (fetch.go).
func readHello(c io.Reader) (frame.Type, string, bool) {
	var buf [frame.HeaderSize + MaxTokenLen]byte
	if _, err := io.ReadFull(c, buf[:frame.HeaderSize]); err != nil {
		return 0, "", false
	}
	t := frame.Type(buf[0])
	n := binary.BigEndian.Uint32(buf[1:frame.HeaderSize])
	switch {
	case t == frame.Session && n == 1:
	case t != frame.Hello && t != frame.Fetch || n == 0 || n > MaxTokenLen:
		return 0, "", false
	}
	p := buf[frame.HeaderSize : frame.HeaderSize+int(n)]
	if _, err := io.ReadFull(c, p); err != nil {
		return 0, "", false
	}
	if t == frame.Session {
		return t, "", p[0] == SessionVersion
	}
	return t, string(p), true
}

func (s *Server) release(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Expect registers a stream awaited with the given token and returns it. Call
// it before sending the request that carries the token, so the worker's
// connection always finds it. The options override the Server's for this
// stream (WithConnectTimeout, WithWindow). A token is matched once: it is
// unregistered when its worker connects or the connect timeout expires.
func (s *Server) Expect(token string, opts ...Option) *Incoming {
	cfg := newConfig(&s.cfg, opts)
	in := &Incoming{
		srv:       s,
		token:     token,
		window:    cfg.window,
		threshold: max(1, cfg.window/2),
		linger:    cfg.linger,
		idle:      cfg.idleTimeout,
		notify:    make(chan struct{}, 1),
		ended:     make(chan struct{}, 1),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		in.err = ErrServerClosed
	case s.pending[token] != nil:
		in.err = ErrDuplicateToken
	default:
		s.pending[token] = in
		in.timer = time.AfterFunc(cfg.connectTimeout, in.connectTimedOut)
	}
	return in
}
