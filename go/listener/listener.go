// Package listener is the HTTP listener of the library's servers: the
// frontend's (go/frontend) and a worker's status endpoints (go/status). It
// is a net/http server on a TCP address with one connection-limit policy
// and bounded reads:
//
//   - Connections: at most Options.MaxIdleConnections are held that are not
//     serving a request (new ones before their request's headers, kept-alive
//     ones between requests). Past that a new connection takes the place of
//     the one that has waited longest, once that one has waited
//     Options.EvictAfter (at once when it is 0); until then the new one
//     waits in the kernel's listen queue. So silent connections cost their
//     owner its own oldest ones and keep no client out. A connection serving
//     a request is neither counted nor closed here (idleConns).
//   - Reads: the request's head within Options.ReadHeaderTimeout and at most
//     Options.MaxHeaderBytes (net/http answers 431 past it), the whole
//     request within Options.ReadTimeout.
//   - net/http's own complaints go to the library's log (slog, debug),
//     never to stderr.
package listener

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Options configures Listen. A duration left 0 is no bound (net/http's
// meaning); MaxIdleConnections must be 1 or more.
type Options struct {
	// Addr is the listen address, e.g. "127.0.0.1:8000" or ":0".
	Addr string
	// MaxIdleConnections bounds the connections not serving a request.
	MaxIdleConnections int
	// EvictAfter is how long a connection must have waited (since it was
	// accepted, or since its last response) before a new one may take its
	// place at the bound.
	EvictAfter time.Duration
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// http.Server's.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes int
	// DisableKeepAlives closes each connection after its first response.
	DisableKeepAlives bool
	// ConnContext is http.Server's: the context of a connection's
	// requests, made from the listener's and the connection.
	ConnContext func(context.Context, net.Conn) context.Context
}

// Server is a running listener.
type Server struct {
	srv    *http.Server
	ln     net.Listener
	idle   *idleConns
	served error         // what Serve returned, once done is closed
	done   chan struct{} // closed when Serve returned
}

// Listen listens on opts.Addr and serves h there until Shutdown or Close.
func Listen(opts Options, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, err
	}
	return Serve(ln, opts, h), nil
}

// Serve serves h on ln (opts.Addr unused) until Shutdown or Close, which
// close ln.
func Serve(ln net.Listener, opts Options, h http.Handler) *Server {
	idle := newIdleConns(max(opts.MaxIdleConnections, 1), opts.EvictAfter)
	s := &Server{
		ln: ln, idle: idle, done: make(chan struct{}),
		srv: &http.Server{
			Handler: h, ReadHeaderTimeout: opts.ReadHeaderTimeout, ReadTimeout: opts.ReadTimeout,
			WriteTimeout: opts.WriteTimeout, IdleTimeout: opts.IdleTimeout, MaxHeaderBytes: opts.MaxHeaderBytes,
			ConnState:   idle.connState,
			ConnContext: opts.ConnContext,
			ErrorLog:    slog.NewLogLogger(slog.Default().Handler(), slog.LevelDebug),
		},
	}
	if opts.DisableKeepAlives {
		s.srv.SetKeepAlivesEnabled(false)
	}
	go func() {
		defer close(s.done)
		s.served = s.srv.Serve(&admitListener{Listener: ln, idle: idle, done: make(chan struct{})})
	}()
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown is http.Server's: it stops accepting at once, closes the idle
// connections and waits, until ctx ends, for those serving a request.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close is http.Server's: it closes the listener and every connection at
// once, without waiting for their handlers.
func (s *Server) Close() error { return s.srv.Close() }

// Wait returns once the server stopped serving (after Shutdown or Close
// began): what http.Server.Serve returned.
func (s *Server) Wait() error {
	<-s.done
	return s.served
}

// IdleConnections returns how many connections wait (not serving a
// request), and how many were closed for the bound.
func (s *Server) IdleConnections() (held int, closed int64) { return s.idle.counts() }
