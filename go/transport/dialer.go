package transport

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// DefaultSessionIdle is how long a Dialer keeps a session with no stream
// open before it closes it.
const DefaultSessionIdle = 60 * time.Second

// closeFlushWait bounds how long Dialer.Close waits for its sessions'
// queued frames to be written and read (session.closeGracefully).
const closeFlushWait = time.Second

// ErrDialerClosed is returned by Dialer.Dial after Close.
var ErrDialerClosed = errors.New("transport: dialer closed")

// A Dialer is the worker's side of sessions (see session.go): it keeps one
// connection per caller address and opens every stream to that caller on
// it, dialling on first use and again after the connection was lost. All
// methods are safe for concurrent use. The zero value is not usable: call
// NewDialer.
type Dialer struct {
	idle time.Duration

	mu       sync.Mutex
	closed   bool
	sessions map[string]*dialed    // the session each address's streams open on
	live     map[*session]struct{} // every session not yet ended (some full, no longer in sessions)
	wg       sync.WaitGroup        // each session's reader and writer
}

// dialed is a Dialer's session to one address, or the dial under way.
type dialed struct {
	ready chan struct{} // closed when the dial ended: s or err is set
	s     *session
	err   error
	timer *time.Timer // closes the session when it stays empty (Dialer.mu)
}

// NewDialer returns a Dialer whose sessions close after idle without
// streams (<= 0: DefaultSessionIdle).
func NewDialer(idle time.Duration) *Dialer {
	if idle <= 0 {
		idle = DefaultSessionIdle
	}
	return &Dialer{idle: idle, sessions: make(map[string]*dialed), live: make(map[*session]struct{})}
}

// Dial is the package's Dial over the Dialer's session to addr: the same
// Outgoing stream, with the same options, without a connection of its own.
func (d *Dialer) Dial(ctx context.Context, addr string, token string, opts ...Option) (*Outgoing, error) {
	return dialStream(ctx, d, addr, token, opts)
}

// Sessions returns the number of sessions open or being dialled.
func (d *Dialer) Sessions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

// Close closes every session (their streams are Lost, as if the worker's
// process had died, after the frames already queued, written within
// closeFlushWait) and waits for their goroutines. Dial fails from now on.
func (d *Dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	pending := d.sessions
	d.sessions = map[string]*dialed{}
	d.mu.Unlock()
	for _, e := range pending {
		<-e.ready // a dial under way: session closes what it made
	}
	d.mu.Lock()
	live := d.live
	d.live = map[*session]struct{}{}
	d.mu.Unlock()
	// What the streams queued goes out first: an end frame queued just
	// before Close (a request that finished as its worker shut down)
	// reaches its caller. A caller that does not read gets closeFlushWait.
	// In parallel: one such caller costs the others nothing.
	deadline := time.Now().Add(closeFlushWait)
	var wg sync.WaitGroup
	for s := range live {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.closeGracefully(deadline)
		}()
	}
	wg.Wait()
	d.wg.Wait()
	return nil
}

// stream opens a stream with token on the session to addr, dialling it if
// needed.
func (d *Dialer) stream(ctx context.Context, addr, token string) (net.Conn, error) {
	for try := 0; ; try++ {
		s, err := d.session(ctx, addr)
		if err != nil {
			return nil, err
		}
		v, err := s.open(token)
		if err == nil {
			d.mu.Lock()
			if e := d.sessions[addr]; e != nil && e.s == s && e.timer != nil {
				e.timer.Stop()
				e.timer = nil
			}
			d.mu.Unlock()
			return v, nil
		}
		if try == 2 {
			return nil, err
		}
		// The session ended (or is full) as we took it: a fresh one.
		d.forget(addr, s, errors.Is(err, errSessionFull))
	}
}

// session returns the live session to addr, dialling one if there is none.
func (d *Dialer) session(ctx context.Context, addr string) (*session, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrDialerClosed
	}
	e := d.sessions[addr]
	if e == nil {
		e = &dialed{ready: make(chan struct{})}
		d.sessions[addr] = e
		d.mu.Unlock()
		sess, err := d.connect(ctx, addr)
		d.mu.Lock()
		e.s, e.err = sess, err // under mu: forget and stream compare e.s meanwhile
		if e.err != nil && d.sessions[addr] == e {
			delete(d.sessions, addr) // the next Dial tries again
		}
		d.mu.Unlock()
		close(e.ready)
		return e.s, e.err
	}
	d.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.s, nil
}

// connect dials addr and starts a session on the connection.
func (d *Dialer) connect(ctx context.Context, addr string) (*session, error) {
	var nd net.Dialer // keepalive on by default: detects a vanished caller host
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if err := writePreamble(c); err != nil {
		_ = c.Close()
		return nil, err
	}
	// A worker's streams only read control frames: maxCtlBacklog bounds them.
	s := newSession(c, true, maxCtlBacklog)
	s.onEmpty = func(s *session) { d.idleSession(addr, s) }
	s.onClosed = func(s *session) {
		d.forget(addr, s, false)
		d.mu.Lock()
		delete(d.live, s)
		d.mu.Unlock()
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		_ = c.Close()
		return nil, ErrDialerClosed
	}
	d.live[s] = struct{}{}
	d.wg.Add(2) // under mu: never after Close's Wait started
	d.mu.Unlock()
	s.startLiveness()
	go func() {
		defer d.wg.Done()
		s.writeLoop()
	}()
	go func() {
		defer d.wg.Done()
		s.readLoop(bufio.NewReaderSize(s.conn, sessReadBuf))
	}()
	return s, nil
}

// idleSession arms the timer that closes s if it stays without streams.
func (d *Dialer) idleSession(addr string, s *session) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.sessions[addr]
	if e == nil || e.s != s || e.timer != nil {
		return
	}
	e.timer = time.AfterFunc(d.idle, func() {
		d.mu.Lock()
		if d.sessions[addr] != e || e.timer == nil {
			d.mu.Unlock()
			return
		}
		if s.count() > 0 {
			// A stream opened as the last one closed: the next empty
			// moment arms a new timer.
			e.timer = nil
			d.mu.Unlock()
			return
		}
		delete(d.sessions, addr)
		d.mu.Unlock()
		s.close()
	})
}

// forget drops s from the Dialer's sessions, so that the next Dial to addr
// dials a new one; a full session (full) closes when its last stream does.
func (d *Dialer) forget(addr string, s *session, full bool) {
	d.mu.Lock()
	if e := d.sessions[addr]; e != nil && e.s == s {
		delete(d.sessions, addr)
		if e.timer != nil {
			e.timer.Stop()
		}
	}
	d.mu.Unlock()
	if full {
		s.mu.Lock()
		s.onEmpty = func(s *session) { s.close() }
		empty := len(s.streams) == 0
		s.mu.Unlock()
		if empty {
			s.close() // no stream is left to close it
		}
	}
}

// helloOn writes the Hello with token on c, a fresh connection of its own.
func helloOn(c net.Conn, token string) (*frame.Writer, error) {
	w := frame.NewWriterSize(c, workerWriteBuf)
	err := w.WriteHello([]byte(token))
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return w, nil
}
