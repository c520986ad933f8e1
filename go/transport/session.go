package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// Sessions: many streams on one connection.
//
// A worker that serves several requests of one caller sends all their
// streams over one long-lived connection, a session (Dialer), instead of one
// connection per stream. The session's first bytes are a frame.Session frame
// (its payload the session protocol's version); then session frames follow
// both ways, each a 9-byte header (kind, stream id, payload length, both
// big-endian uint32) and its payload:
//
//	+------+------------------+-----------------+-----------------+
//	| kind | stream id (BE u32)| length (BE u32) | payload (length)|
//	+------+------------------+-----------------+-----------------+
//
// Kinds: Open (worker -> caller: a new stream; the payload is the stream's
// token, what a Hello carries), Data (bytes of the stream, both ways) and Fin
// (empty: the sender writes nothing more on the stream). A stream's bytes
// are exactly what a stream's own connection carries after its Hello: its
// frames, its end; so every rule of a stream (package comment) holds
// unchanged on a session, and each stream keeps its own credit. A stream id is chosen by the worker, greater than
// every id it opened before on the session, and names a stream on that
// session only: no other connection can reach it.
//
// What the session adds:
//
//   - Coalescing: each side has one writer goroutine. Frames that streams
//     write while it is busy are appended to one buffer and leave in one
//     write: the items of one engine step, over many streams, cost one
//     system call, not one per stream.
//   - Order: frames of one stream leave in the order they were written, its
//     Fin last. A caller only writes control frames (credit, stop, kill,
//     heartbeats): on the caller's side no item ever waits ahead of a kill.
//   - Loss: when the connection fails every stream on it reads the error
//     after the bytes that arrived before it, as a stream on its own
//     connection would: the caller's streams end with ErrIncomplete (and are
//     retried by migration), the worker's are Lost.
//   - Bounds: a caller's session counts as a connection without a Hello (see
//     MaxPendingConns), and is read into fixed arrays as a Hello is, until
//     an Open presents a token the caller expects; an unknown token is
//     refused alone (a Fin, as a dropped connection would be), at most
//     maxUnprovenRefusals of them before that. The caller checks each
//     Open's token as it reads it: no stream exists, nothing is allocated,
//     for a token it does not expect. A session holds at most
//     maxSessionStreams streams. A caller closes a session left without
//     streams for twice DefaultSessionIdle. A stream whose unread bytes exceed its
//     bound is broken (its reader fails) instead of stalling the session's
//     other streams; so is a caller's session whose worker stops reading
//     (its control bytes exceed maxCtlBacklog per stream). Malformed
//     session frames close the session.

// SessionVersion is the session protocol's version, the payload of the
// frame.Session frame that opens a session.
const SessionVersion = 1

// Session frame kinds.
const (
	sessOpen byte = 1
	sessData byte = 2
	sessFin  byte = 3
	sessPing byte = 4
)

// Session liveness. Each side writes a Ping (stream id 0, empty) when it has
// written nothing for sessPingEvery, and fails the session when it has read
// nothing for sessSilence. The streams' own heartbeats (liveness.go) stay:
// they bound a stream's silence (2.75 s with the defaults) and notice a
// wedged host whose Go side still runs; sessSilence is longer, so a silent
// peer's streams end by their own checks first, with their own errors, and
// the session's check is what notices a silent peer on a session without
// streams, before a new stream is opened on it.
// Variables for the tests; not changed otherwise.
var (
	sessPingEvery = DefaultHeartbeat
	sessSilence   = 2 * DefaultIdleTimeout
)

var errSessionSilent = fmt.Errorf("%w: no word from the peer on the session", ErrIncomplete)

const (
	sessHeaderSize = 9
	// sessChunk is the largest payload of one session Data frame: longer
	// writes are cut, so that no frame of one stream holds up the others
	// for long.
	sessChunk = 64 << 10
	// maxSessionStreams bounds the streams open on one session.
	maxSessionStreams = 1 << 16
	// sessWriteQueue bounds the bytes a worker's session holds for its
	// writer; a stream's Write waits (or fails at its write deadline) above
	// it. A caller's session never waits: see vstream.Write.
	sessWriteQueue = 4 << 20
	// sessReadBuf is the read buffer of a session: it holds a whole Data
	// frame's payload (see vstream.fill).
	sessReadBuf = sessChunk
)

var (
	errSessionClosed = errors.New("transport: session closed")
	errSessionProto  = fmt.Errorf("%w: session protocol violation", frame.ErrInvalid)
	errStreamBacklog = errors.New("transport: stream's unread bytes over its bound")
	// errRefused is what a caller's accept returns for a stream refused
	// alone: its token is not (or no longer) expected.
	errRefused = errors.New("transport: stream refused")
)

// session is one multiplexed connection, from either side.
type session struct {
	conn     net.Conn
	dialer   bool                         // the worker's side: it opens streams
	recvMax  int                          // bound on a stream's unread bytes
	accept   func(*vstream, string) error // caller's side: serves a new stream with its token; errRefused refuses it alone, another error closes the session
	onEmpty  func(*session)               // worker's side: the last stream closed
	onClosed func(*session)               // the session failed or was closed
	spawn    func(func()) bool            // runs a goroutine (nil: go); see vstream.deliverTo

	// Liveness (startLiveness): heard and wrote are set by the reader and
	// the writer, read and cleared by the ticker, which alone uses lastHeard.
	heard, wrote     atomic.Bool
	lastHeard        time.Time
	ticker           *time.Timer   // nil until startLiveness (mu)
	pingEvery, quiet time.Duration // sessPingEvery and sessSilence when it was made

	mu      sync.Mutex
	streams map[uint32]*vstream
	lastID  uint32
	err     error      // sticky: why the session ended
	dead    []*vstream // the streams open when it ended, for the reader to end (endStreams)
	out     []byte     // frames queued in order
	spare   []byte
	// pri: frames that go ahead of out (pings, and the Fin of a stream
	// none of whose frames is still in out); gen counts the writer's takes
	// of out, so that a stream knows whether its frames are still there.
	pri, priSpare []byte
	gen           uint64
	// writing: a goroutine is writing what it took from pri and out (the
	// writer, or a stream's Write writing directly: flushDirect); no
	// other may write then.
	writing bool
	wshut   bool          // the sending side is closed (closeGracefully): what is queued is dropped
	raw     *rawWriter    // conn's, for flushDirect (used while writing); nil: none
	wake    chan struct{} // cap 1: out has bytes, or the session closed
	room    chan struct{} // closed and replaced whenever out is written
	done    chan struct{} // closed when the writer has exited
}

func newSession(c net.Conn, dialer bool, recvMax int) *session {
	return &session{
		raw:       newRawWriter(c),
		pingEvery: sessPingEvery,
		quiet:     sessSilence,
		conn:      rawio.Wrap(c),
		dialer:    dialer,
		recvMax:   recvMax,
		streams:   make(map[uint32]*vstream),
		wake:      make(chan struct{}, 1),
		room:      make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// writePreamble writes the frame.Session frame that opens a session.
func writePreamble(c net.Conn) error {
	var b [frame.HeaderSize + 1]byte
	b[0] = byte(frame.Session)
	binary.BigEndian.PutUint32(b[1:frame.HeaderSize], 1)
	b[frame.HeaderSize] = SessionVersion
	_, err := c.Write(b[:])
	return err
}

// open starts a new stream with token (worker's side).
func (s *session) open(token string) (*vstream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if len(s.streams) >= maxSessionStreams || s.lastID == 1<<31 {
		return nil, errSessionFull
	}
	s.lastID++
	v := newVstream(s, s.lastID)
	s.streams[v.id] = v
	s.appendFrame(sessOpen, v.id, []byte(token))
	v.outGen = s.gen + 1 // its Fin may not overtake its Open
	return v, nil
}

var errSessionFull = errors.New("transport: session full")

// sessHeader encodes a session frame's header.
func sessHeader(kind byte, id, n uint32) [sessHeaderSize]byte {
	var h [sessHeaderSize]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:5], id)
	binary.BigEndian.PutUint32(h[5:9], n)
	return h
}

// parseSessHeader decodes a session frame's header.
func parseSessHeader(h *[sessHeaderSize]byte) (kind byte, id, n uint32) {
	return h[0], binary.BigEndian.Uint32(h[1:5]), binary.BigEndian.Uint32(h[5:9])
}

// appendFrame queues one session frame for the writer, in order (mu held).
func (s *session) appendFrame(kind byte, id uint32, p []byte) { s.queue(&s.out, kind, id, p) }

// appendPri queues an empty frame ahead of out (mu held).
func (s *session) appendPri(kind byte, id uint32) { s.queue(&s.pri, kind, id, nil) }

// queue appends a frame to buf and wakes the writer (mu held).
func (s *session) queue(buf *[]byte, kind byte, id uint32, p []byte) {
	s.queueQuiet(buf, kind, id, p)
	s.signal()
}

// queueQuiet appends a frame to buf without waking the writer (mu held):
// the caller then wakes it (signal), or writes the frame itself
// (flushDirect, once it released mu).
func (s *session) queueQuiet(buf *[]byte, kind byte, id uint32, p []byte) {
	h := sessHeader(kind, id, uint32(len(p)))
	*buf = append(append(*buf, h[:]...), p...)
}

// signal wakes the writer.
func (s *session) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take hands what is queued to a goroutine that is to write it (mu held,
// something queued, no write in progress).
func (s *session) take() (pri, buf []byte) {
	buf, pri = s.out, s.pri
	s.out, s.spare = s.spare[:0], nil
	s.pri, s.priSpare = s.priSpare[:0], nil
	s.gen++
	s.writing = true
	return pri, buf
}

// wroteLocked ends a write of pri and buf (mu held): their buffers are
// kept for reuse, and the streams waiting for room are woken.
func (s *session) wroteLocked(pri, buf []byte) {
	s.writing = false
	if cap(buf) <= 4*sessWriteQueue {
		s.spare = buf[:0]
	} else {
		s.spare = nil
	}
	if cap(pri) <= sessChunk {
		s.priSpare = pri[:0]
	} else {
		s.priSpare = nil
	}
	close(s.room)
	s.room = make(chan struct{})
}

// dropQueuedLocked drops what is queued once the sending side is closed
// (mu held), and wakes the streams waiting for room.
func (s *session) dropQueuedLocked() {
	s.out, s.pri = s.out[:0], s.pri[:0]
	close(s.room)
	s.room = make(chan struct{})
}

// writeLoop is the session's writer: it writes everything queued, pri
// first, in one write, until the session ends. A stream's Write may write
// directly instead (flushDirect); it then wakes this loop for what it
// left.
func (s *session) writeLoop() {
	defer close(s.done)
	for {
		<-s.wake
		s.mu.Lock()
		if s.err != nil {
			s.mu.Unlock()
			return
		}
		if s.writing || (len(s.out) == 0 && len(s.pri) == 0) {
			s.mu.Unlock() // a direct write is under way: it wakes this loop when done
			continue
		}
		if s.wshut {
			s.dropQueuedLocked()
			s.mu.Unlock()
			continue
		}
		pri, buf := s.take()
		s.mu.Unlock()
		var err error // pri first; two writes, as net.Buffers would bypass the raw calls
		if len(pri) > 0 {
			_, err = s.conn.Write(pri)
		}
		if err == nil && len(buf) > 0 {
			_, err = s.conn.Write(buf)
		}
		s.wrote.Store(true)
		s.mu.Lock()
		s.wroteLocked(pri, buf)
		if len(s.out) > 0 || len(s.pri) > 0 {
			s.signal() // queued while this wrote, by direct writers that found it writing
		}
		s.mu.Unlock()
		if err != nil {
			s.fail(err)
			return
		}
	}
}

// flushDirect writes what is queued from the calling goroutine, when no
// write is in progress: one write that never waits for the socket
// (whatever it does not take now goes to the writer, ahead of what was
// queued since). A caller's Kill or Stop (vstream.urgent) and a worker's
// items of a whole turn (Batch) then leave without first waking the
// writer's thread. Other frames wait for the writer, which writes those
// of many streams together: written one by one, a session's short
// requests cost a third more CPU. The writer is woken instead when the
// connection has no descriptor.
func (s *session) flushDirect() {
	s.mu.Lock()
	if s.err != nil || s.writing || (len(s.out) == 0 && len(s.pri) == 0) {
		s.mu.Unlock() // a write in progress wakes the writer for what is queued
		return
	}
	if s.raw == nil || s.wshut {
		s.signal() // the writer writes it (or drops it: wshut)
		s.mu.Unlock()
		return
	}
	pri, buf := s.take()
	s.mu.Unlock()
	np, err := s.raw.tryWrite(pri)
	nb := 0
	if err == nil && np == len(pri) {
		nb, err = s.raw.tryWrite(buf)
	}
	if np+nb > 0 {
		s.wrote.Store(true)
	}
	s.mu.Lock()
	if err == nil && (np < len(pri) || nb < len(buf)) {
		// The socket is full: the rest goes first, then what was queued.
		rest := append(append(make([]byte, 0, len(pri)-np+len(buf)-nb+len(s.pri)), pri[np:]...), buf[nb:]...)
		s.pri = append(rest, s.pri...)
	}
	s.wroteLocked(pri, buf)
	if len(s.out) > 0 || len(s.pri) > 0 {
		s.signal()
	}
	s.mu.Unlock()
	if err != nil {
		s.fail(err)
	}
}

// A Batch collects the sessions whose streams queued frames through it
// (Outgoing.TrySendBatchIn), so that Flush writes each session's frames
// once: the items a worker sends for many requests in a row leave in one
// write per caller, not one per request. Not for concurrent use.
type Batch struct{ sessions []*session }

// add records that s has frames for Flush.
func (b *Batch) add(s *session) {
	for _, t := range b.sessions {
		if t == s {
			return
		}
	}
	b.sessions = append(b.sessions, s)
}

// Flush writes what the batch's sessions queued (as a stream's Write does:
// now, or by the writer when the socket is full or a write is under way).
func (b *Batch) Flush() {
	for i, s := range b.sessions {
		if s == nil {
			continue // flushed by a call that panicked after it
		}
		b.sessions[i] = nil
		s.flushDirect()
	}
	b.sessions = b.sessions[:0]
}

// readLoop reads session frames and hands each stream its bytes, until the
// connection fails or breaks the protocol; then it fails the session.
func (s *session) readLoop(r *bufio.Reader) {
	defer s.endStreams()
	var h [sessHeaderSize]byte
	var tok [MaxTokenLen]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			s.fail(err)
			return
		}
		s.heard.Store(true)
		kind, id, n := parseSessHeader(&h)
		if err := s.check(kind, id, n); err != nil {
			s.fail(err)
			return
		}
		switch kind {
		case sessPing: // heard: that is all
		case sessOpen:
			if _, err := io.ReadFull(r, tok[:n]); err != nil {
				s.fail(err)
				return
			}
			if err := s.opened(id, string(tok[:n])); err != nil {
				s.fail(err)
				return
			}
		case sessFin:
			if v := s.stream(id); v != nil {
				v.peerFin()
			}
		case sessData:
			v := s.stream(id)
			if v == nil {
				// Closed here already (its bytes are not wanted), or
				// never opened (check refused ids above lastID): skip.
				if _, err := r.Discard(int(n)); err != nil {
					s.fail(err)
					return
				}
				continue
			}
			if err := v.fill(r, int(n)); err != nil {
				s.fail(err)
				return
			}
		}
	}
}

// check validates a session frame's header against the protocol.
func (s *session) check(kind byte, id, n uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return checkSessFrame(kind, id, n, s.lastID, s.dialer)
}

// checkSessFrame is the protocol's rule for a session frame's header, given
// the last stream id opened on the session and which side reads it (a
// worker's Dialer reads no Open): an Open carries a token and a new id
// above every earlier one, a Ping no stream and no payload, a Fin no
// payload, a Data frame 1 byte to sessChunk; Data and Fin name a stream
// opened before.
func checkSessFrame(kind byte, id, n, last uint32, dialer bool) error {
	switch kind {
	case sessOpen:
		if dialer || n == 0 || n > MaxTokenLen {
			return fmt.Errorf("%w: unexpected Open", errSessionProto)
		}
		if id <= last || id > 1<<31 {
			return fmt.Errorf("%w: stream id %d out of order", errSessionProto, id)
		}
		return nil
	case sessPing:
		if id != 0 || n != 0 {
			return fmt.Errorf("%w: Ping with a stream or a payload", errSessionProto)
		}
		return nil
	case sessFin:
		if n != 0 {
			return fmt.Errorf("%w: Fin with a payload", errSessionProto)
		}
	case sessData:
		if n == 0 || n > sessChunk {
			return fmt.Errorf("%w: Data of %d bytes", errSessionProto, n)
		}
	default:
		return fmt.Errorf("%w: unknown kind %d", errSessionProto, kind)
	}
	if id == 0 || id > last {
		return fmt.Errorf("%w: stream %d was never opened", errSessionProto, id)
	}
	return nil
}

// opened registers a stream the worker opened (caller's side) and serves it;
// a stream refused alone gets its Fin at once.
func (s *session) opened(id uint32, token string) error {
	s.mu.Lock() // id was checked against lastID (checkSessFrame), which only this reader moves
	if len(s.streams) >= maxSessionStreams {
		s.mu.Unlock()
		return fmt.Errorf("%w: more than %d streams", errSessionProto, maxSessionStreams)
	}
	if s.err != nil {
		s.mu.Unlock()
		return s.err
	}
	s.lastID = id
	v := newVstream(s, id)
	s.streams[id] = v
	s.mu.Unlock()
	switch err := s.accept(v, token); err {
	case nil:
		return nil
	case errRefused:
		_ = v.Close()
		return nil
	default:
		return err
	}
}

func (s *session) stream(id uint32) *vstream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams[id]
}

// count returns the number of open streams.
func (s *session) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.streams)
}

// remove forgets a stream closed locally.
func (s *session) remove(v *vstream) {
	s.mu.Lock()
	if s.streams[v.id] == v {
		delete(s.streams, v.id)
	}
	empty := len(s.streams) == 0 && s.err == nil
	f := s.onEmpty
	s.mu.Unlock()
	if empty && f != nil {
		f(s)
	}
}

// fail ends the session: the connection is closed, every stream reads err
// after the bytes it has, and writes fail.
func (s *session) fail(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	if err == nil || errors.Is(err, net.ErrClosed) {
		err = errSessionClosed
	}
	s.err = err
	if s.ticker != nil {
		s.ticker.Stop()
	}
	streams := s.streams
	s.streams = map[uint32]*vstream{}
	s.dead = make([]*vstream, 0, len(streams))
	for _, v := range streams {
		s.dead = append(s.dead, v)
	}
	s.out = nil
	close(s.room)
	s.room = make(chan struct{})
	f := s.onClosed
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	_ = s.conn.Close() // the reader ends every stream then (endStreams)
	if f != nil {
		f(s)
	}
}

// endStreams ends every stream the session had when it failed, as the
// session's reader exits (and the session has failed: its connection is
// closed, so the reader exits promptly whoever failed it). On the reader's
// goroutine because a stream served without a goroutine of its own
// (deliverTo) learns of its end there, in order after its frames.
func (s *session) endStreams() {
	s.fail(errSessionClosed) // no-op when it failed already
	s.mu.Lock()
	dead, err := s.dead, s.err
	s.dead = nil
	s.mu.Unlock()
	for _, v := range dead {
		v.broken(err)
	}
}

// goSpawn runs f on a goroutine of the session's owner.
func (s *session) goSpawn(f func()) {
	if s.spawn == nil || !s.spawn(f) {
		go f()
	}
}

// startLiveness starts the session's pings and its silence check (see
// sessPingEvery): one timer, no goroutine of its own.
func (s *session) startLiveness() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.ticker != nil {
		return
	}
	s.lastHeard = time.Now()
	s.ticker = time.AfterFunc(s.pingEvery, s.tick)
}

// tick is the liveness timer: it fails a silent session, and pings when the
// session has written nothing since the last tick.
func (s *session) tick() {
	now := time.Now()
	if s.heard.Swap(false) {
		s.lastHeard = now
	}
	if now.Sub(s.lastHeard) >= s.quiet {
		s.fail(errSessionSilent)
		return
	}
	ping := !s.wrote.Swap(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	if ping {
		s.appendPri(sessPing, 0)
	}
	s.ticker.Reset(s.pingEvery)
}

// close ends the session from this side.
func (s *session) close() { s.fail(errSessionClosed) }

// closeGracefully closes the session after what its streams queued: the
// writer writes it, the connection's sending side closes behind it, and
// the peer, having read it all, closes its side; then the session closes.
// Closing outright could lose those frames: bytes unread here at close make
// the kernel reset the connection, and a reset discards what the peer had
// not read yet. A peer that has not read and closed by deadline gets the
// outright close.
func (s *session) closeGracefully(deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	defer s.close()
	for shut := false; ; {
		s.mu.Lock()
		if s.err != nil {
			s.mu.Unlock()
			return // the peer closed (the reader failed it), or it broke
		}
		if !shut && !s.writing && len(s.out) == 0 && len(s.pri) == 0 {
			hc, ok := s.conn.(halfCloser)
			if !ok {
				s.mu.Unlock()
				return
			}
			// Under mu with no write under way, and none starts again
			// (wshut): no write fails on the closed side.
			s.wshut, shut = true, true
			_ = hc.CloseWrite()
		}
		room := s.room // closed when a write ends, or the session fails
		if !shut {
			s.signal() // a write under way wakes the writer again itself
		}
		s.mu.Unlock()
		select {
		case <-room:
		case <-t.C:
			return
		}
	}
}
