package transport

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// vstream is one stream of a session, as a net.Conn: what a stream's own
// connection would be, so the stream code runs on it unchanged.
type vstream struct {
	s  *session
	id uint32

	mu     sync.Mutex
	buf    []byte // unread bytes
	off    int
	fin    bool  // the peer's Fin arrived
	err    error // the session failed, or the stream broke its bound
	closed bool  // Close was called
	wfin   bool  // our Fin is queued
	rdl    deadline
	wdl    deadline
	notify chan struct{} // cap 1: bytes, Fin, error, close or read deadline
	outGen uint64        // s.gen+1 while some of its frames wait in s.out (s.mu)
	// finQueued: CloseWrite queued our Fin (or found the session ended);
	// s.mu. Write checks it where it queues, under the same lock: wfin
	// and closed, read before, may be set by the time it queues.
	finQueued bool
	// eager: Write queues its bytes however many the session holds
	// (setEager: the Outgoing's TrySendBatch, whose frames the stream's
	// credit bounds); mu. batch, when set with it: Write leaves the write
	// of what it queued to the batch's Flush (Outgoing.TrySendBatchIn).
	eager bool
	batch *Batch
	// urgent: Write writes what it queued itself, at once (a caller's Stop
	// or Kill: Incoming.writeUrgent), where other frames wait for the
	// session's writer, which writes all that queued meanwhile in one
	// write; mu.
	urgent bool

	// Delivery (deliverTo): frames go to sink as the session's reader
	// decodes them, instead of waiting in buf for Read.
	sink   func(frame.Frame, error) bool
	maxPay int
	dec    []byte     // bytes not yet decoded (the session's reader only)
	dmu    sync.Mutex // serialises calls of sink
	ended  bool       // sink reported the end, or was given an error (dmu)
}

func newVstream(s *session, id uint32) *vstream {
	v := &vstream{s: s, id: id, notify: make(chan struct{}, 1)}
	v.rdl.wake = v.signal
	return v
}

func (v *vstream) signal() {
	select {
	case v.notify <- struct{}{}:
	default:
	}
}

// fill appends n bytes of the session reader to the stream's unread bytes.
// The bytes are buffered first (r holds a whole session frame: see
// sessReadBuf), so v.mu is never held while the connection is read: a
// caller's Kill on this stream must not wait for a worker's next bytes.
func (v *vstream) fill(r *bufio.Reader, n int) error {
	p, err := r.Peek(n)
	if err != nil {
		return err
	}
	defer func() { _, _ = r.Discard(n) }()
	v.mu.Lock()
	if v.closed || v.err != nil {
		v.mu.Unlock()
		return nil
	}
	if v.sink != nil {
		v.mu.Unlock()
		v.dmu.Lock()
		defer v.dmu.Unlock()
		switch {
		case v.ended:
		case len(v.dec)+n > v.s.recvMax:
			v.endLocked(errStreamBacklog)
		default:
			v.dec = append(v.dec, p...)
			v.decodeLocked()
		}
		return nil
	}
	if v.off > 0 && v.off == len(v.buf) {
		v.buf, v.off = v.buf[:0], 0
	}
	if len(v.buf)-v.off+n > v.s.recvMax {
		v.err = errStreamBacklog
		v.mu.Unlock()
		v.signal()
		return nil
	}
	if v.off > 0 && cap(v.buf)-len(v.buf) < n {
		m := copy(v.buf, v.buf[v.off:]) // compact before growing
		v.buf, v.off = v.buf[:m], 0
	}
	v.buf = append(v.buf, p...)
	v.mu.Unlock()
	v.signal()
	return nil
}

func (v *vstream) peerFin() {
	v.mu.Lock()
	v.fin = true
	sink := v.sink != nil
	v.mu.Unlock()
	v.signal()
	if sink {
		v.dmu.Lock()
		defer v.dmu.Unlock()
		err := io.EOF
		if len(v.dec) > 0 {
			err = io.ErrUnexpectedEOF // the worker ended inside a frame
		}
		v.endLocked(err)
	}
}

func (v *vstream) broken(err error) {
	v.mu.Lock()
	if v.err == nil {
		v.err = err
	}
	sink := v.sink != nil
	v.mu.Unlock()
	v.signal()
	if sink {
		v.endWith(err)
	}
}

// deliverTo makes the session's reader hand the stream's frames to sink as
// it decodes them (items up to maxPayload), in order, instead of keeping
// the bytes for Read: a caller's stream needs no goroutine of its own then.
// sink returns true when the stream's reading is over; it is called at most
// once with an error (the peer's Fin: io.EOF; a malformed frame; the
// session's failure; the read deadline: os.ErrDeadlineExceeded), which ends
// it too. Then the stream is closed. sink must not block. Call it on the
// session's reader (where the stream was opened), before any of its bytes.
func (v *vstream) deliverTo(maxPayload int, sink func(frame.Frame, error) bool) {
	v.mu.Lock()
	v.sink, v.maxPay = sink, maxPayload
	v.mu.Unlock()
	v.rdl.setWake(func() {
		// The deadline passed: deliver it, off the deadline's lock and
		// off whatever goroutine moved it.
		v.s.goSpawn(v.deadlinePassed)
	})
}

// decodeLocked hands sink every whole frame in dec (dmu held).
func (v *vstream) decodeLocked() {
	off := 0
	for {
		f, n, err := frame.Decode(v.dec[off:], v.maxPay)
		if err != nil {
			v.endLocked(err)
			return
		}
		if n == 0 {
			break
		}
		off += n
		if v.sink(f, nil) {
			v.ended = true
			_ = v.Close()
			return
		}
	}
	m := copy(v.dec, v.dec[off:])
	v.dec = v.dec[:m]
}

// endWith ends a delivered stream with err, unless it ended.
func (v *vstream) endWith(err error) {
	v.dmu.Lock()
	defer v.dmu.Unlock()
	v.endLocked(err)
}

func (v *vstream) endLocked(err error) {
	if v.ended {
		return
	}
	v.ended = true
	v.dec = nil
	v.sink(frame.Frame{}, err)
	_ = v.Close()
}

// deadlinePassed ends a delivered stream whose read deadline passed (a
// linger after a kill, a silent or deaf peer), unless the deadline moved.
func (v *vstream) deadlinePassed() {
	if v.rdl.passed() {
		v.endWith(os.ErrDeadlineExceeded)
	}
}

// Read reads the stream's bytes: at its peer's Fin io.EOF, when the session
// failed its error, after the read deadline os.ErrDeadlineExceeded.
func (v *vstream) Read(p []byte) (int, error) {
	for {
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			return 0, net.ErrClosed
		}
		if v.off < len(v.buf) {
			n := copy(p, v.buf[v.off:])
			v.off += n
			v.mu.Unlock()
			return n, nil
		}
		switch {
		case v.err != nil:
			err := v.err
			v.mu.Unlock()
			return 0, err
		case v.fin:
			v.mu.Unlock()
			return 0, io.EOF
		case v.rdl.passed():
			v.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		v.mu.Unlock()
		<-v.notify
	}
}

// Write queues p for the session's writer. A worker's stream waits while the
// session holds sessWriteQueue bytes (until its write deadline); a caller's
// never waits: its writes are control frames, and a worker that lets that
// much pile up does not read its connection, which fails the session.
func (v *vstream) Write(p []byte) (int, error) {
	s := v.s
	for {
		v.mu.Lock()
		closed, wfin, err, eager, batch, urgent := v.closed, v.wfin, v.err, v.eager, v.batch, v.urgent
		v.mu.Unlock()
		switch {
		case closed:
			return 0, net.ErrClosed
		case wfin:
			return 0, errWriteAfterFin
		case err == errStreamBacklog:
			return 0, err
		}
		if v.wdl.passed() {
			return 0, os.ErrDeadlineExceeded
		}
		if h := testHookWriteChecked.Load(); h != nil {
			(*h)(v)
		}
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return 0, err
		}
		if v.finQueued {
			// Closed since the check above (the Outgoing's reader closes
			// the stream at the caller's Fin while its end frame is being
			// written): nothing may follow the Fin, which the caller reads
			// as the end; a frame queued behind it would be dropped there
			// unseen while this write reported it sent.
			s.mu.Unlock()
			return 0, errWriteAfterFin
		}
		if len(s.out) < sessWriteQueue || len(p) == 0 || eager {
			for n := 0; n < len(p); n += sessChunk {
				s.queueQuiet(&s.out, sessData, v.id, p[n:min(n+sessChunk, len(p))])
				v.outGen = s.gen + 1
			}
			switch {
			case batch != nil:
				s.mu.Unlock()
				batch.add(s)
			case urgent:
				s.mu.Unlock()
				s.flushDirect()
			default:
				s.signal()
				s.mu.Unlock()
			}
			return len(p), nil
		}
		if !s.dialer {
			s.mu.Unlock()
			s.fail(errCtlBacklog)
			return 0, errCtlBacklog
		}
		room := s.room
		s.mu.Unlock()
		wc := v.wdl.channel()
		select {
		case <-room:
		case <-wc:
		}
	}
}

// setUrgent makes Write write at once (see urgent).
func (v *vstream) setUrgent(on bool) {
	v.mu.Lock()
	v.urgent = on
	v.mu.Unlock()
}

// setEager makes Write never wait for room in the session, and leave its
// write to b when b is not nil (see eager).
func (v *vstream) setEager(on bool, b *Batch) {
	v.mu.Lock()
	v.eager, v.batch = on, b
	v.mu.Unlock()
}

var errWriteAfterFin = errors.New("transport: write after CloseWrite")

// testHookWriteChecked, when set (by tests only), runs in Write between
// its check of the stream's state and its queueing.
var testHookWriteChecked atomic.Pointer[func(*vstream)]

// CloseWrite queues the stream's Fin after its bytes.
func (v *vstream) CloseWrite() error {
	v.mu.Lock()
	if v.wfin || v.closed {
		v.mu.Unlock()
		return nil
	}
	v.wfin = true
	v.mu.Unlock()
	s := v.s
	s.mu.Lock()
	v.finQueued = true
	if s.err == nil && !s.dialer && len(s.out)+len(s.pri) >= sessWriteQueue {
		// A worker that lets this much pile up (refused streams' Fins,
		// say) does not read: see Write.
		s.mu.Unlock()
		s.fail(errCtlBacklog)
		return nil
	}
	switch {
	case s.err != nil:
	case v.outGen == s.gen+1:
		s.appendFrame(sessFin, v.id, nil) // behind its own frames, still queued
	default:
		// All its frames are with the writer already: the end of this
		// stream (often the confirmation of a kill) goes ahead of what
		// other streams queued meanwhile.
		s.appendPri(sessFin, v.id)
	}
	s.mu.Unlock()
	return nil
}

// Close ends the stream here: its Fin follows what it wrote, and bytes that
// arrive later are dropped.
func (v *vstream) Close() error {
	_ = v.CloseWrite()
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	v.buf, v.off = nil, 0
	v.mu.Unlock()
	v.rdl.set(time.Time{})
	v.wdl.set(time.Unix(1, 0)) // a Write waiting for room fails now, as on a closed socket
	v.signal()
	v.s.remove(v)
	return nil
}

func (v *vstream) LocalAddr() net.Addr  { return v.s.conn.LocalAddr() }
func (v *vstream) RemoteAddr() net.Addr { return v.s.conn.RemoteAddr() }

func (v *vstream) SetDeadline(t time.Time) error {
	v.rdl.set(t)
	v.wdl.set(t)
	return nil
}

func (v *vstream) SetReadDeadline(t time.Time) error {
	v.rdl.set(t)
	return nil
}

func (v *vstream) SetWriteDeadline(t time.Time) error {
	v.wdl.set(t)
	return nil
}

// deadline is a net.Conn deadline: passed reports whether it is reached, and
// channel is closed when it is.
type deadline struct {
	mu    sync.Mutex
	t     time.Time
	timer *time.Timer
	ch    chan struct{} // closed when t passes; nil until asked for
	wake  func()        // called when t passes (may be nil)
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.t = t
	if d.ch != nil {
		select {
		case <-d.ch:
			d.ch = nil // passed before: a new deadline gets a new channel
		default:
		}
	}
	if t.IsZero() {
		return
	}
	wait := time.Until(t)
	if wait <= 0 {
		d.expire()
		return
	}
	d.timer = time.AfterFunc(wait, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.t.Equal(t) {
			d.expire()
		}
	})
}

// expire (mu held) closes the channel and wakes the reader.
func (d *deadline) expire() {
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	select {
	case <-d.ch:
	default:
		close(d.ch)
	}
	if d.wake != nil {
		d.wake() // only signals a channel: never blocks, takes no lock
	}
}

func (d *deadline) setWake(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.wake = f
	if !d.t.IsZero() && !time.Now().Before(d.t) {
		f() // passed already
	}
}

func (d *deadline) passed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.t.IsZero() && !time.Now().Before(d.t)
}

func (d *deadline) channel() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ch == nil {
		d.ch = make(chan struct{})
		if !d.t.IsZero() && !time.Now().Before(d.t) {
			close(d.ch)
		}
	}
	return d.ch
}
