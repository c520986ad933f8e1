package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// Buffer sizes of the caller's side of a connection. The read buffer decides
// how many frames one read syscall fetches (16 KiB: ~230 items of 64 bytes);
// the write buffer only ever holds a few control frames.
const (
	callerReadBuf  = 16 << 10
	callerWriteBuf = 64
)

// Acknowledged tells the stream that the worker has taken the request and
// is about to connect: the connect timeout restarts from now at the
// Server's value (Expect may have been given a longer one to cover the
// request's dispatch). It does nothing once the worker connected or the
// stream ended.
func (in *Incoming) Acknowledged() {
	s := in.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[in.token] == in && in.timer != nil {
		if in.timer.Stop() { // else it fired: connectTimedOut decides
			in.timer.Reset(s.cfg.connectTimeout)
		}
	}
}

// Incoming is the caller's side of one stream. Recv must be called from one
// goroutine at a time; Stop, Kill and Close may be called from any goroutine,
// concurrently with Recv.
type Incoming struct {
	srv       *Server
	token     string
	window    int
	threshold int // consumed items that trigger a credit grant
	linger    time.Duration
	idle      time.Duration // liveness: see liveness.go
	timer     *time.Timer
	notify    chan struct{}          // cap 1: "queue or end changed", for the one Recv
	ended     chan struct{}          // cap 1: "ended, killed or closed", for the one WaitEnd
	hook      atomic.Pointer[func()] // OnSignal's
	live      *liveness              // set at attach; nil when disabled
	silent    atomic.Bool            // the worker was declared gone by the liveness check
	deaf      atomic.Bool            // the worker left our control frames unread (see ctlWriter)

	mu     sync.Mutex
	q      ring
	err    error // how the stream ended; Recv returns it once q is empty
	killed bool  // Kill (or Close) before the end: Recv returns ErrKilled
	cause  byte  // what Kill sends: see KillCause
	closed bool  // Close: Recv returns ErrClosed
	// abandoned: closed before any worker attached and without a Kill (the
	// caller gave up on it: its dispatch failed or timed out). A worker that
	// dials it later is refused unanswered, so it never starts the request.
	abandoned bool
	stopReq   bool     // Stop was called; sent at attach if not attached yet
	conn      net.Conn // set when the worker's Hello arrives
	credit    int      // Data frames the worker may still send
	consumed  int      // items received since the last grant
	outcome   outcome  // what the Kill achieved: see KillOutcome
	onKill    func(aborted bool)
	onAttach  func() // see OnAttach

	wmu sync.Mutex // serialises writes of control frames; taken after mu
	// killSent: the Kill is written (wmu). Nothing follows it: a frame the
	// worker never reads would turn its close into a reset.
	killSent bool
	w        *frame.Writer // over ctl: writing never waits for the worker
	ctl      *ctlWriter
}

// ctlLimit is how long control frames may wait for a worker that does not
// read them: the idle timeout, after which a silent worker is gone too.
func (in *Incoming) ctlLimit() time.Duration {
	if in.idle > 0 {
		return in.idle
	}
	return DefaultIdleTimeout
}

// Token returns the stream's token.
func (in *Incoming) Token() string { return in.token }

// outcome is what a Kill achieved, once known.
type outcome uint8

const (
	outcomeUnknown outcome = iota
	outcomeAborted         // the worker read the Kill before it ended the stream
	outcomeTooLate         // the worker had ended the stream (or it had ended) first
)

// KillOutcome calls f once, when it is known, with what a Kill of this
// stream achieved: false if the stream had ended before the Kill, if the
// worker's Final, Error or Incomplete frame arrived after the Kill (the
// worker ended the request before it read the Kill: nothing was aborted),
// or if no worker ever connected (none had the request running: a Kill
// before the worker's connection waits for it, or for the connect
// timeout); true when a worker's connection closed without ending the
// stream (it read the Kill), broke, or outlived the linger. A worker that reads a Kill before
// it ends the stream sends no end frame, so the two sides agree on whether
// the Kill aborted the request. f runs at once if the outcome is already
// known, else on the stream's reader goroutine (it must not block); it is
// not called while the stream is neither killed nor ended. One f per
// stream: a later call replaces an earlier one not yet called.
func (in *Incoming) KillOutcome(f func(aborted bool)) {
	in.mu.Lock()
	if in.outcome == outcomeUnknown && !in.killed && in.err != nil {
		in.outcome = outcomeTooLate
	}
	o := in.outcome
	if o == outcomeUnknown {
		in.onKill = f
	}
	in.mu.Unlock()
	if o != outcomeUnknown {
		f(o == outcomeAborted)
	}
}

// settle records the outcome of a Kill (mu held) unless it is known, and
// returns the callback to run once mu is released (nil for none).
func (in *Incoming) settle(o outcome) func() {
	if in.outcome != outcomeUnknown {
		return nil
	}
	in.outcome = o
	f := in.onKill
	in.onKill = nil
	if f == nil {
		return nil
	}
	return func() { f(o == outcomeAborted) }
}

func (in *Incoming) signal() {
	select {
	case in.notify <- struct{}{}:
	default:
	}
	if f := in.hook.Load(); f != nil {
		(*f)()
	}
}

// signalEnd wakes WaitEnd: the stream ended, or was killed or closed.
func (in *Incoming) signalEnd() {
	select {
	case in.ended <- struct{}{}:
	default:
	}
	in.signal()
}

// end records how the stream ended, unless it already has.
func (in *Incoming) end(err error) {
	in.mu.Lock()
	if in.err == nil {
		in.err = err
	}
	var settled func()
	if in.killed {
		// Killed, and no worker ever connected (the connect timeout, the
		// Server closed): no worker was reached, so nothing was aborted.
		settled = in.settle(outcomeTooLate)
	}
	in.mu.Unlock()
	in.signalEnd()
	in.dropOffer()
	call(settled)
}

func (in *Incoming) connectTimedOut() {
	s := in.srv
	s.mu.Lock()
	mine := s.pending[in.token] == in
	if mine {
		delete(s.pending, in.token)
	}
	s.mu.Unlock()
	if mine { // else the worker connected just in time
		in.end(ErrNoConnection)
	}
}

// Recv returns the next item. It blocks until an item is available, the
// stream ends, or ctx is done (ctx.Err(): the stream itself is unaffected,
// Recv may be called again). At the end it returns io.EOF (normal end),
// *HandlerError, ErrIncomplete or an error wrapping it, ErrKilled,
// ErrServerClosed, ErrDuplicateToken, or ErrClosed, and keeps returning the
// same error.
func (in *Incoming) Recv(ctx context.Context) ([]byte, error) {
	for {
		item, err := in.TryRecv()
		if err != ErrNoItem {
			return item, err
		}
		select {
		case <-in.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ErrNoItem is TryRecv's answer while the stream is live and nothing is
// queued.
var ErrNoItem = errors.New("transport: no item queued")

// TryRecv is Recv without the wait: the next item, the stream's end (what
// Recv returns), or ErrNoItem. A consumer that does not block learns of new
// items and of the end from the hook set by OnSignal. Like Recv, it must be
// called from one goroutine at a time, and not alongside Recv.
func (in *Incoming) TryRecv() ([]byte, error) {
	in.mu.Lock()
	if err := in.stoppedLocked(); err != nil {
		in.mu.Unlock()
		return nil, err
	}
	if item, ok := in.q.pop(); ok {
		var grant int
		if in.err == nil { // after the end, credit is pointless
			in.consumed++
			if in.consumed >= in.threshold {
				grant, in.consumed = in.consumed, 0
				in.credit += grant
			}
		}
		in.mu.Unlock()
		if grant > 0 {
			in.writeControl(func(w *frame.Writer) error { return w.WriteCredit(uint32(grant)) })
		}
		return item, nil
	}
	err := in.err
	in.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return nil, ErrNoItem
}

// stoppedLocked is ErrClosed after Close, ErrKilled after a kill, else nil
// (mu held): what the reader gets from then on, queued items dropped.
func (in *Incoming) stoppedLocked() error {
	switch {
	case in.closed:
		return ErrClosed
	case in.killed:
		return ErrKilled
	}
	return nil
}

// Queued reports whether an item waits for TryRecv (none once the stream is
// killed or closed).
func (in *Incoming) Queued() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.q.len() > 0 && !in.killed && !in.closed
}

// OnSignal sets f (nil: none), called after every change that Recv would
// wake for (an item queued, the end, a kill or a close), on the goroutine
// that made it and outside the Incoming's locks; f must not block. It is
// how a consumer that does not block (TryRecv) is woken.
func (in *Incoming) OnSignal(f func()) {
	if f == nil {
		in.hook.Store(nil)
		return
	}
	in.hook.Store(&f)
}

// WaitEnd blocks until the stream has ended, or was killed or closed, and
// returns the error Recv returns once the queue is empty (ErrClosed,
// ErrKilled, or how it ended). It takes no item: what is queued stays for
// TryRecv. It wakes only for the end, not for each item, and must be
// called from one goroutine at a time.
func (in *Incoming) WaitEnd() error {
	for {
		in.mu.Lock()
		err := in.stoppedLocked()
		if err == nil {
			err = in.err
		}
		in.mu.Unlock()
		if err != nil {
			return err
		}
		<-in.ended
	}
}

// Stop asks the worker to stop generating. The first call sends Stop (or
// schedules it for right after the worker's Hello); later calls, and calls
// after the end of the stream or a Kill, do nothing. Items keep arriving
// until the worker ends the stream.
func (in *Incoming) Stop() {
	in.mu.Lock()
	if in.stopReq || in.killed || in.closed || in.err != nil {
		in.mu.Unlock()
		return
	}
	in.stopReq = true
	attached := in.conn != nil
	in.mu.Unlock()
	if attached {
		in.writeUrgent(func(w *frame.Writer) error { return w.WriteStop() })
	}
}

// Kill aborts the stream: buffered items are dropped, Recv returns ErrKilled
// from now on, and Kill is sent to the worker (now, or right after its Hello)
// before the connection is closed. Kill after the end of the stream was
// received, or a second Kill, does nothing.
func (in *Incoming) Kill() { in.KillCause(0) }

// KillCause is Kill with a cause: one byte the worker reads with
// Outgoing.KillCause (the reason code of the cancellation; 0 for none).
func (in *Incoming) KillCause(cause byte) {
	in.mu.Lock()
	if !in.killed {
		in.cause = cause
	}
	attached := in.kill()
	var settled func()
	if !in.killed && in.err != nil {
		settled = in.settle(outcomeTooLate) // the stream had ended
	}
	in.mu.Unlock()
	in.dropOffer()
	in.afterKill(attached, settled)
}

// afterKill sends the Kill (when a connection is attached), then wakes Recv
// and runs the outcome callback, in that order: the Kill is what the worker
// waits for, and waking a reader first can cost this thread (often the
// host's) another thread's wake-up before the write. The half-close that
// follows the Kill runs on a goroutine: on loopback the FIN is delivered
// inside the shutdown call, a third of a kill's time on this thread.
func (in *Incoming) afterKill(attached bool, settled func()) {
	if attached {
		in.writeKill()
	}
	in.signalEnd()
	call(settled)
	if attached {
		in.srv.spawn(func() {
			time.Sleep(KillSettle) // the worker's host first: see KillSettle
			in.finishKill()
		})
	}
}

// kill marks the stream killed (mu held) and reports whether a connection is
// attached, so the caller must send the Kill itself.
func (in *Incoming) kill() bool {
	if in.killed || in.closed || in.err != nil {
		return false
	}
	in.killed = true
	in.q.reset()
	return in.conn != nil
}

// sendKill writes Kill and half-closes: the FIN follows the Kill, and the
// reader drains whatever the worker had in flight until the worker closes
// (or the linger timeout), so closing never turns into a reset that could
// destroy the Kill before the worker reads it.
func (in *Incoming) sendKill() {
	in.writeKill()
	in.finishKill()
}

// writeKill writes the Kill frame, the last frame this side sends.
func (in *Incoming) writeKill() {
	in.mu.Lock()
	cause := in.cause
	live := in.live
	in.mu.Unlock()
	live.stop() // nothing may follow the Kill
	in.writeUrgent(func(w *frame.Writer) error {
		in.killSent = true
		return w.WriteKillCause(cause)
	})
}

// finishKill half-closes after the Kill and bounds the drain by the linger.
func (in *Incoming) finishKill() {
	// The FIN after the Kill, never before. Bounded by twice ctlLimit: the
	// write in progress and the backlog behind it (the Kill last) each have
	// ctlLimit; a Server's Close ends the wait at once.
	<-in.ctl.flushed()
	if hc, ok := in.conn.(halfCloser); ok {
		_ = hc.CloseWrite()
	}
	_ = in.conn.SetReadDeadline(time.Now().Add(in.linger))
}

// Abandon is Close for a caller that gave up on the stream before any
// worker attached (its dispatch failed, or no acknowledgement came in
// time): a worker that dials it later is refused unanswered (no Kill, no
// credit), so it never starts the request. With a worker attached, or once
// killed, it is Close.
func (in *Incoming) Abandon() error {
	in.mu.Lock()
	in.abandoned = in.conn == nil && !in.killed && !in.closed
	in.mu.Unlock()
	return in.Close()
}

// Close releases the stream: if it has not ended it is killed (see Kill), and
// Recv returns ErrClosed from now on. Close is idempotent.
func (in *Incoming) Close() error {
	in.mu.Lock()
	if in.closed {
		in.mu.Unlock()
		return nil
	}
	attached := in.kill()
	in.closed = true
	in.q.reset()
	var settled func()
	if !in.killed && in.err != nil {
		settled = in.settle(outcomeTooLate)
	}
	// Killed before a worker connected: the outcome waits for the worker's
	// connection (it reads the Kill) or the connect timeout (none came).
	in.mu.Unlock()
	in.dropOffer()
	in.afterKill(attached, settled)
	return nil
}

// writeControl writes and flushes one control frame, unless the Kill was
// written (nothing follows it). Errors are ignored: a broken connection is
// reported by the reader, which sees it too.
func (in *Incoming) writeControl(write func(*frame.Writer) error) {
	in.wmu.Lock()
	defer in.wmu.Unlock()
	if in.killSent {
		return // nothing follows the Kill (a credit a Recv computed just before it)
	}
	if write(in.w) == nil && in.w.Flush() == nil {
		in.live.didWrite()
	}
}

// writeUrgent is writeControl for a Stop or a Kill: on a session, this
// goroutine writes the frame at once (vstream.urgent) instead of waking
// the session's writer for it, a thread's wake-up on the kill's path.
func (in *Incoming) writeUrgent(write func(*frame.Writer) error) {
	in.mu.Lock()
	v, _ := in.conn.(*vstream)
	in.mu.Unlock()
	if v != nil {
		v.setUrgent(true)
		defer v.setUrgent(false)
	}
	in.writeControl(write)
}

// heartbeat writes a Heartbeat frame unless a control frame is being written
// or the stream was killed (the Kill is the last frame we send).
func (in *Incoming) heartbeat(l *liveness) bool {
	if !in.wmu.TryLock() {
		return false
	}
	defer in.wmu.Unlock()
	if l.isStopped() {
		return false
	}
	return in.w.WriteHeartbeat() == nil && in.w.Flush() == nil
}

// serve attaches the worker's connection c (its Hello already read by r),
// sends the initial credit and any early Stop or Kill, and then reads the
// stream until it ends. It runs on the connection's goroutine.
func (in *Incoming) serve(c net.Conn, r *frame.Reader) {
	live, ok := in.attach(c)
	if !ok {
		return
	}
	defer live.stop()
	for {
		f, err := r.ReadFrame()
		if err == nil {
			live.sawFrame()
		}
		if in.handle(f, err) {
			return // serveConn releases the connection
		}
	}
}

// serveOn attaches a stream of a session and serves it without a goroutine
// of its own: the session's reader hands it each frame as it decodes it
// (vstream.deliver), and closes the stream when it ends.
func (in *Incoming) serveOn(v *vstream, maxPayload int) {
	live, ok := in.attach(v)
	if !ok {
		_ = v.Close()
		return
	}
	v.deliverTo(maxPayload, func(f frame.Frame, err error) bool {
		if err == nil {
			live.sawFrame()
		}
		if in.handle(f, err) {
			live.stop()
			return true
		}
		return false
	})
}

// attach attaches the worker's connection c, sends the initial credit and
// any early Stop or Kill, and returns the stream's liveness watch; false if
// the stream is not to be served (the Server closed meanwhile, or the caller
// abandoned it: c is then closed unanswered).
func (in *Incoming) attach(c net.Conn) (*liveness, bool) {
	in.mu.Lock()
	if in.err != nil { // the Server was closed meanwhile
		in.mu.Unlock()
		return nil, false
	}
	if in.abandoned {
		in.mu.Unlock()
		_ = c.Close() // refused before any frame: the worker starts nothing
		return nil, false
	}
	in.conn = c
	// The worker stopped reading: fail the reader (see brokenErr).
	in.ctl = newCtlWriter(c, in.srv.spawn, in.ctlLimit(), failReader(c, &in.deaf))
	in.w = frame.NewWriterSize(in.ctl, callerWriteBuf)
	killed := in.killed
	if !killed {
		// The worker went silent: fail the reader (see brokenErr).
		in.live = startLiveness(in.idle, in.heartbeat, failReader(c, &in.silent))
		// Writing under mu orders these frames before any Stop, Kill or
		// credit that another goroutine sends once it sees conn set.
		in.credit = in.window
		in.writeControl(func(w *frame.Writer) error {
			if err := w.WriteCredit(uint32(in.window)); err != nil || !in.stopReq {
				return err
			}
			return w.WriteStop()
		})
	}
	live := in.live
	onAttach := in.onAttach
	in.onAttach = nil
	in.mu.Unlock()
	call(onAttach)
	if killed {
		in.sendKill() // Kill and no credit: not a single item may follow
	}
	return live, true
}

// OnAttach calls f once, when the worker's Hello attaches the stream (at
// once if it has), on the goroutine that attached it; f must not block.
// Only the worker that received the stream's token can attach it, so this
// proves that the worker has the request. One f per stream: a later call
// replaces an earlier one not yet called, and nil removes it.
func (in *Incoming) OnAttach(f func()) {
	in.mu.Lock()
	attached := in.conn != nil
	if !attached {
		in.onAttach = f
	}
	in.mu.Unlock()
	if attached {
		call(f)
	}
}

// handle applies one frame read from the worker, or the read error that
// ends the connection, and reports whether the stream's reading is over.
func (in *Incoming) handle(f frame.Frame, err error) (done bool) {
	in.mu.Lock()
	if in.killed {
		// Killed: drain until the worker closes or the linger expires.
		// An end frame means the worker ended the request before it
		// read the Kill; a close without one, that the Kill aborted it.
		var settled func()
		switch {
		case err != nil:
			settled = in.settle(outcomeAborted)
		case f.Type == frame.Final || f.Type == frame.Error || f.Type == frame.Incomplete:
			settled = in.settle(outcomeTooLate)
		}
		in.mu.Unlock()
		call(settled)
		return err != nil
	}
	if err == nil {
		switch f.Type {
		case frame.Data:
			if in.credit <= 0 {
				err = fmt.Errorf("%w: worker sent beyond its credit", ErrIncomplete)
				break
			}
			in.credit--
			in.q.push(f.Payload)
		case frame.Heartbeat:
		case frame.Final:
			err = io.EOF
		case frame.Error:
			err = &HandlerError{Message: string(f.Payload)}
		case frame.Incomplete:
			err = ErrStoppedByHandler
		default:
			err = fmt.Errorf("%w: unexpected %v frame from worker", ErrIncomplete, f.Type)
		}
	} else {
		err = in.brokenErr(err)
	}
	if err != nil && in.err == nil {
		in.err = err
	}
	in.mu.Unlock()
	switch {
	case err != nil:
		in.signalEnd()
		in.dropOffer()
	case f.Type == frame.Data:
		in.signal() // a heartbeat changes nothing a reader sees: it wakes none
	}
	return err != nil
}

// brokenErr maps a read error of the connection to the error Recv returns.
func (in *Incoming) brokenErr(err error) error {
	switch {
	case in.srv.isClosed():
		return ErrServerClosed
	case in.silent.Load():
		return ErrPeerSilent
	case in.deaf.Load():
		return ErrPeerNotReading
	case errors.Is(err, frame.ErrInvalid):
		return fmt.Errorf("%w: %v", ErrIncomplete, err)
	}
	return ErrIncomplete // EOF, reset, timeout: the worker is gone
}

// failReader returns the function that ends a stream's reader for a reason
// the reader then reports: it records why, and makes the connection's
// pending and next reads fail at once.
func failReader(c net.Conn, why *atomic.Bool) func() {
	return func() {
		why.Store(true)
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
}

// call runs f unless it is nil.
func call(f func()) {
	if f != nil {
		f()
	}
}

// ring is a FIFO of items. Flow control bounds it by the window, so it grows
// at most to the window's size and never shrinks while the stream lives.
type ring struct {
	buf     [][]byte
	head, n int
}

func (r *ring) push(b []byte) {
	if r.n == len(r.buf) {
		nb := make([][]byte, max(16, 2*len(r.buf)))
		for i := 0; i < r.n; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = b
	r.n++
}

func (r *ring) pop() ([]byte, bool) {
	if r.n == 0 {
		return nil, false
	}
	b := r.buf[r.head]
	r.buf[r.head] = nil // let the consumer own the only reference
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return b, true
}

func (r *ring) len() int { return r.n }

func (r *ring) reset() { *r = ring{} }
