package transport

import (
	"bufio"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// serveSession runs the session that p's connection opened (see
// session.go) on the connection's goroutine: it is the session's reader, a
// goroutine of the Server writes, and each stream the worker opens with an
// expected token gets a goroutine that serves it as serveConn serves a
// stream on its own connection. The session counts as a connection without
// a Hello (evictable, under its deadline) until an Open proves it.
func (s *Server) serveSession(p *pendingConn) {
	c := p.c
	maxPayload := s.cfg.maxPayload
	if maxPayload <= 0 {
		maxPayload = frame.DefaultMaxPayload
	}
	// A stream's unread bytes: two of the largest items, with their chunks.
	sess := newSession(c, false, 2*maxPayload+2*sessChunk)
	sess.accept = func(v *vstream, token string) error { return s.openStream(p, v, token) }
	if s.spawn(sess.writeLoop) {
		sess.readLoop(bufio.NewReaderSize(c, sessReadBuf))
	}
	sess.close()
	s.mu.Lock()
	s.settle(p)
	s.mu.Unlock()
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
	proven := p.proven
	s.mu.Unlock()
	switch {
	case in == nil && !proven:
		return errUnprovenSession
	case in == nil:
		return errRefused // as a dropped connection: its worker may dial again
	}
	if proving {
		_ = p.c.SetReadDeadline(time.Time{}) // the session's Hello deadline
	}
	in.timer.Stop()
	if !s.spawn(func() {
		defer v.Close()
		in.serve(v, frame.NewReaderSize(v, callerReadBuf, s.cfg.maxPayload))
	}) {
		in.end(ErrServerClosed)
		return errSessionClosed
	}
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
