package transport

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// Buffer sizes of the worker's side of a connection. The write buffer bounds
// how many bytes one syscall carries (16 KiB: ~230 items of 64 bytes); the
// reader only ever sees control frames, so both its buffer and its payload
// limit are tiny (anything larger is a protocol violation anyway).
const (
	workerWriteBuf   = 16 << 10
	workerReadBuf    = 512
	workerMaxPayload = 64
)

// maxCredit caps accumulated credit so that a misbehaving caller cannot
// overflow the counter.
const maxCredit = 1 << 62

// Outgoing is the worker's side of one stream. All methods are safe for
// concurrent use; concurrent Sends are serialised, each item written whole.
type Outgoing struct {
	conn   net.Conn // replaced only by redial, before the caller's first frame (mu and wmu held)
	linger time.Duration
	addr   string
	token  string
	dialer *Dialer // nil: a connection of its own
	// redialBy and redials bound redial: see redialLimit.
	redialBy time.Time
	redials  int
	live     *liveness   // nil when liveness is disabled
	silent   atomic.Bool // the caller was declared gone by the liveness check
	gate     func() bool // heartbeats only while it says so (WithHeartbeatGate; nil: always)

	stopped chan struct{} // closed on Stop
	killed  chan struct{} // closed on Kill
	lost    chan struct{} // closed on loss of the caller
	ended   chan struct{} // closed by Finish, Fail or Close: wakes blocked Sends
	done    chan struct{} // closed when the reader has exited and conn is closed
	credits chan struct{} // cap 1: "credit arrived", for blocked Sends
	// attached is closed when the caller's first frame arrives: the caller
	// has read the Hello and serves the stream on this connection.
	attached chan struct{}

	mu         sync.Mutex
	credit     int64
	isKilled   bool
	isLost     bool
	onControl  func(Event) // see OnControl
	killCause  byte        // see KillCause
	isEnded    bool
	killedLate bool // a Kill read after the end began (see readLoop, writeErr)

	wmu   sync.Mutex // serialises frame writes
	w     *frame.Writer
	wShut bool // Final or Error written: nothing may follow (wmu)
}

// Dial connects to the caller's Server at addr and sends Hello with token.
// ctx bounds the connection attempt only. Of the options, WithLinger,
// WithIdleTimeout and WithConnectTimeout apply; the last bounds redials:
// a caller that closes the connection before its first frame has not
// served the stream on it (its Server dropped the connection before it read
// the Hello, see MaxPendingConns), so the Outgoing dials again, a few times
// within the connect timeout, before it reports the caller Lost.
// The Outgoing may Send as soon as the caller's first credit arrives.
func Dial(ctx context.Context, addr string, token string, opts ...Option) (*Outgoing, error) {
	return dialStream(ctx, nil, addr, token, opts)
}

func dialStream(ctx context.Context, d *Dialer, addr string, token string, opts []Option) (*Outgoing, error) {
	cfg := newConfig(nil, opts)
	start := time.Now()
	c, w, err := dialHello(ctx, d, addr, token)
	if err != nil {
		return nil, err
	}
	o := &Outgoing{
		conn:     c,
		linger:   cfg.linger,
		addr:     addr,
		token:    token,
		dialer:   d,
		redialBy: start.Add(cfg.connectTimeout),
		stopped:  make(chan struct{}),
		killed:   make(chan struct{}),
		lost:     make(chan struct{}),
		ended:    make(chan struct{}),
		done:     make(chan struct{}),
		credits:  make(chan struct{}, 1),
		attached: make(chan struct{}),
		w:        w,
		gate:     cfg.heartbeatGate,
	}
	// The caller went silent: fail the reader, which reports it Lost. Under
	// mu, so that a redial either sees silent and gives up, or has swapped
	// the connection first and this fails the new one.
	o.live = startLiveness(cfg.idleTimeout, o.heartbeat, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		failReader(o.conn, &o.silent)()
	})
	go o.readLoop(frame.NewReaderSize(c, workerReadBuf, workerMaxPayload))
	return o, nil
}

// dialHello connects to addr with token: a stream of d's session (its Open
// carries the token), or a connection of its own when d is nil (its Hello
// does).
func dialHello(ctx context.Context, d *Dialer, addr, token string) (net.Conn, *frame.Writer, error) {
	if d != nil {
		c, err := d.stream(ctx, addr, token)
		if err != nil {
			return nil, nil, err
		}
		return c, frame.NewWriterSize(c, workerWriteBuf), nil
	}
	var nd net.Dialer // keepalive on by default: detects a vanished caller host
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // Go's default, made explicit: items must not wait
	}
	w, err := helloOn(c, token)
	if err != nil {
		return nil, nil, err
	}
	return c, w, nil
}

// redialLimit bounds redials of one stream: at most this many, the first at
// once, then after 1, 2, 4... ms, all within the connect timeout of Dial.
// A caller that no longer expects the token (its wait expired) closes every
// redial after reading its Hello, so this also bounds what that costs.
const redialLimit = 8

// redial replaces a connection the caller closed before its first frame
// (see Dial) and returns the reader of the new one; false if the stream
// must end instead: the limit is reached, the caller cannot be reached, or
// the stream was ended locally meanwhile.
func (o *Outgoing) redial() (*frame.Reader, bool) {
	o.mu.Lock()
	ok := !o.isEnded && !o.silent.Load() && o.redials < redialLimit
	n := o.redials
	o.redials++
	o.mu.Unlock()
	if !ok {
		return nil, false
	}
	// The back-off and the dial end when the stream is ended locally (Close,
	// or an end frame written after the connect timeout): Done follows.
	ctx, cancel := context.WithDeadline(context.Background(), o.redialBy)
	defer cancel()
	go func() {
		select {
		case <-o.ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	if n > 0 {
		t := time.NewTimer(time.Duration(1<<(n-1)) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, false
		}
	}
	c, w, err := dialHello(ctx, o.dialer, o.addr, o.token)
	if err != nil {
		return nil, false
	}
	o.wmu.Lock()
	o.mu.Lock()
	if o.isEnded || o.silent.Load() { // silent: see Dial
		o.mu.Unlock()
		o.wmu.Unlock()
		_ = c.Close()
		return nil, false
	}
	old := o.conn
	o.conn, o.w = c, w
	o.mu.Unlock()
	o.wmu.Unlock()
	_ = old.Close()
	return frame.NewReaderSize(c, workerReadBuf, workerMaxPayload), true
}

// halfCloser is a connection that can end its sending side alone: a TCP
// connection, or a stream of a session.
type halfCloser interface{ CloseWrite() error }

// KillSettle is how long each side of a stream waits after a Kill before
// it tears down: the worker before it closes its connection (and the
// plane's request before it releases its buffers and confirms the abort),
// the caller before it half-closes. The Kill has just woken the worker's
// host (its event loop), and on a machine with few CPUs the teardown's
// system calls and wake-ups, on either side, competed with that thread for
// a CPU. Measured on two CPUs (bench_plane.py (b), five alternating pairs
// each): the worker's wait took kill -> the remote handler wakes from
// 240-297 to 223-276 us at the median, the caller's from there to
// 196-229 us. Nothing waits for the teardown meanwhile: the caller learns
// the Kill's outcome at the worker's close, a millisecond later.
const KillSettle = time.Millisecond

// heartbeat writes a Heartbeat frame unless a write is in progress (which
// shows life anyway) or the stream's writing side is shut.
func (o *Outgoing) heartbeat(l *liveness) bool {
	if o.gate != nil && !o.gate() {
		return false // the host is stalled: fall silent (WithHeartbeatGate)
	}
	if !o.wmu.TryLock() {
		return false
	}
	defer o.wmu.Unlock()
	if o.wShut || l.isStopped() {
		return false
	}
	if o.w.WriteHeartbeat() != nil || o.w.Flush() != nil {
		return false
	}
	return true
}

// Stopped is closed when the caller sent Stop: produce no more, then Finish.
// Kill and loss do not close it.
func (o *Outgoing) Stopped() <-chan struct{} { return o.stopped }

// Killed is closed when the caller sent Kill: abort now.
func (o *Outgoing) Killed() <-chan struct{} { return o.killed }

// Attached is closed when the caller's first frame arrived: it read the
// Hello and expects the stream (a caller that gave up on it closes the
// connection instead, and Lost follows).
func (o *Outgoing) Attached() <-chan struct{} { return o.attached }

// Lost is closed when the caller's connection ended without a Kill (its
// process died, its Server closed, the network failed) or the caller
// violated the protocol: abort now. Killed and Lost never both close.
func (o *Outgoing) Lost() <-chan struct{} { return o.lost }

// Done is closed when the connection is fully released: after Kill or loss at
// once, after Finish, Fail or Close when the caller has closed its side too
// (or the linger timeout expired).
func (o *Outgoing) Done() <-chan struct{} { return o.done }

// stateErr is the error of an Outgoing that can no longer send (mu held).
func (o *Outgoing) stateErr() error {
	switch {
	case o.isKilled:
		return ErrKilled
	case o.isLost:
		return ErrLost
	case o.isEnded:
		return ErrClosed
	}
	return nil
}

// acquire takes up to want credits, waiting until at least one is available.
func (o *Outgoing) acquire(ctx context.Context, want int) (int, error) {
	for {
		o.mu.Lock()
		if err := o.stateErr(); err != nil {
			o.mu.Unlock()
			return 0, err
		}
		if o.credit > 0 {
			n := min(int64(want), o.credit)
			o.credit -= n
			o.mu.Unlock()
			return int(n), nil
		}
		o.mu.Unlock()
		select {
		case <-o.credits:
		case <-o.killed:
		case <-o.lost:
		case <-o.ended:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// writeErr maps a failed write to the reason the connection failed.
func (o *Outgoing) writeErr(err error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.killedLate {
		return ErrKilled // the caller killed the stream before our end frame got out
	}
	if e := o.stateErr(); e != nil {
		return e
	}
	return fmt.Errorf("%w: %v", ErrLost, err) // the reader will see it too
}

// Send sends one item. It blocks while the worker has no credit, until credit
// arrives, ctx is done (ctx.Err()), or the stream is killed (ErrKilled), lost
// (ErrLost) or ended (ErrClosed); those errors are returned at once when the
// state is already reached. A nil error means the item was written to the
// connection (not that the caller received it).
func (o *Outgoing) Send(ctx context.Context, item []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := o.acquire(ctx, 1); err != nil {
		return err
	}
	o.wmu.Lock()
	defer o.wmu.Unlock()
	if o.wShut {
		return ErrClosed
	}
	err := o.w.WriteData(item)
	if err == nil {
		err = o.w.Flush()
	}
	if err != nil {
		return o.writeErr(err)
	}
	o.live.didWrite()
	return nil
}

// SendBatch sends items in order, as many per write as the credit allows, and
// returns how many were written. It blocks and fails like Send; on error the
// first n items were written.
func (o *Outgoing) SendBatch(ctx context.Context, items [][]byte) (n int, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	for n < len(items) {
		k, err := o.acquire(ctx, len(items)-n)
		if err != nil {
			return n, err
		}
		m, err := o.writeBatch(items[n:n+k], nil, nil)
		if err != nil {
			return n + m, err
		}
		n += k
	}
	return n, nil
}

// TrySendBatch is SendBatch that never waits: it sends as many items as
// the credit allows now and returns how many; fewer than len(items) with
// a nil error means the credit ran out (SendBatch waits for the rest). On
// a stream of its own connection, whose write may wait for the socket, it
// sends none: only a session's stream (the default), whose writes it lets
// past the session's queue bound (the credit bounds them), never waits.
func (o *Outgoing) TrySendBatch(items [][]byte) (n int, err error) {
	return o.TrySendBatchIn(items, nil)
}

// TrySendBatchIn is TrySendBatch whose frames, on a session's stream, are
// written by b's Flush (b nil: now): the items of many streams sent in a
// row then leave in one write per session. The caller must call b.Flush.
func (o *Outgoing) TrySendBatchIn(items [][]byte, b *Batch) (n int, err error) {
	o.mu.Lock()
	if err := o.stateErr(); err != nil {
		o.mu.Unlock()
		return 0, err
	}
	v, ok := o.conn.(*vstream)
	if !ok {
		o.mu.Unlock()
		return 0, nil
	}
	k := int(min(int64(len(items)), o.credit))
	o.credit -= int64(k)
	o.mu.Unlock()
	if k == 0 {
		return 0, nil
	}
	return o.writeBatch(items[:k], v, b)
}

// writeBatch writes items, whose credit was acquired, and returns how many
// went out (on error the count may include frames still buffered: the
// stream is dead anyway). With eager, that session stream queues them
// without waiting for room (vstream.setEager).
func (o *Outgoing) writeBatch(items [][]byte, eager *vstream, b *Batch) (int, error) {
	o.wmu.Lock()
	if o.wShut {
		o.wmu.Unlock()
		return 0, ErrClosed
	}
	if eager != nil {
		eager.setEager(true, b)
	}
	m, err := o.w.WriteBatch(items)
	if err == nil {
		err = o.w.Flush()
	}
	if eager != nil {
		eager.setEager(false, nil)
	}
	o.wmu.Unlock()
	o.live.didWrite()
	if err != nil {
		return m, o.writeErr(err)
	}
	return len(items), nil
}

// Finish ends the stream normally: it sends Final, and the caller's Recv
// returns io.EOF after the items sent before. It fails with ErrKilled,
// ErrLost or ErrClosed if the stream already ended; any call ends it.
func (o *Outgoing) Finish() error {
	return o.end(func(w *frame.Writer) error { return w.WriteFinal() })
}

// Fail ends the stream with a handler error: the caller's Recv returns
// *HandlerError{Message: msg} after the items sent before. It fails like
// Finish.
func (o *Outgoing) Fail(msg string) error {
	return o.end(func(w *frame.Writer) error { return w.WriteError(msg) })
}

// Incomplete ends the stream because the handler stopped its own request:
// the caller's Recv returns ErrStoppedByHandler after the items sent before.
// It fails like Finish.
func (o *Outgoing) Incomplete(msg string) error {
	return o.end(func(w *frame.Writer) error { return w.WriteIncomplete(msg) })
}

func (o *Outgoing) end(write func(*frame.Writer) error) error {
	// Nothing but the Hello goes out before the caller's first frame: a
	// connection that the caller drops unread (see Dial) must not take the
	// end frame with it. The caller sends its credit as it reads the Hello.
	// The wait ends with the connect timeout too: no redial can follow it
	// (a caller that never reads, with liveness disabled, must not hold the
	// end forever); the end frame is then written as it was before redials.
	if wait := time.Until(o.redialBy); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-o.attached:
		case <-o.lost:
		case <-o.done:
		case <-o.ended:
		case <-t.C:
		}
		t.Stop()
	}
	o.mu.Lock()
	err := o.stateErr()
	if !o.isEnded {
		o.isEnded = true
		close(o.ended)
	}
	o.mu.Unlock()
	o.live.stop()
	if err != nil {
		return err
	}
	o.wmu.Lock()
	err = write(o.w)
	if err == nil {
		err = o.w.Flush()
	}
	o.wShut = true
	c := o.conn
	o.wmu.Unlock()
	o.halfClose(c)
	if err != nil {
		return o.writeErr(err)
	}
	return nil
}

// halfClose sends FIN after everything written and lets the reader drain the
// caller's last control frames until the caller closes, at most the linger
// timeout. Closing outright could reset the connection (unread control
// frames make the kernel send RST), destroying a Final still in flight.
func (o *Outgoing) halfClose(c net.Conn) {
	if hc, ok := c.(halfCloser); ok {
		_ = hc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(o.linger))
}

// Close ends the stream without a final marker, so the caller's Recv returns
// ErrIncomplete (use it when the handler stopped on its own or cannot go on).
// Items already sent are delivered first. After Finish or Fail, or a second
// time, Close does nothing; it never waits.
func (o *Outgoing) Close() error {
	o.mu.Lock()
	wasEnded := o.isEnded
	if !o.isEnded {
		o.isEnded = true
		close(o.ended)
	}
	c := o.conn // the last: no redial after the end
	o.mu.Unlock()
	if wasEnded {
		return nil
	}
	o.live.stop()
	// A Send blocked in a write holds wmu: the past write deadline releases it,
	// (its frame may be cut, which the caller sees as ErrIncomplete too).
	_ = c.SetWriteDeadline(time.Unix(1, 0))
	o.halfClose(c)
	return nil
}

// readLoop is the connection's one goroutine: it applies the caller's control
// frames and detects the caller's loss. It owns closing the connection.
// KillCause returns the cause byte of the caller's Kill (0 if none was sent,
// or no Kill arrived).
func (o *Outgoing) KillCause() byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.killCause
}

// Event is what the caller did to an Outgoing stream, as seen by OnControl.
type Event int

const (
	EventStop Event = iota + 1 // the caller sent Stop (at most once)
	EventKill                  // the caller sent Kill
	EventLost                  // the caller's connection broke or closed without Kill
)

// OnControl arranges for f to run, on the stream's reader goroutine, for
// each control event: at once (on the calling goroutine) for the events that
// already happened, then as they arrive. It saves the hop through a goroutine
// watching Stopped, Killed and Lost: a kill reaches f as soon as the frame is
// read. f must not block. Only one f can be set; later calls replace it.
func (o *Outgoing) OnControl(f func(Event)) {
	o.mu.Lock()
	o.onControl = f
	var past []Event
	select {
	case <-o.stopped:
		past = append(past, EventStop)
	default:
	}
	if o.isKilled {
		past = append(past, EventKill)
	}
	if o.isLost {
		past = append(past, EventLost)
	}
	o.mu.Unlock()
	for _, ev := range past {
		f(ev)
	}
}

func (o *Outgoing) readLoop(r *frame.Reader) {
	defer close(o.done)
	defer func() { _ = o.conn.Close() }() // only this goroutine replaces o.conn
	defer o.live.stop()
	attached := false
	for {
		f, err := r.ReadFrame()
		if err == nil {
			o.live.sawFrame()
			if !attached {
				attached = true
				close(o.attached)
			}
		} else if !attached {
			// Closed before the caller's first frame: not served here.
			if nr, ok := o.redial(); ok {
				r = nr
				continue
			}
		}
		o.mu.Lock()
		if o.isEnded {
			// Ended locally: drain until the caller closes or the linger
			// timeout; nothing the caller sends matters any more, except
			// that a Kill read here may have overtaken our end frame: if
			// that frame's write then fails (this loop closes the
			// connection at the caller's FIN), it failed for the Kill.
			if err == nil && f.Type == frame.Kill {
				o.killedLate = true
			}
			o.mu.Unlock()
			if err != nil {
				return
			}
			continue
		}
		if err == nil {
			switch f.Type {
			case frame.Credit:
				o.credit = min(o.credit+int64(f.Credit()), maxCredit)
				o.mu.Unlock()
				select {
				case o.credits <- struct{}{}:
				default:
				}
				continue
			case frame.Heartbeat:
				o.mu.Unlock()
				continue
			case frame.Stop:
				first := false
				select {
				case <-o.stopped:
				default:
					close(o.stopped)
					first = true
				}
				if first {
					o.unlockNotify(EventStop)
				} else {
					o.mu.Unlock()
				}
				continue
			case frame.Kill:
				if len(f.Payload) == 1 {
					o.killCause = f.Payload[0]
				}
				o.isKilled = true
				close(o.killed)
				o.unlockNotify(EventKill)
				// The connection's close (and the FIN the kernel then
				// processes on this thread) waits a moment: see KillSettle.
				time.Sleep(KillSettle)
				return
			}
		}
		// Read error or protocol violation: the caller is gone.
		o.isLost = true
		close(o.lost)
		o.unlockNotify(EventLost)
		return
	}
}

// unlockNotify releases o.mu, then tells the OnControl handler, if one is
// set, of ev (outside the lock: the handler may call back into o).
func (o *Outgoing) unlockNotify(ev Event) {
	h := o.onControl
	o.mu.Unlock()
	if h != nil {
		h(ev)
	}
}
