package transport

import (
	"bufio"
	"io"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// maxUnprovenRefusals bounds the streams a session may open with tokens
// nobody expects before one shows an expected token. A worker serving
// requests whose callers gave up (an overload, a deadline) opens such
// streams in the normal course; more than this is not a worker.
const maxUnprovenRefusals = 16

// serveSession runs the session that p's connection opened (see
// session.go) on the connection's goroutine. Until an Open shows an
// expected token the session is read frame by frame into fixed arrays, as a
// Hello is (prove): it costs no more than a connection without its Hello.
// Then the goroutine becomes the session's reader, a goroutine of the
// Server writes, and the reader hands each stream its frames
// (Incoming.serveOn): streams need no goroutine of their own.
func (s *Server) serveSession(p *pendingConn) {
	c := p.c
	id, token, last, ok := s.prove(p)
	if !ok {
		return // serveConn closes the connection; settle below
	}
	maxPayload := s.cfg.maxPayload
	if maxPayload <= 0 {
		maxPayload = frame.DefaultMaxPayload
	}
	// A stream's undecoded bytes: one item and its header, at most.
	sess := newSession(c, false, maxPayload+frame.HeaderSize)
	sess.accept = func(v *vstream, token string) error { return s.openStream(p, v, token) }
	sess.spawn = s.spawn
	sess.lastID = last
	idle := s.idleCloser(sess)
	defer idle.Stop()
	sess.onEmpty = func(*session) { idle.Reset(s.cfg.sessionIdle) }
	if s.spawn(sess.writeLoop) {
		sess.startLiveness()
		if err := sess.opened(id, token); err != nil {
			sess.fail(err)
		}
		sess.readLoop(bufio.NewReaderSize(sess.conn, sessReadBuf))
	}
	sess.close()
	s.mu.Lock()
	s.settle(p)
	s.mu.Unlock()
}

// idleCloser is the timer that closes a caller's session left without
// streams for twice the workers' idle time (a worker closes its own sooner:
// this is for one that went silent, or away without a word).
func (s *Server) idleCloser(sess *session) *time.Timer {
	t := time.AfterFunc(time.Hour, func() {
		if sess.count() == 0 {
			sess.close()
		}
	})
	t.Stop()
	return t
}

// prove reads a session's frames until an Open shows a token the Server
// expects, and returns that Open's id and token, and the last id refused
// before it. Unknown tokens are refused one by one (a Fin), at most
// maxUnprovenRefusals of them; bytes of refused streams are skipped.
// Anything else, or the connection's deadline, ends the session: false.
func (s *Server) prove(p *pendingConn) (id uint32, token string, last uint32, ok bool) {
	c := p.c
	_ = c.SetWriteDeadline(p.since.Add(s.cfg.connectTimeout)) // for the refusals' Fins
	defer func() { _ = c.SetWriteDeadline(time.Time{}) }()
	var h [sessHeaderSize]byte
	var tok [MaxTokenLen]byte
	for refused := 0; ; {
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return 0, "", 0, false
		}
		kind, id, n := parseSessHeader(&h)
		if checkSessFrame(kind, id, n, last, false) != nil {
			return 0, "", 0, false
		}
		switch kind {
		case sessOpen:
			if _, err := io.ReadFull(c, tok[:n]); err != nil {
				return 0, "", 0, false
			}
			s.mu.Lock()
			known := !p.evicted && s.pending[string(tok[:n])] != nil
			s.mu.Unlock()
			if known {
				return id, string(tok[:n]), last, true
			}
			if refused++; refused > maxUnprovenRefusals {
				return 0, "", 0, false
			}
			last = id
			fin := sessHeader(sessFin, id, 0)
			if _, err := c.Write(fin[:]); err != nil { // 9 bytes: the socket takes them
				return 0, "", 0, false
			}
		case sessData:
			if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
				return 0, "", 0, false
			}
		}
	}
}

// openStream matches a session's new stream to the Incoming awaiting its
// token and serves it. It runs on the session's reader: nothing here waits.
func (s *Server) openStream(p *pendingConn, v *vstream, token string) error {
	s.mu.Lock()
	var in *Incoming
	if !p.evicted {
		if in = s.pending[token]; in != nil {
			delete(s.pending, token) // one stream per token
		}
	}
	proving := in != nil && !p.proven
	if proving {
		p.proven = true
		s.settle(p)
	}
	s.mu.Unlock()
	if in == nil {
		return errRefused // as a dropped connection: its worker may dial again
	}
	if proving {
		_ = p.c.SetReadDeadline(time.Time{}) // the session's Hello deadline
	}
	in.timer.Stop()
	in.serveOn(v, s.cfg.maxPayload)
	return nil
}

// settle (mu held) takes a connection off the count of those without a
// Hello, once: when its Hello (or its session's first expected token) was
// read, or it ended without one.
func (s *Server) settle(p *pendingConn) {
	if p.settled {
		return
	}
	p.settled = true
	s.unhello--
	if p.evicted {
		s.evicted--
	} else {
		s.unlist(p)
	}
	s.room.Signal()
}
