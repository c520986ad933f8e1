// Package status serves a process's status endpoints (a worker's /metrics
// and /health) over HTTP for a host that Go never calls: the listener is
// go/listener's, with its connection-limit policy, and the answers are the
// host's.
//
// Each GET or HEAD of one of Options.Paths becomes an Ask, queued for the
// host. The host learns that asks wait through Arm (for a Python host: a
// token on its event loop's fd), takes each with Next, renders the answer
// (Prometheus text, readiness JSON: always fresh) and hands it back with
// Answer. So a scrape costs the host one turn of its loop, and the host
// never blocks in a call here.
//
// Everything is bounded:
//
//   - Connections: at most Options.MaxConnections wait for their request's
//     head; one more closes the oldest of them at once (go/listener with
//     EvictAfter 0), so silent connections keep no probe out. The head must
//     arrive within Options.ReadTimeout and be at most MaxHeaderBytes (431
//     past it). Each connection is closed after its one answer.
//   - Asks: at most Options.MaxConnections wait for the host's answer; one
//     more is answered 503 at once. An ask the host does not answer within
//     Options.AnswerTimeout is answered 503 (a host whose loop is stuck
//     gets no hang, and is reported not ready). An answer's body is at
//     most MaxBodyBytes.
//   - The answer's write: within Options.AnswerTimeout + ReadTimeout of the
//     request's head.
//
// Another method is 405 (with Allow: GET, HEAD), another path 404; a query
// string is ignored.
package status

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/listener"
)

// Defaults of Options, and the bounds of the listener.
const (
	DefaultMaxConnections = 64
	DefaultReadTimeout    = 10 * time.Second
	DefaultAnswerTimeout  = 2 * time.Second
	// MaxHeaderBytes bounds a request's line and headers.
	MaxHeaderBytes = 16 << 10
	// MaxBodyBytes bounds an answer's body.
	MaxBodyBytes = 64 << 20
	// MaxPathLen bounds a path of Options.Paths, in bytes: a C host's
	// buffer of MaxPathLen+1 bytes holds any path Next gives.
	MaxPathLen = 63
	// MaxContentTypeLen bounds an answer's content type.
	MaxContentTypeLen = 256
)

// The errors of New, Next and Answer.
var (
	// ErrBadOptions: Options that New refuses (the message says which).
	ErrBadOptions = errors.New("status: invalid options")
	// ErrAgain: no ask waits to be taken (Arm, then call Next again).
	ErrAgain = errors.New("status: no request waits")
	// ErrClosed: the server is closed.
	ErrClosed = errors.New("status: the server is closed")
	// ErrNotWaiting: no request waits for this answer any more (its
	// client left, or it was answered 503 for the host's delay).
	ErrNotWaiting = errors.New("status: no request waits for this answer")
	// ErrBadAnswer: an answer Answer refuses (the message says why).
	ErrBadAnswer = errors.New("status: invalid answer")
)

// Options configures New. A field left zero takes its default.
type Options struct {
	// Addr is the listen address, e.g. "127.0.0.1:9100" or ":0", unless
	// Listener is set.
	Addr string
	// Listener, when set, is served instead (New takes it over, Close
	// closes it; after an error the caller keeps it). A host that must bind its port before it may load the
	// library (a worker whose engine forks) hands its socket over with
	// FileListener.
	Listener net.Listener
	// Paths are the paths the host answers (each "/" and up to MaxPathLen
	// bytes of printable ASCII); any other is 404 here.
	Paths []string
	// MaxConnections bounds the connections waiting for their request's
	// head, and the asks waiting for the host's answer.
	MaxConnections int
	// ReadTimeout is the time a client has to send its request's head.
	ReadTimeout time.Duration
	// AnswerTimeout is the time the host has to answer an ask.
	AnswerTimeout time.Duration
}

func (o *Options) defaults() error {
	if len(o.Paths) == 0 {
		return fmt.Errorf("%w: no paths", ErrBadOptions)
	}
	for _, p := range o.Paths {
		if err := checkPath(p); err != nil {
			return err
		}
	}
	if o.MaxConnections < 0 || o.ReadTimeout < 0 || o.AnswerTimeout < 0 {
		return fmt.Errorf("%w: a bound is negative", ErrBadOptions)
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.AnswerTimeout == 0 {
		o.AnswerTimeout = DefaultAnswerTimeout
	}
	return nil
}

// checkPath: "/" then printable ASCII, at most MaxPathLen bytes.
func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") || len(p) > MaxPathLen {
		return fmt.Errorf("%w: path %q: want \"/\" and at most %d bytes", ErrBadOptions, p, MaxPathLen)
	}
	for i := 0; i < len(p); i++ {
		if p[i] <= ' ' || p[i] > '~' || p[i] == '?' {
			return fmt.Errorf("%w: path %q: want printable ASCII, no space or '?'", ErrBadOptions, p)
		}
	}
	return nil
}

// Ask is a request waiting for the host's answer.
type Ask struct {
	ID   uint64
	Path string
}

// Answer is the host's answer to an ask.
type Answer struct {
	Code        int // 200 to 599
	ContentType string
	Body        []byte
}

func (a Answer) check() error {
	if a.Code < 200 || a.Code > 599 {
		return fmt.Errorf("%w: status %d: want 200 to 599", ErrBadAnswer, a.Code)
	}
	if len(a.ContentType) > MaxContentTypeLen {
		return fmt.Errorf("%w: a content type of %d bytes: at most %d", ErrBadAnswer, len(a.ContentType), MaxContentTypeLen)
	}
	for i := 0; i < len(a.ContentType); i++ {
		if c := a.ContentType[i]; c < ' ' || c > '~' {
			return fmt.Errorf("%w: the content type is not printable ASCII", ErrBadAnswer)
		}
	}
	if len(a.Body) > MaxBodyBytes {
		return fmt.Errorf("%w: a body of %d bytes: at most %d", ErrBadAnswer, len(a.Body), MaxBodyBytes)
	}
	return nil
}

// ask is an Ask and where its answer goes.
type ask struct {
	Ask
	answer chan Answer // buffered: Answer never waits
}

// Server is a running status listener.
type Server struct {
	opts  Options
	paths map[string]bool
	srv   *listener.Server

	mu      sync.Mutex
	lastID  uint64
	queue   []*ask          // not taken yet, oldest first
	waiting map[uint64]*ask // every ask waiting for its answer, taken or not
	armed   func()          // the host's, run once when an ask is queued or the server closes
	closed  bool
	done    chan struct{} // closed by Close
}

// New listens on opts.Addr and serves the status endpoints.
func New(opts Options) (*Server, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, paths: map[string]bool{}, waiting: map[uint64]*ask{}, done: make(chan struct{})}
	for _, p := range opts.Paths {
		s.paths[p] = true
	}
	ln := opts.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", opts.Addr); err != nil {
			return nil, err
		}
	}
	s.srv = listener.Serve(ln, listener.Options{
		MaxIdleConnections: opts.MaxConnections, EvictAfter: 0,
		ReadHeaderTimeout: opts.ReadTimeout, ReadTimeout: opts.ReadTimeout,
		WriteTimeout: opts.AnswerTimeout + opts.ReadTimeout, MaxHeaderBytes: MaxHeaderBytes, DisableKeepAlives: true,
	}, http.HandlerFunc(s.serveHTTP))
	return s, nil
}

// FileListener is a listener on a copy of fd, a listening TCP socket of the
// host's (which keeps its own fd, and may close it). ErrBadOptions when fd
// is not a listening socket.
func FileListener(fd int) (net.Listener, error) {
	if on, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN); err != nil || on == 0 {
		return nil, fmt.Errorf("%w: fd %d is not a listening socket", ErrBadOptions, fd)
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, err
	}
	syscall.CloseOnExec(dup)
	f := os.NewFile(uintptr(dup), "status listener")
	defer f.Close() // the listener holds a copy of its own
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%w: fd %d: %v", ErrBadOptions, fd, err)
	}
	return ln, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.srv.Addr() }

// Next takes the oldest ask not taken yet: ErrAgain when there is none,
// ErrClosed once the server is closed.
func (s *Server) Next() (Ask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Ask{}, ErrClosed
	}
	if len(s.queue) == 0 {
		return Ask{}, ErrAgain
	}
	a := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return a.Ask, nil
}

// Arm runs f once, when Next may return something new or the server
// closed: at once if an ask waits already. A second Arm replaces the first.
func (s *Server) Arm(f func()) {
	s.mu.Lock()
	if len(s.queue) > 0 || s.closed {
		s.mu.Unlock()
		f()
		return
	}
	s.armed = f
	s.mu.Unlock()
}

// Answer answers the ask id. ErrNotWaiting when its request no longer
// waits; ErrBadAnswer for an answer out of bounds; ErrClosed.
func (s *Server) Answer(id uint64, a Answer) error {
	if err := a.check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	w := s.waiting[id]
	if w == nil {
		return fmt.Errorf("%w: %d", ErrNotWaiting, id)
	}
	s.forgetLocked(w)
	w.answer <- a
	return nil
}

// Close stops serving at once: the listener and every connection close,
// the requests waiting for an answer end, Next returns ErrClosed and an
// armed host is woken. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.queue, s.waiting = nil, map[uint64]*ask{}
	armed := s.armed
	s.armed = nil
	s.mu.Unlock()
	if armed != nil {
		armed()
	}
	err := s.srv.Close()
	_ = s.srv.Wait()
	return err
}

// enqueue queues an ask for path and wakes an armed host.
func (s *Server) enqueue(path string) (*ask, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if len(s.waiting) >= s.opts.MaxConnections {
		s.mu.Unlock()
		return nil, fmt.Errorf("%d requests already wait for an answer", len(s.waiting))
	}
	s.lastID++
	a := &ask{Ask: Ask{ID: s.lastID, Path: path}, answer: make(chan Answer, 1)}
	s.queue = append(s.queue, a)
	s.waiting[a.ID] = a
	armed := s.armed
	s.armed = nil
	s.mu.Unlock()
	if armed != nil {
		armed()
	}
	return a, nil
}

// forget drops an ask whose request stopped waiting.
func (s *Server) forget(a *ask) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(a)
}

func (s *Server) forgetLocked(a *ask) {
	delete(s.waiting, a.ID)
	for i, q := range s.queue {
		if q == a {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			break
		}
	}
}

// serveHTTP answers a request: its method and path here, the rest with
// the host's answer (or 503 when none comes in time).
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		plain(w, r, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if !s.paths[r.URL.Path] {
		plain(w, r, http.StatusNotFound, "not found")
		return
	}
	a, err := s.enqueue(r.URL.Path)
	if err != nil {
		plain(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	t := time.NewTimer(s.opts.AnswerTimeout)
	defer t.Stop()
	select {
	case ans := <-a.answer:
		write(w, r, ans)
	case <-t.C:
		s.forget(a)
		plain(w, r, http.StatusServiceUnavailable, fmt.Sprintf("no answer within %v", s.opts.AnswerTimeout))
	case <-r.Context().Done():
		s.forget(a)
	case <-s.done:
		plain(w, r, http.StatusServiceUnavailable, "shutting down")
	}
}

// write sends an answer (its body only to a GET).
func write(w http.ResponseWriter, r *http.Request, a Answer) {
	h := w.Header()
	if a.ContentType != "" {
		h.Set("Content-Type", a.ContentType)
	}
	h.Set("Content-Length", strconv.Itoa(len(a.Body)))
	w.WriteHeader(a.Code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(a.Body)
	}
}

// plain answers with a line of text.
func plain(w http.ResponseWriter, r *http.Request, code int, text string) {
	write(w, r, Answer{Code: code, ContentType: "text/plain; charset=utf-8", Body: []byte(text + "\n")})
}
