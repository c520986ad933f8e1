// Package planetest starts request planes for tests: a runtime that embeds
// NATS on a free port, more runtimes that join it, workers that serve an
// endpoint with an accept loop driven like the Python dispatcher's (Arm and
// Accept, one goroutine per request), clients that wait for instances, the
// caller's side of a stream, and the bounded waits every test needs. Every
// resource it makes is released at the test's cleanup, in reverse order of
// creation, so the runtime that hosts NATS closes last.
//
// Import cycles: planetest imports plane, so the tests of package plane
// that use it are external tests (package plane_test). What those tests
// need of plane's unexported state (the round-robin position, an endpoint's
// active requests, ...) reaches them through plane's export_test.go, which
// the go tool compiles into package plane for its tests only; unit tests of
// unexported functions stay internal (*_internal_test.go) and need no
// harness. That keeps one harness for every package instead of an internal
// copy beside an external one. Being under go/internal, planetest can be
// imported only from this module, and it is meant for _test.go files: it
// imports testing and goleak, which the library must not.
package planetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/fakeengine"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// WaitLimit bounds every wait of the tests, so that a bug shows up as a
// failure rather than a hung test binary. Nothing is expected to take more
// than a fraction of it.
const WaitLimit = 10 * time.Second

// ErrTimeout is what the waits that return an error report after WaitLimit.
var ErrTimeout = errors.New("timed out waiting for an Arm to fire")

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// UUID matches a version 4 UUID, the form of the request ids the plane and
// the frontend make.
var UUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Armed returns a one-shot, non-blocking function to hand to an Arm, and the
// channel it signals: the way a host that cannot block (the Python
// dispatcher's event loop) waits for progress.
func Armed() (func(), <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

// WaitArm arms with arm and waits until the function fires, or ErrTimeout.
func WaitArm(arm func(func())) error {
	f, ch := Armed()
	arm(f)
	select {
	case <-ch:
		return nil
	case <-time.After(WaitLimit):
		return ErrTimeout
	}
}

// --- runtimes ----------------------------------------------------------------

// Option changes the options of a runtime before it starts.
type Option func(*plane.Options)

// ShortLeases makes instance leases expire quickly, for the tests about
// expiry.
func ShortLeases(o *plane.Options) {
	o.Heartbeat = 50 * time.Millisecond
	o.TTL = 300 * time.Millisecond
}

// Embedded starts a runtime that hosts an embedded NATS server on an
// ephemeral port: the first runtime of a request plane. At the first call of
// a *testing.T it also registers, first (so that it runs last, once the
// test's other cleanups have released everything), a check that no goroutine
// outlives the test.
func Embedded(tb testing.TB, opts ...Option) *plane.Runtime {
	tb.Helper()
	if t, ok := tb.(*testing.T); ok {
		if _, again := leakChecked.LoadOrStore(t, true); !again {
			t.Cleanup(func() {
				leakChecked.Delete(t)
				goleak.VerifyNone(t)
			})
		}
	}
	return start(tb, "nats://127.0.0.1:0", opts...)
}

// leakChecked holds the tests whose leak check Embedded registered.
var leakChecked sync.Map

// Join starts another runtime on the NATS server of host, standing for
// another process. It closes before host (cleanups run in reverse order).
func Join(tb testing.TB, host *plane.Runtime, opts ...Option) *plane.Runtime {
	tb.Helper()
	return start(tb, host.Bus().URL(), opts...)
}

// On starts a runtime that joins the NATS server at url (a server the test
// runs itself, configured its own way).
func On(tb testing.TB, url string, opts ...Option) *plane.Runtime {
	tb.Helper()
	return start(tb, url, opts...)
}

func start(tb testing.TB, url string, opts ...Option) *plane.Runtime {
	tb.Helper()
	// As the library does: migration continues token requests (go/tokens).
	o := plane.Options{NATS: natsbus.Options{URL: url, Logger: Quiet}, Continuation: func() plane.Continuation { return tokens.New() }}
	for _, f := range opts {
		f(&o)
	}
	return opened(tb, func(ctx context.Context) (*plane.Runtime, error) { return plane.New(ctx, o) })
}

// opened runs open with a context bounded by WaitLimit; what it opens is
// closed at cleanup.
func opened[T interface{ Close() }](tb testing.TB, open func(context.Context) (T, error)) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), WaitLimit)
	defer cancel()
	v, err := open(ctx)
	require.NoError(tb, err)
	tb.Cleanup(v.Close)
	return v
}

// --- workers -----------------------------------------------------------------

// Handler serves one request on its own goroutine, like one handler task of
// the Python dispatcher. The worker completes the request when the handler
// returns (a no-op after Complete or Fail): that is also what confirms the
// abort of a killed request.
type Handler func(w *Worker, req *plane.Request)

// Worker is one endpoint instance and the loop that accepts its requests.
type Worker struct {
	Name string
	RT   *plane.Runtime // the runtime it serves on
	EP   *plane.Endpoint
	// Reqs receives every request accepted, in order, while it has room
	// (64); the ones that do not fit are not kept.
	Reqs <-chan *plane.Request
	// Quit is closed at cleanup, before the endpoint closes: a handler that
	// waits on the test gives up then.
	Quit <-chan struct{}

	reqs     chan *plane.Request
	quit     chan struct{}
	onAccept func(w *Worker, req *plane.Request)
	wg       sync.WaitGroup
}

// WorkerOption configures Serve.
type WorkerOption func(*workerConfig)

type workerConfig struct {
	name     string
	meta     []byte
	onAccept func(w *Worker, req *plane.Request)
}

// Named names the worker in the test's messages (default: its path).
func Named(name string) WorkerOption { return func(c *workerConfig) { c.name = name } }

// WithMetadata serves with the given instance metadata.
func WithMetadata(meta []byte) WorkerOption { return func(c *workerConfig) { c.meta = meta } }

// OnAccept runs f on the accept loop for every request, in arrival order,
// before the request's handler starts.
func OnAccept(f func(w *Worker, req *plane.Request)) WorkerOption {
	return func(c *workerConfig) { c.onAccept = f }
}

// Serve serves path on rt with h. At cleanup Quit is closed, the endpoint is
// closed (which kills the requests still served) and every handler must have
// returned within WaitLimit.
func Serve(tb testing.TB, rt *plane.Runtime, path string, h Handler, opts ...WorkerOption) *Worker {
	tb.Helper()
	cfg := workerConfig{name: path}
	for _, f := range opts {
		f(&cfg)
	}
	// As a worker does (go/native): a model card's max_num_seqs is the
	// endpoint's capacity, past which it refuses requests as busy.
	card, _ := modelcard.Parse(cfg.meta)
	ep, err := rt.Serve(path, cfg.meta, plane.WithCapacity(card.MaxNumSeqs))
	require.NoError(tb, err)
	w := &Worker{Name: cfg.name, RT: rt, EP: ep, onAccept: cfg.onAccept,
		reqs: make(chan *plane.Request, 64), quit: make(chan struct{})}
	w.Reqs, w.Quit = w.reqs, w.quit
	w.wg.Add(1)
	go w.loop(h)
	tb.Cleanup(func() { // before the runtime closes
		close(w.quit)
		ep.Close()
		done := make(chan struct{})
		go func() { w.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(WaitLimit):
			tb.Errorf("handlers of worker %s did not return after the endpoint closed", w.Name)
		}
	})
	return w
}

func (w *Worker) loop(h Handler) {
	defer w.wg.Done()
	for {
		req, err := w.EP.Next(context.Background())
		if err != nil { // ErrClosed
			return
		}
		if w.onAccept != nil {
			w.onAccept(w, req)
		}
		select {
		case w.reqs <- req:
		default:
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer req.Complete()
			h(w, req)
		}()
	}
}

// NextReq returns the next request the worker accepted.
func (w *Worker) NextReq(tb testing.TB) *plane.Request {
	tb.Helper()
	return Recv(tb, w.Reqs, "a request at worker "+w.Name)
}

// Send queues item, waiting with Request.Arm while the buffer is full. It
// reports false once the request is killed or the worker quits: the handler
// must return then (the dispatcher closes a killed handler's generator).
func (w *Worker) Send(req *plane.Request, item []byte) bool {
	for {
		err := req.Send(item)
		switch {
		case err == nil:
			return !req.Ctx.IsKilled()
		case errors.Is(err, plane.ErrFull):
			f, ch := Armed()
			req.Arm(f)
			select {
			case <-ch:
			case <-req.Ctx.Killed():
				return false
			case <-w.quit:
				return false
			}
		default:
			return false
		}
	}
}

// Hold is an engine that reports every request on got and holds it, sending
// nothing, until it is killed (or the worker quits).
func Hold(got chan<- *plane.Request) Handler {
	return func(w *Worker, req *plane.Request) {
		got <- req
		select {
		case <-req.Ctx.Killed():
		case <-w.Quit:
		}
	}
}

// --- tokens ------------------------------------------------------------------

// TokenRequest is a token request as a worker reads it (go/tokens).
type TokenRequest = tokens.Request

// ParseTokenRequest reads a token request (tokens.ParseRequest).
func ParseTokenRequest(payload []byte) (TokenRequest, error) { return tokens.ParseRequest(payload) }

// TokenItem is the response item of the token at position k of the sequence:
// {"token_ids": [k], "finish_reason": finish}, finish null when "".
func TokenItem(k int, finish string) []byte { return fakeengine.TokenItem(k, finish) }

// SendTokens sends the tokens at positions from, ..., from+n-1, the last one
// with finish_reason finish; false once the request is killed (see Send).
func (w *Worker) SendTokens(req *plane.Request, from, n int, finish string) bool {
	return w.sendAll(req, fakeengine.Items(from, n, finish))
}

func (w *Worker) sendAll(req *plane.Request, items [][]byte) bool {
	for _, it := range items {
		if !w.Send(req, it) {
			return false
		}
	}
	return true
}

// Tokens is a healthy engine (go/internal/fakeengine): it continues the
// request's sequence (the next token is len(token_ids)) with max_tokens
// tokens, the last one with finish_reason "length", and completes. A
// payload it cannot read fails the request with a ValueError.
func Tokens(w *Worker, req *plane.Request) {
	items, err := fakeengine.Answer(req.Payload)
	if err != nil {
		req.Fail("ValueError: " + err.Error())
		return
	}
	if w.sendAll(req, items) {
		req.Complete()
	}
}

// TokenIDs concatenates the token_ids of items.
func TokenIDs(tb testing.TB, items [][]byte) []int {
	tb.Helper()
	out := []int{}
	for _, it := range items {
		var v struct {
			TokenIDs []int `json:"token_ids"`
		}
		require.NoError(tb, json.Unmarshal(it, &v), "item %s", it)
		out = append(out, v.TokenIDs...)
	}
	return out
}

// Seq is from, from+1, ..., from+n-1.
func Seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// --- the caller's side -------------------------------------------------------

// Client makes a client of path on rt, closed at cleanup.
func Client(tb testing.TB, rt *plane.Runtime, path string) *plane.Client {
	tb.Helper()
	return opened(tb, func(ctx context.Context) (*plane.Client, error) { return rt.Client(ctx, path) })
}

// ServeAndConnect starts the request plane most tests need: a runtime that
// embeds NATS and is the caller, and a worker runtime joining it (another
// process) that serves path with h; the caller's client of path knows the
// worker. opts apply to both runtimes.
func ServeAndConnect(tb testing.TB, path string, h Handler, opts ...Option) (host *plane.Runtime, w *Worker, c *plane.Client) {
	tb.Helper()
	host = Embedded(tb, opts...)
	w, c = connect(tb, host, Join(tb, host, opts...), path, h)
	return host, w, c
}

// ServeOnHost is ServeAndConnect with the worker serving on the caller's
// runtime: caller and worker are one process.
func ServeOnHost(tb testing.TB, path string, h Handler, opts ...Option) (host *plane.Runtime, w *Worker, c *plane.Client) {
	tb.Helper()
	host = Embedded(tb, opts...)
	w, c = connect(tb, host, host, path, h)
	return host, w, c
}

func connect(tb testing.TB, host, wrt *plane.Runtime, path string, h Handler) (*Worker, *plane.Client) {
	tb.Helper()
	w := Serve(tb, wrt, path, h)
	c := Client(tb, host, path)
	WaitInstances(tb, c, 1)
	return w, c
}

// WaitInstances waits until c knows at least n instances, and returns them.
func WaitInstances(tb testing.TB, c *plane.Client, n int) []uint64 {
	tb.Helper()
	deadline := time.Now().Add(WaitLimit)
	for {
		require.NoError(tb, WaitArm(c.ArmInstances))
		if ids := c.InstanceIDs(); len(ids) >= n {
			return ids
		}
		if time.Now().After(deadline) {
			tb.Fatalf("client of %s knows %d instances, want %d", c.Path(), len(c.InstanceIDs()), n)
		}
		time.Sleep(5 * time.Millisecond) // ArmInstances fires at once while one is known
	}
}

// WaitWorkers waits until c knows the instance of every one of ws.
func WaitWorkers(tb testing.TB, c *plane.Client, ws ...*Worker) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		ids := c.InstanceIDs()
		for _, w := range ws {
			if !slices.Contains(ids, w.EP.InstanceID()) {
				return false
			}
		}
		return true
	}, WaitLimit, 5*time.Millisecond, "the client never saw every worker")
}

// Generate sends payload round robin as a child of parent (nil: none).
func Generate(tb testing.TB, c *plane.Client, payload string, parent *ctxtree.Context) *plane.Stream {
	tb.Helper()
	return GenerateRoute(tb, c, payload, parent, plane.RoundRobin, 0)
}

// GenerateRoute is Generate with the given route.
func GenerateRoute(tb testing.TB, c *plane.Client, payload string, parent *ctxtree.Context, route plane.Route, instance uint64) *plane.Stream {
	tb.Helper()
	s, err := c.Generate([]byte(payload), parent, route, instance)
	require.NoError(tb, err)
	return s
}

// WaitStarted waits until the request reached a worker or failed.
func WaitStarted(s *plane.Stream) error {
	for {
		err := s.Started()
		if !errors.Is(err, plane.ErrAgain) {
			return err
		}
		if err := WaitArm(s.Arm); err != nil {
			return err
		}
	}
}

// Take takes until it has n items (or the stream ends).
func Take(s *plane.Stream, n int) ([][]byte, error) {
	if err := WaitStarted(s); errors.Is(err, ErrTimeout) {
		return nil, err
	}
	var items [][]byte
	for len(items) < n {
		b, err := s.Take(n - len(items))
		switch {
		case err == nil:
			items = append(items, b...)
		case errors.Is(err, plane.ErrAgain):
			if err := WaitArm(s.Arm); err != nil {
				return items, err
			}
		default:
			return items, err
		}
	}
	return items, nil
}

// Drain takes items, at most max per Take (0: as many as there are), until
// the stream's terminal error (io.EOF for a normal end), the way the Python
// stream iterates. batches are the sizes of the Takes.
func Drain(s *plane.Stream, max int) (items [][]byte, batches []int, err error) {
	if err := WaitStarted(s); errors.Is(err, ErrTimeout) {
		return nil, nil, err
	}
	for {
		b, err := s.Take(max)
		switch {
		case err == nil:
			items = append(items, b...)
			batches = append(batches, len(b))
		case errors.Is(err, plane.ErrAgain):
			if err := WaitArm(s.Arm); err != nil {
				return items, batches, err
			}
		default:
			return items, batches, err
		}
	}
}

// --- waits -------------------------------------------------------------------

// Recv receives from ch, or fails the test after WaitLimit. On a channel
// that is closed rather than sent on, it is a wait for the close.
func Recv[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(WaitLimit):
		tb.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// ClosedWithin reports whether ch is closed within WaitLimit.
func ClosedWithin(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(WaitLimit):
		return false
	}
}

// GoroutineGone reports whether, within d, no goroutine has fn in its stack.
func GoroutineGone(fn string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte(fn)) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DrainTokens drains s (see Drain) and returns the token ids received, and
// the stream's terminal error.
func DrainTokens(tb testing.TB, s *plane.Stream) ([]int, error) {
	tb.Helper()
	items, _, err := Drain(s, 0)
	return TokenIDs(tb, items), err
}

// --- workers played by hand ----------------------------------------------------

// HandInstance registers an instance of path on rt's bus, with metadata meta
// (nil: none), whose requests go to f, and returns its id: a worker played
// by hand on the wire (a fault a real one cannot be made to have).
func HandInstance(tb testing.TB, rt *plane.Runtime, path string, meta []byte, f nats.MsgHandler) uint64 {
	tb.Helper()
	id := discovery.NewInstanceID()
	sub, err := rt.Bus().Conn().Subscribe(discovery.RequestSubject(path, id), f)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = sub.Unsubscribe() })
	lease, err := discovery.Register(rt.Bus().Conn(), path, id, meta)
	require.NoError(tb, err)
	tb.Cleanup(lease.Close)
	return id
}

// BlackHole registers an instance of path whose requests are received and
// never acknowledged (a stopped worker, or a dead one whose subscription
// the server still holds), and returns its id.
func BlackHole(tb testing.TB, rt *plane.Runtime, path string, meta []byte) uint64 {
	tb.Helper()
	return HandInstance(tb, rt, path, meta, func(*nats.Msg) {})
}

// HandConns are the stream connections of workers played by hand, closed
// at the test's cleanup.
type HandConns struct {
	mu    sync.Mutex
	conns []net.Conn
}

// NewHandConns returns an empty set, closed at tb's cleanup.
func NewHandConns(tb testing.TB) *HandConns {
	h := &HandConns{}
	tb.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			_ = c.Close()
		}
	})
	return h
}

// DialBack answers request envelope m as a worker's Go side would, by hand:
// it dials the caller's address with the stream's token and writes the
// Hello (flushed with the next frame). It neither acknowledges m nor sends
// anything else. ok is false when m is not an envelope or the caller cannot
// be reached.
func (h *HandConns) DialBack(m *nats.Msg) (c net.Conn, w *frame.Writer, ok bool) {
	var env struct{ Addr, Token string }
	if json.Unmarshal(m.Data, &env) != nil {
		return nil, nil, false
	}
	c, err := net.Dial("tcp", env.Addr)
	if err != nil {
		return nil, nil, false
	}
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
	w = frame.NewWriter(c)
	_ = w.WriteHello([]byte(env.Token))
	return c, w, true
}
