package transport

// Fetching a request: how a request too large for its envelope (the NATS
// message that carries it to the worker) reaches the worker straight from
// its caller, once, over TCP.
//
// The caller offers the request's bytes under the stream's token
// (Incoming.Offer) before it sends the envelope, which then says how many
// bytes to fetch instead of carrying them. The worker dials the caller's
// stream port, sends a frame.Fetch frame with the token (read like a Hello:
// into a fixed array, under the bounds of a connection without a Hello),
// and reads exactly the announced number of bytes; the caller writes them
// and closes. A connection of its own rather than the stream's session: a
// session's streams share one connection whose caller side only carries
// control frames, each stream bounded to 64 KiB of unread bytes, so
// megabytes on it would either stall every other stream's kills behind them
// or need a flow control of their own; here TCP's flow control paces the
// bytes, and a kill, which travels on the stream, cuts the fetch.
//
// Bounds: the worker checks the announced size against its limit before
// anything is allocated (package plane) and its buffer grows as bytes
// arrive (at most twice what arrived, never past the size), so a caller
// that announces much and sends little costs little; each read and each
// write must progress within the idle timeout; a token's request is
// fetched at most once, and not at all once its stream was killed, closed
// or ended.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
)

// fetchChunk is the step of a fetch's writes and of its reader's buffer
// growth.
const fetchChunk = 256 << 10

// fetchOffer is a request offered for fetching (Server.mu).
type fetchOffer struct {
	request []byte
	conn    net.Conn // the fetch in progress (nil: none yet)
}

// Offer makes request fetchable by the worker that presents the stream's
// token on a frame.Fetch connection (FetchRequest), once. Call it before
// the envelope that names the token is sent. The offer ends when it is
// fetched, or when the stream is killed, closed or ends: a fetch in
// progress is then cut.
func (in *Incoming) Offer(request []byte) {
	s := in.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.pending[in.token] != in {
		return // the Server closed, or a duplicate token: nothing to fetch
	}
	if s.fetches == nil {
		s.fetches = make(map[string]*fetchOffer)
	}
	s.fetches[in.token] = &fetchOffer{request: request}
}

// dropOffer ends the stream's offer, cutting a fetch in progress.
func (in *Incoming) dropOffer() {
	s := in.srv
	s.mu.Lock()
	off := s.fetches[in.token]
	delete(s.fetches, in.token)
	s.mu.Unlock()
	if off != nil && off.conn != nil {
		_ = off.conn.Close()
	}
}

// serveFetch writes the offered request of token to p's connection, whose
// frame.Fetch frame was read; an unknown token, or one fetched already, is
// refused by closing the connection (serveConn does).
func (s *Server) serveFetch(p *pendingConn, token string) {
	c := p.c
	s.mu.Lock()
	off := s.fetches[token]
	if p.evicted || off == nil || off.conn != nil {
		off = nil
	} else {
		off.conn = c
	}
	s.settle(p)
	s.mu.Unlock()
	if off == nil {
		return
	}
	defer func() {
		s.mu.Lock()
		if s.fetches[token] == off {
			delete(s.fetches, token)
		}
		s.mu.Unlock()
	}()
	idle := s.cfg.idleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	_ = c.SetReadDeadline(time.Time{})
	req := off.request
	for n := 0; n < len(req); {
		_ = c.SetWriteDeadline(time.Now().Add(idle)) // a worker that stops reading
		k, err := c.Write(req[n:min(n+fetchChunk, len(req))])
		n += k
		if err != nil {
			return
		}
	}
	// The worker closes once it has read everything: wait for that (at most
	// the linger), so that our close cannot reset bytes still in flight.
	if hc, ok := c.(halfCloser); ok {
		_ = hc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.linger))
	var b [1]byte
	_, _ = c.Read(b[:])
}

// ErrFetch wraps every failure of FetchRequest.
var ErrFetch = errors.New("transport: could not fetch the request from its caller")

// FetchRequest fetches the request of the stream token from the caller's
// Server at addr: exactly n bytes, n > 0, a size the worker checked against
// its limit. ctx ends it at once (a killed request). Of the options,
// WithIdleTimeout (each read must progress within it) and
// WithConnectTimeout apply; the latter bounds redials of a connection the
// caller closed before sending a byte (dropped unread at its bound on
// connections without a Hello, as Dial's can be).
func FetchRequest(ctx context.Context, addr, token string, n int, opts ...Option) ([]byte, error) {
	if n <= 0 || len(token) == 0 || len(token) > MaxTokenLen {
		return nil, fmt.Errorf("%w: a request of %d bytes", ErrFetch, n)
	}
	cfg := newConfig(nil, opts)
	idle := cfg.idleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	by := time.Now().Add(cfg.connectTimeout)
	for attempt := 0; ; attempt++ {
		p, got, err := fetchOnce(ctx, addr, token, n, idle)
		if err == nil {
			return p, nil
		}
		if got > 0 || ctx.Err() != nil || attempt+1 >= redialLimit || time.Now().After(by) {
			return nil, fmt.Errorf("%w: %v", ErrFetch, err)
		}
		t := time.NewTimer(time.Duration(1<<attempt) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: %v", ErrFetch, ctx.Err())
		}
	}
}

// fetchOnce is one connection of FetchRequest; got is how many bytes of
// the request arrived before it failed.
func fetchOnce(ctx context.Context, addr, token string, n int, idle time.Duration) (p []byte, got int, err error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	var hdr [frame.HeaderSize + MaxTokenLen]byte
	hdr[0] = byte(frame.Fetch)
	binary.BigEndian.PutUint32(hdr[1:frame.HeaderSize], uint32(len(token)))
	m := frame.HeaderSize + copy(hdr[frame.HeaderSize:], token)
	_ = c.SetWriteDeadline(time.Now().Add(idle))
	if _, err := c.Write(hdr[:m]); err != nil {
		return nil, 0, err
	}
	// Grow as bytes arrive: doubling from one step, never past n.
	p = make([]byte, 0, min(n, fetchChunk))
	for len(p) < n {
		if len(p) == cap(p) {
			p2 := make([]byte, len(p), min(2*cap(p), n))
			copy(p2, p)
			p = p2
		}
		_ = c.SetReadDeadline(time.Now().Add(idle))
		k, err := c.Read(p[len(p):cap(p)])
		p = p[:len(p)+k]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, len(p), err
		}
	}
	return p, n, nil
}
