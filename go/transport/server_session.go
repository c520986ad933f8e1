package transport

import (
	"bufio"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// serveSession runs the session that p's connection opened (see
// session.go) on the connection's goroutine: it is the session's reader, a
// goroutine of the Server writes, and each stream the worker opens gets a
// goroutine that reads its Hello and then serves it as serveConn serves a
// stream on its own connection. The session counts as a connection without
// a Hello (evictable, under its deadline) until a stream proves it.
func (s *Server) serveSession(p *pendingConn) {
	c := p.c
	maxPayload := s.cfg.maxPayload
	if maxPayload <= 0 {
		maxPayload = frame.DefaultMaxPayload
	}
	// A stream's unread bytes: two of the largest items, with their chunks.
	sess := newSession(c, false, 2*maxPayload+2*sessChunk)
	sess.accept = func(v *vstream) bool {
		s.mu.Lock()
		if !p.proven {
			if p.unproven >= maxUnprovenStreams {
				s.mu.Unlock()
				return false
			}
			p.unproven++
		}
		s.mu.Unlock()
		return s.spawn(func() { s.serveStream(p, sess, v) })
	}
	if s.spawn(sess.writeLoop) {
		sess.readLoop(bufio.NewReaderSize(c, sessReadBuf))
	}
	sess.close()
	s.mu.Lock()
	s.settle(p)
	s.mu.Unlock()
}

// settle (mu held) takes a connection off the count of those without a
// Hello, once: when its Hello was read, or it ended without one.
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

// serveStream reads the Hello of a session's stream and serves the stream
// it names. A token nobody expects closes the stream, and the whole session
// if no stream has proved it yet.
func (s *Server) serveStream(p *pendingConn, sess *session, v *vstream) {
	defer v.Close()
	_ = v.SetReadDeadline(time.Now().Add(s.cfg.connectTimeout))
	token, ok := readStreamHello(v)
	s.mu.Lock()
	var in *Incoming
	if ok && !p.evicted {
		if in = s.pending[token]; in != nil {
			delete(s.pending, token) // one stream per token
		}
	}
	proving := in != nil && !p.proven
	if proving {
		p.proven = true
		s.settle(p)
	}
	unproven := !p.proven
	s.mu.Unlock()
	if in == nil {
		if unproven {
			sess.close()
		}
		return
	}
	if proving {
		_ = p.c.SetReadDeadline(time.Time{}) // the session's Hello deadline
	}
	_ = v.SetReadDeadline(time.Time{})
	in.timer.Stop()
	in.serve(v, frame.NewReaderSize(v, callerReadBuf, s.cfg.maxPayload))
}
