// Package frontend is the OpenAI-compatible HTTP frontend of dynamo-ctx. It
// turns HTTP requests into token requests on the request plane and client
// disconnects into kills.
//
// Guarantees:
//
//   - Request id: the x-request-id header, else x-dynamo-request-id, else a
//     new uuid. It is returned in the response's x-request-id header and is
//     the id of the request's context on every hop (migration attempts,
//     workers, their prefill calls). It is a correlation id only: two
//     requests with the same id run side by side and cancel independently,
//     because everything is keyed by the request's Key (plane.Stream.Key),
//     which no client chooses. An id that is longer than plane.MaxIDLen or
//     not printable UTF-8 is refused (400 invalid_request_id).
//   - Bounded input: a body over Options.MaxBodyBytes is refused (413
//     request_too_large), as is a request the bus could not carry; the
//     prompt's size is checked before it is tokenised, and prompt tokens +
//     max_tokens must fit the model's context length (400
//     context_length_exceeded).
//   - Deadlines: see Options; a response write that stalls for
//     Options.WriteStallTimeout counts as a disconnect.
//   - Connections: at most Options.MaxIdleConnections are held that are not
//     serving a request; past that a new one takes the place of the oldest
//     once it has waited EvictAfter (see idleConns). Connections serving a
//     request are not bounded here.
//   - Confirmations: an abort confirmation counts only if it carries the
//     Key of a request waiting for one and comes from the instance that
//     request's current attempt went to.
//   - Disconnect: when the client goes away before the response is complete
//     (closed socket, client timeout, closed SSE stream), for streaming and
//     non-streaming requests alike, the request's context is killed with
//     reason client_disconnected, which reaches the worker at once, during
//     prefill as well as decode. The disconnect is counted as signalled
//     (dynamo_ctx_frontend_cancellations_total); when the worker confirms the
//     abort (its handler returned after aborting the engine) it is counted as
//     confirmed (dynamo_ctx_frontend_aborts_confirmed_total) and the time from
//     disconnect to confirmation is observed in
//     dynamo_ctx_frontend_disconnect_to_abort_seconds. All are labelled by
//     model. Every worker request's one outcome is counted too (outcome.go).
//   - Models: GET /v1/models lists the models that registered worker instances
//     declare in their metadata ({"model": ...}); requests are routed only to
//     instances of the requested model.
//   - OpenAI API (openai.go, docs/openai-api.md): usage and
//     stream_options.include_usage; n (one worker request per choice), stop
//     strings (matched here), stop_token_ids, seed and sampling options
//     (passed to the engine); string, batch and token prompts; what the
//     engine does not carry (logprobs, ...) is refused with 400 naming the
//     param. Keys are matched exactly (jsonkeys.go): a key that differs
//     from a field name only in case, or a field name given twice, is
//     refused (400). Response ids are "cmpl-"/"chatcmpl-" + the request id. Every
//     error, on every path (404, 405, 413, 500), has OpenAI's shape, and
//     each failed request is logged once (see recorder).
//   - Migration: requests are retried on another worker up to the migration
//     limit: the frontend's own (Options.MigrationLimit, if >= 0), else the
//     largest limit the model's instances declare.
//   - Text (text.go): a model whose workers name a model directory in the
//     Hugging Face layout speaks its own language: prompts are tokenized by
//     its tokenizer and chat is rendered by its template (go/hfmodel), output
//     is detokenized incrementally (never splitting a UTF-8 character), and
//     stop strings, usage and the context length are in its text and
//     tokens. A directory the frontend cannot load is a 503 naming it, never
//     a silent fall-back. A model without one gets a stand-in (one token per
//     prompt byte, a fixed word per output token), for tests and demos.
//
// The files: frontend.go serves requests and writes responses, openai.go
// reads the OpenAI request surface, text.go is the models' languages.
package frontend

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// Options configures New.
type Options struct {
	// Addr is the listen address, e.g. "127.0.0.1:8000" or ":8000".
	Addr string
	// Namespace of the workers' endpoints ("<namespace>.backend.generate").
	Namespace string
	// MigrationLimit overrides the limit workers declare when >= 0.
	MigrationLimit int
	// DefaultMaxTokens applies to a completions request that gives none
	// (16 if 0); a chat request without one runs to the context length.
	DefaultMaxTokens int
	// MaxBodyBytes bounds a request body (0: DYNAMO_CTX_MAX_BODY_BYTES, else
	// DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// DefaultMaxModelLen is a model's context length when none of its
	// instances declares one ("max_model_len" in their metadata); 0 means
	// DefaultMaxModelLen.
	DefaultMaxModelLen int
	// MaxIdleConnections bounds the connections not serving a request (new
	// ones before their first request's headers, kept-alive ones between
	// requests); past it the oldest is closed (0:
	// DYNAMO_CTX_MAX_IDLE_CONNECTIONS, else DefaultMaxIdleConnections).
	MaxIdleConnections int
	// Deadlines (0: the defaults below). ReadTimeout bounds reading the
	// headers and body; it is lifted once the body is read, so long streams
	// are not cut.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout, WriteStallTimeout time.Duration
	// RequestTimeout is every request's timeout unless its
	// x-request-timeout header gives a smaller one (0: none; deadline.go).
	RequestTimeout time.Duration
	// MaxQueuedRequests bounds the requests of a model that wait for a
	// worker with a free place when every one is full (admission.go); past
	// it they are answered 503 overloaded. 0: DYNAMO_CTX_MAX_QUEUED_REQUESTS,
	// else DefaultMaxQueuedRequests; below 0: no queue.
	MaxQueuedRequests int
}

// Defaults of Options.
const (
	DefaultMaxBodyBytes      = 4 << 20
	DefaultMaxModelLen       = 32768
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 90 * time.Second
	DefaultWriteStallTimeout = 30 * time.Second
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes = 64 << 10
	// EnvMaxBodyBytes overrides DefaultMaxBodyBytes (a number of bytes).
	EnvMaxBodyBytes = "DYNAMO_CTX_MAX_BODY_BYTES"
	// DefaultMaxIdleConnections is the default of
	// Options.MaxIdleConnections.
	DefaultMaxIdleConnections = 1024
	// EnvMaxIdleConnections overrides DefaultMaxIdleConnections.
	EnvMaxIdleConnections = "DYNAMO_CTX_MAX_IDLE_CONNECTIONS"
	// DefaultMaxQueuedRequests is the default of Options.MaxQueuedRequests.
	DefaultMaxQueuedRequests = 1024
	// EnvMaxQueuedRequests overrides DefaultMaxQueuedRequests (0: no queue).
	EnvMaxQueuedRequests = "DYNAMO_CTX_MAX_QUEUED_REQUESTS"
)

// ParseMaxQueued reads a queue bound as EnvMaxQueuedRequests spells it (a
// number of requests, 0 for none) as Options.MaxQueuedRequests takes it.
func ParseMaxQueued(v string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 || n > maxQueuedLimit {
		return 0, fmt.Errorf("%s=%q: want a number of requests from 0 (no queue) to %d", EnvMaxQueuedRequests, v, maxQueuedLimit)
	}
	if n == 0 {
		return -1, nil
	}
	return n, nil
}

// maxQueuedLimit bounds the queue bound: a waiting request costs a
// goroutine and its body, so a million is already more than a process
// should hold.
const maxQueuedLimit = 1 << 20

func (o *Options) defaults() error {
	if o.Namespace == "" {
		o.Namespace = "dynamo"
	}
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = 16
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
		if v := os.Getenv(EnvMaxBodyBytes); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("%s=%q: want a positive number of bytes", EnvMaxBodyBytes, v)
			}
			o.MaxBodyBytes = n
		}
	}
	if o.MaxIdleConnections <= 0 {
		o.MaxIdleConnections = DefaultMaxIdleConnections
		if v := os.Getenv(EnvMaxIdleConnections); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return fmt.Errorf("%s=%q: want a positive number of connections", EnvMaxIdleConnections, v)
			}
			o.MaxIdleConnections = n
		}
	}
	if o.DefaultMaxModelLen <= 0 {
		o.DefaultMaxModelLen = DefaultMaxModelLen
	}
	if o.MaxQueuedRequests == 0 {
		o.MaxQueuedRequests = DefaultMaxQueuedRequests
		if v := os.Getenv(EnvMaxQueuedRequests); v != "" {
			n, err := ParseMaxQueued(v)
			if err != nil {
				return err
			}
			o.MaxQueuedRequests = n
		}
	}
	if o.MaxQueuedRequests < 0 {
		o.MaxQueuedRequests = -1
	} else if o.MaxQueuedRequests > maxQueuedLimit {
		return fmt.Errorf("MaxQueuedRequests %d: at most %d", o.MaxQueuedRequests, maxQueuedLimit)
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&o.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&o.ReadTimeout, DefaultReadTimeout},
		{&o.IdleTimeout, DefaultIdleTimeout}, {&o.WriteStallTimeout, DefaultWriteStallTimeout},
	} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	return nil
}

// Frontend is a running HTTP frontend.
type Frontend struct {
	rt      *plane.Runtime
	opts    Options
	client  *plane.Client // all instances of the backend endpoint
	srv     *http.Server
	ln      net.Listener
	metrics *metrics
	idle    *idleConns // bounds the connections not serving a request
	texts   texts      // the models' languages, loaded from their directories

	unsubscribe func() // from abort confirmations

	draining  atomic.Bool   // Drain was called
	hurry     chan struct{} // closed by a Drain during a drain: stop waiting
	hurryOnce sync.Once
	drained   chan struct{} // closed when the drain is over
	stopping  chan struct{} // closed when a drain gives up waiting: queued requests leave (admission.go)
	closeErr  error

	mu       sync.Mutex
	inflight map[*ctxtree.Context]struct{} // the contexts of the worker requests being served (Drain)
	clients  map[string]*plane.Client      // per model
	gates    map[string]*gate              // per model, with its client: admission (admission.go)
	files    *plane.Client                 // the workers serving model files (modelfiles.go), made on first use
	pending  map[string]*pendingAbort      // request key -> disconnect waiting for its confirmation
	byAge    list.List                     // the same entries (*pendingAbort), oldest first: expiry
	serveErr chan error
}

type pendingAbort struct {
	key     string
	model   string
	at      time.Time
	age     *list.Element // in Frontend.byAge
	stream  *plane.Stream // whose current attempt's instance must confirm
	counted bool          // counted as a cancellation (mu held)
}

// New starts the frontend on opts.Addr.
func New(ctx context.Context, rt *plane.Runtime, opts Options) (*Frontend, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	path := opts.Namespace + ".backend.generate"
	client, err := rt.Client(ctx, path)
	if err != nil {
		return nil, err
	}
	f := &Frontend{
		rt: rt, opts: opts, client: client, metrics: newMetrics(), idle: newIdleConns(opts.MaxIdleConnections),
		clients: map[string]*plane.Client{}, gates: map[string]*gate{}, pending: map[string]*pendingAbort{},
		serveErr: make(chan error, 1), hurry: make(chan struct{}), drained: make(chan struct{}), stopping: make(chan struct{}),
	}
	unsubscribe, err := rt.OnAbortConfirmed(f.onAbortConfirmed)
	if err != nil {
		client.Close()
		return nil, err
	}
	f.unsubscribe = unsubscribe
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		unsubscribe()
		client.Close()
		return nil, err
	}
	f.ln = ln
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", f.completions)
	mux.HandleFunc("POST /v1/chat/completions", f.chatCompletions)
	mux.HandleFunc("GET /v1/models", f.models)
	mux.HandleFunc("GET /v1/models/{id...}", f.model)
	mux.HandleFunc("GET /health", f.health)
	mux.HandleFunc("GET /metrics", f.metricsHandler)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A kept-alive connection must not carry the last response's write
		// deadline (see stallWriter) into its next request.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		rec := &recorder{ResponseWriter: w}
		defer rec.logFailure(r)
		defer rec.recoverPanic(r)
		if _, pattern := mux.Handler(r); pattern == "" {
			noRoute(rec, r, mux)
			return
		}
		mux.ServeHTTP(rec, r)
	})
	f.srv = &http.Server{
		Handler: handler, ReadHeaderTimeout: opts.ReadHeaderTimeout, ReadTimeout: opts.ReadTimeout,
		IdleTimeout: opts.IdleTimeout, MaxHeaderBytes: MaxHeaderBytes, ConnState: f.idle.connState,
		// net/http's own complaints go to the library's log, never stderr.
		ErrorLog: slog.NewLogLogger(slog.Default().Handler(), slog.LevelDebug),
	}
	go func() {
		f.serveErr <- f.srv.Serve(&admitListener{Listener: ln, idle: f.idle, done: make(chan struct{})})
	}()
	return f, nil
}

// Addr is the address the frontend listens on.
func (f *Frontend) Addr() string { return f.ln.Addr().String() }

// Close is Drain(5 s).
func (f *Frontend) Close() error { return f.Drain(5 * time.Second) }

// Drain stops serving: it stops accepting at once (the listener and idle
// connections close), lets the requests in flight finish for up to timeout,
// then kills those still running with reason shutdown (their clients get a
// 503, or a final SSE error event, code shutdown) and closes. A call while
// a drain is under way ends its wait at once (a second signal), then
// returns when it is over, as every later call does.
func (f *Frontend) Drain(timeout time.Duration) error {
	if !f.draining.CompareAndSwap(false, true) {
		f.hurryOnce.Do(func() { close(f.hurry) })
		<-f.drained
		return f.closeErr
	}
	defer close(f.drained)
	{
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		go func() {
			select {
			case <-f.hurry:
				cancel()
			case <-ctx.Done():
			}
		}()
		if err := f.srv.Shutdown(ctx); err != nil {
			// The drain timeout passed: what still runs is killed (its
			// clients are answered), what waits in a queue leaves it, then
			// the last handlers get 5 s.
			close(f.stopping)
			f.killInflight(ctxtree.ReasonShutdown)
			last, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if f.closeErr = f.srv.Shutdown(last); f.closeErr != nil {
				_ = f.srv.Close()
			}
		}
		<-f.serveErr
		f.client.Close() // and the per-model clients made from it
		f.mu.Lock()
		files := f.files
		f.mu.Unlock()
		if files != nil {
			files.Close()
		}
		f.unsubscribe()
	}
	return f.closeErr
}

// killInflight kills every worker request still running with reason.
func (f *Frontend) killInflight(reason ctxtree.Reason) {
	f.mu.Lock()
	ctxs := make([]*ctxtree.Context, 0, len(f.inflight))
	for c := range f.inflight {
		ctxs = append(ctxs, c)
	}
	f.mu.Unlock()
	for _, c := range ctxs {
		c.Cancel(ctxtree.Killed, reason)
	}
}

// track registers the contexts of a request's worker requests, for Drain;
// the returned function forgets them.
func (f *Frontend) track(choices []*choice) (forget func()) {
	f.mu.Lock()
	if f.inflight == nil {
		f.inflight = map[*ctxtree.Context]struct{}{}
	}
	for _, c := range choices {
		f.inflight[c.reqCtx] = struct{}{}
	}
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		for _, c := range choices {
			delete(f.inflight, c.reqCtx)
		}
		f.mu.Unlock()
	}
}

type instanceMeta struct {
	Model          string `json:"model"`
	MigrationLimit int    `json:"migration_limit"`
	MaxModelLen    int    `json:"max_model_len"`
	// ModelPath is the model directory (Hugging Face layout) whose
	// tokenizer and chat template are the model's language (text.go).
	ModelPath string `json:"model_path"`
	// MaxNumSeqs is the instance's capacity: the requests its engine runs
	// at once (0: unlimited; admission.go).
	MaxNumSeqs int `json:"max_num_seqs"`
}

// parseMeta reads an instance's metadata. Every request reads every
// instance's (routing, limits), so the parsed form is kept, by the bytes, for
// as many distinct metadata as maxParsedMetas; past that the memo starts over.
func parseMeta(b []byte) instanceMeta {
	parsedMetas.RLock()
	m, ok := parsedMetas.m[string(b)]
	parsedMetas.RUnlock()
	if ok {
		return m
	}
	_ = json.Unmarshal(b, &m)
	parsedMetas.Lock()
	if len(parsedMetas.m) >= maxParsedMetas {
		clear(parsedMetas.m)
	}
	parsedMetas.m[string(b)] = m
	parsedMetas.Unlock()
	return m
}

const maxParsedMetas = 1024

var parsedMetas = struct {
	sync.RWMutex
	m map[string]instanceMeta
}{m: map[string]instanceMeta{}}

// modelClient returns the client that routes to the instances of model. It
// shares the frontend's one view of the instances (the one /health and
// /v1/models show), so a model listed there is routable at once.
func (f *Frontend) modelClient(model string) (*plane.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.clients[model]; c != nil {
		return c, nil
	}
	c, err := f.client.Filtered(func(meta []byte) bool { return parseMeta(meta).Model == model })
	if err != nil {
		return nil, err
	}
	f.gates[model] = newGate(c, max(f.opts.MaxQueuedRequests, 0))
	f.clients[model] = c
	return c, nil
}

// gateOf is the admission of model (made with its client by modelClient).
func (f *Frontend) gateOf(model string) *gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gates[model]
}

func (f *Frontend) migrationLimit(c *plane.Client) int {
	if f.opts.MigrationLimit >= 0 {
		return f.opts.MigrationLimit
	}
	limit := 0
	for _, in := range c.Instances() {
		if m := parseMeta(in.Meta); m.MigrationLimit > limit {
			limit = m.MigrationLimit
		}
	}
	return limit
}

// metas are the parsed metadata of c's instances.
func (f *Frontend) metas(c *plane.Client) []instanceMeta {
	ins := c.Instances()
	out := make([]instanceMeta, len(ins))
	for i, in := range ins {
		out[i] = parseMeta(in.Meta)
	}
	return out
}

// maxModelLen is the model's context length: the smallest its instances
// declare, else Options.DefaultMaxModelLen.
func (f *Frontend) maxModelLen(c *plane.Client) int {
	limit := 0
	for _, in := range c.Instances() {
		if m := parseMeta(in.Meta); m.MaxModelLen > 0 && (limit == 0 || m.MaxModelLen < limit) {
			limit = m.MaxModelLen
		}
	}
	if limit == 0 {
		return f.opts.DefaultMaxModelLen
	}
	return limit
}

func (f *Frontend) modelNames() []string {
	seen := map[string]bool{}
	for _, in := range f.client.Instances() {
		if m := parseMeta(in.Meta); m.Model != "" {
			seen[m.Model] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// hasModel reports whether a registered instance declares model, so that a
// per-model client is only made for models that exist.
func (f *Frontend) hasModel(model string) bool {
	for _, in := range f.client.Instances() {
		if parseMeta(in.Meta).Model == model {
			return true
		}
	}
	return false
}

// onAbortConfirmed counts a worker's confirmation: only for a request
// waiting for one (by its Key, which only the plane and the worker know),
// and only from the instance its current attempt went to. Anything else (a
// late, stray or forged message) is ignored. A confirmation that arrives
// before the kill's outcome (see killOutcome) counts the cancellation too:
// there was something to abort.
func (f *Frontend) onAbortConfirmed(a plane.AbortConfirmation) {
	f.mu.Lock()
	p, known := f.pending[a.Key]
	ok := known && a.Instance != 0 && a.Instance == p.stream.Instance()
	countCancel := false
	if ok {
		f.forget(p)
		countCancel = !p.counted
		p.counted = true
	}
	f.mu.Unlock()
	if known && !ok {
		// A confirmation for a request we wait for, from another instance
		// than the one its current attempt went to: not counted.
		slog.Info("abort confirmation from another instance ignored", "request_id", a.ID, "request_key", a.Key,
			"instance", fmt.Sprintf("%x", a.Instance), "serving_instance", fmt.Sprintf("%x", p.stream.Instance()))
	}
	if ok {
		if countCancel {
			f.metrics.cancellation(p.model)
		}
		f.metrics.abortConfirmed(p.model, time.Since(p.at))
	}
}

// killOutcome counts a disconnect's kill as a cancellation once the plane
// knows it aborted something (see plane.Stream.KillOutcome): a kill that
// crossed the worker's end frame cancelled nothing, and its worker sends no
// confirmation, so it is forgotten.
func (f *Frontend) killOutcome(p *pendingAbort, aborted bool) {
	f.mu.Lock()
	if p.counted {
		f.mu.Unlock()
		return // the confirmation came first
	}
	if aborted {
		p.counted = true
	} else {
		f.forget(p)
	}
	f.mu.Unlock()
	if aborted {
		slog.Debug("cancellation counted, waiting for its confirmation", "request_key", p.key, "model", p.model)
		f.metrics.cancellation(p.model)
	} else {
		slog.Debug("client disconnected after the worker had finished: nothing cancelled", "request_key", p.key, "model", p.model)
	}
}

// requestID is the request's correlation id: the first of the id headers
// present (it must pass plane.ValidateID), else a new uuid.
func requestID(r *http.Request) (string, error) {
	for _, h := range []string{"x-request-id", "x-dynamo-request-id"} {
		v := strings.TrimSpace(r.Header.Get(h))
		if v == "" {
			continue // an empty header is no id
		}
		if err := plane.ValidateID(v); err != nil {
			return "", fmt.Errorf("the %s header must be 1 to %d bytes of printable UTF-8", h, plane.MaxIDLen)
		}
		return v, nil
	}
	return ctxtree.NewID(), nil
}

// writeError answers with an OpenAI-shaped error: {"error": {"message",
// "type", "param", "code"}}. param may be empty (null). The request is
// logged as failed (see recorder).
func writeError(w http.ResponseWriter, status int, msg, kind, param, code string) {
	failed(w, status, msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var p any
	if param != "" {
		p = param
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": kind, "param": p, "code": code}})
}

// failed records why a request failed, for its log line; a failure in a
// response already under way (an error event in a stream) is recorded
// with the status it would have had.
func failed(w http.ResponseWriter, status int, reason string) {
	if rec, ok := w.(*recorder); ok && rec.reason == "" {
		rec.failStatus, rec.reason = status, reason
	}
}

// recorder sees a response's status and the reason it failed, so that each
// failed request is logged once, when it is over: at WARNING for a client
// error (4xx), at ERROR for a server error. A client that disconnects is no
// failure (it is logged at INFO as a cancellation).
type recorder struct {
	http.ResponseWriter
	status     int
	failStatus int
	reason     string
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) logFailure(req *http.Request) {
	status := r.failStatus
	if status == 0 && r.status >= 400 {
		status = r.status
	}
	if status == 0 {
		return
	}
	level := slog.LevelWarn
	if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout {
		// A fault of the stack's. Overload, shutdown and a deadline (503,
		// 504) are how it works under load: warnings.
		level = slog.LevelError
	}
	slog.Log(context.Background(), level, "request failed", "status", status,
		"request_id", r.Header().Get("x-request-id"), "method", req.Method, "path", req.URL.Path, "reason", r.reason)
}

// recoverPanic turns a handler's panic into a 500 (if nothing was sent
// yet) and an ERROR log, instead of a dropped connection.
func (r *recorder) recoverPanic(req *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	slog.Error("panic serving a request", "path", req.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if r.status == 0 {
		writeError(r, http.StatusInternalServerError, "internal error", "internal_error", "", "internal_error")
	} else {
		failed(r, http.StatusInternalServerError, fmt.Sprint("panic: ", p))
		panic(http.ErrAbortHandler) // the response is cut: the client must see it broken
	}
}

// noRoute answers a request no route takes with OpenAI's error shape: 404
// for an unknown path, 405 (with the Allow header the mux sets) for a known
// path and the wrong method.
func noRoute(w http.ResponseWriter, r *http.Request, mux *http.ServeMux) {
	h, _ := mux.Handler(r)
	probe := &statusProbe{header: w.Header()}
	h.ServeHTTP(probe, r)
	switch probe.status {
	case http.StatusMethodNotAllowed:
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, w.Header().Get("Allow")),
			"invalid_request_error", "", "method_not_allowed")
	case http.StatusNotFound, 0:
		writeError(w, http.StatusNotFound, fmt.Sprintf("unknown path: %s %s", r.Method, r.URL.Path), "invalid_request_error", "", "unknown_url")
	default: // a redirect (path cleaning): its headers are set already
		w.WriteHeader(probe.status)
	}
}

// statusProbe runs the mux's own answer for an unrouted request (404, 405
// with Allow, a redirect) to learn its status and headers; its body is
// dropped.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header { return p.header }
func (p *statusProbe) WriteHeader(code int) {
	if p.status == 0 {
		p.status = code
	}
}
func (p *statusProbe) Write(b []byte) (int, error) {
	if p.status == 0 {
		p.status = http.StatusOK
	}
	return len(b), nil
}

func badRequest(w http.ResponseWriter, msg, param, code string) {
	writeError(w, http.StatusBadRequest, msg, "invalid_request_error", param, code)
}

func modelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, fmt.Sprintf("model %q is not served by any worker", model), "invalid_request_error", "model", "model_not_found")
}

func tooLarge(w http.ResponseWriter, msg string) {
	writeError(w, http.StatusRequestEntityTooLarge, msg, "invalid_request_error", "", "request_too_large")
}

func (f *Frontend) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "healthy", "models": f.modelNames(), "instances": len(f.client.Instances())})
}

func modelObject(name string) map[string]any {
	return map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "dynamo-ctx"}
}

func (f *Frontend) models(w http.ResponseWriter, r *http.Request) {
	data := []map[string]any{}
	for _, n := range f.modelNames() {
		data = append(data, modelObject(n))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// model answers GET /v1/models/{id}; the id may contain slashes.
func (f *Frontend) model(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	if !f.hasModel(name) {
		modelNotFound(w, name)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(modelObject(name))
}

func (f *Frontend) metricsHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	f.metrics.write(w)
	f.writeAdmission(w)
}

func (f *Frontend) completions(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, false)
}

func (f *Frontend) chatCompletions(w http.ResponseWriter, r *http.Request) {
	f.serve(w, r, true)
}

// workerItem is a worker's response item (the token schema: go/tokens).
type workerItem = tokens.Item

// choice is one worker request of an HTTP request (one choice of the
// response) and what it has produced.
type choice struct {
	index  int
	reqCtx *ctxtree.Context
	st     atomic.Pointer[plane.Stream] // its worker request (stream()); replaced by a resend
	// resend sends the worker request again (resend.go); items counts
	// those it produced, resends the times it was sent again.
	resend  func() (*plane.Stream, error)
	items   int
	resends int
	// complete: the worker's stream ended normally, or the frontend ended
	// it at a stop string: a disconnect now cancels nothing.
	complete atomic.Bool
	ended    bool // no more items are read from it
	started  bool // a chunk of it was sent (the first carries the chat role)
	stop     stopper
	endErr   error   // how its stream ended, once it did (io.EOF: cleanly)
	text     decoder // the model's output as text
	tokens   int
	all      strings.Builder // the whole text, for a non-streaming response
	finish   string
}

// take applies an item to the choice; it returns the text to send and
// whether the choice's finish reason is now known.
func (c *choice) take(it workerItem) (string, bool) {
	c.tokens += len(it.TokenIDs)
	text, hit := c.stop.feed(c.text.next(it.TokenIDs))
	if hit {
		c.finish = "stop"
		return text, true
	}
	if it.FinishReason != nil {
		c.finish = *it.FinishReason
		return text + c.stop.flush(), true
	}
	return text, false
}

// event is an item (or the end) of one choice's stream.
type event struct {
	c    *choice
	item workerItem
	err  error
}

// pump reads every choice's stream into one channel until ctx ends; wait
// returns when the readers have.
func pump(ctx context.Context, choices []*choice) (events <-chan event, wait func()) {
	ch := make(chan event)
	var wg sync.WaitGroup
	for _, c := range choices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				it, err := c.next(ctx)
				select {
				case ch <- event{c: c, item: it, err: err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return ch, wg.Wait
}

func (f *Frontend) serve(w http.ResponseWriter, r *http.Request, chat bool) {
	start := time.Now()
	id, err := requestID(r)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_id")
		return
	}
	w.Header().Set("x-request-id", id)
	deadline, err := f.requestDeadline(r, start)
	if err != nil {
		badRequest(w, err.Error(), "", "invalid_request_timeout")
		return
	}
	ctl := http.NewResponseController(w)
	body, err := readBody(w, r, f.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooLarge(w, fmt.Sprintf("the request body exceeds %d bytes", mbe.Limit))
			return
		}
		badRequest(w, "could not read the request body", "", "invalid_body")
		return
	}
	// The body is read: the read deadline (there for slow senders) must not
	// cut a long response, nor make the server's background read (which
	// notices a disconnect) fail while the response is streaming.
	_ = ctl.SetReadDeadline(time.Time{})
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		badRequest(w, "the request body is not valid JSON: "+err.Error(), "", "invalid_json")
		return
	}
	if re := checkKeys(body); re != nil {
		badRequest(w, re.msg, re.param, re.code)
		return
	}
	body = nil
	if req.Model == "" {
		badRequest(w, "model is required", "model", "missing_model")
		return
	}
	p := &plan{req: &req, chat: chat}
	refuse := func(err error) {
		var re *requestError
		if errors.As(err, &re) {
			badRequest(w, re.msg, re.param, re.code)
			return
		}
		badRequest(w, err.Error(), "", "invalid_request")
	}
	if err := p.check(); err != nil {
		refuse(err)
		return
	}
	if !f.hasModel(req.Model) {
		modelNotFound(w, req.Model)
		return
	}
	client, err := f.modelClient(req.Model)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "service_unavailable")
		return
	}
	if len(client.Instances()) == 0 {
		modelNotFound(w, req.Model)
		return
	}
	// The model's language: its own tokenizer and chat template, or the
	// stand-in. Prompt sizes are checked before a text is expanded into
	// token ids, and prompt tokens + max_tokens must fit the model's
	// context length.
	tx, err := f.textOf(req.Model, f.metas(client))
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "model_unavailable")
		return
	}
	limit := f.maxModelLen(client)
	prompts, err := parsePrompts(&req, chat, limit, tx)
	if err != nil {
		refuse(err)
		return
	}
	if len(prompts)*p.n > MaxChoices {
		refuse(invalid("n", "invalid_n", "prompts times n must be at most %d", MaxChoices))
		return
	}
	budgets := make([]int, len(prompts))
	for i, pr := range prompts {
		if budgets[i], err = p.maxTokens(len(pr.tokens), limit, f.opts.DefaultMaxTokens); err != nil {
			refuse(err)
			return
		}
	}
	_ = client.SetMigrationLimit(f.migrationLimit(client)) // never below 0
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		deadlineExceeded(w) // spent before anything was sent (reading, tokenizing)
		return
	}
	// A place on a worker, or a wait in the model's queue for one.
	place, err := f.gateOf(req.Model).admit(r.Context(), deadline, f.stopping)
	if err != nil {
		f.notAdmitted(w, req.Model, len(prompts)*p.n, err)
		return
	}

	// One worker request per choice, all under the request's id.
	choices := make([]*choice, 0, len(prompts)*p.n)
	killAll := func() {
		for _, c := range choices {
			if s := c.stream(); s != nil {
				s.Kill() // no-op once it ended; releases it otherwise
			}
		}
	}
	for i, pr := range prompts {
		for j := 0; j < p.n; j++ {
			c := &choice{index: i*p.n + j, reqCtx: f.rt.NewContext(id), stop: stopper{stops: p.stops}, text: tx.decoder(pr.tokens)}
			if !deadline.IsZero() {
				c.reqCtx.SetDeadline(deadline) // travels to every hop as time left
			}
			payload := p.payload(req.Model, pr.tokens, budgets[i], c.index)
			c.resend = func() (*plane.Stream, error) { return client.Generate(payload, c.reqCtx, plane.RoundRobin, 0) }
			var opts []plane.GenerateOption
			if place != nil {
				// The first choice goes into the request's place (and owns it).
				opts, place = append(opts, plane.WithReservation(place)), nil
			}
			var s *plane.Stream
			s, err = client.Generate(payload, c.reqCtx, plane.RoundRobin, 0, opts...)
			if err == nil {
				c.st.Store(s)
			}
			if err != nil {
				killAll()
				if errors.Is(err, plane.ErrTooLarge) {
					tooLarge(w, err.Error())
					return
				}
				writeError(w, http.StatusInternalServerError, err.Error(), "internal_error", "", "internal_error")
				return
			}
			choices = append(choices, c)
			f.metrics.request(req.Model)
		}
	}
	defer f.track(choices)()
	promptTokens := 0
	for _, pr := range prompts {
		promptTokens += len(pr.tokens)
	}
	prompts = nil

	// A client that goes away kills the requests: each context is the
	// request's context, so the kill reaches the worker (and its prefill
	// call) at once. once: a run started by the AfterFunc and the check
	// below never both count it, and the check waits for a run in progress
	// (Do returns only when f has), so the pending entry exists before the
	// streams are killed. A choice whose stream is complete (written out, or
	// ended by the worker) cancelled nothing.
	out := &stallWriter{w: w, ctl: ctl, stall: f.opts.WriteStallTimeout}
	// The response loop's context: r.Context(), and also cancelled by the
	// disconnect handler before it kills anything. A stream that the
	// handler killed ends as cleanly as a finished one; the loop must see
	// the client gone first, or it answers the killed request as finished
	// (finish_reason, [DONE]) to a client that half-closed and still reads.
	// r.Context() alone does not order them: the AfterFunc's goroutine may
	// run before net/http's cancel reaches the loop's context.
	respCtx, clientGone := context.WithCancel(r.Context())
	defer clientGone()
	var once sync.Once
	onDisconnect := func() {
		clientGone()
		once.Do(func() {
			for _, c := range choices {
				// Complete as the client saw it, or as the worker ended it
				// (its final frame is here, not yet written out).
				if !c.complete.Load() && !c.stream().Completed() {
					f.disconnected(c.reqCtx, c.stream(), id, req.Model)
				}
			}
		})
	}
	stopWatching := context.AfterFunc(r.Context(), onDisconnect)
	// A panic from here on (a bug; recoverPanic answers it) must neither
	// leave the watcher to take net/http's cancel of the request's context,
	// after the handler, for a client's disconnect (counted, logged, the
	// workers told client_disconnected), nor leave the streams to it.
	defer func() {
		if p := recover(); p != nil {
			stopWatching()
			killAll()
			panic(p)
		}
	}()
	if testHookBeforeResponse != nil {
		testHookBeforeResponse()
	}

	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	resp := &response{
		f: f, w: out, ctx: respCtx, plan: p, choices: choices, id: prefix + id, model: req.Model,
		created: time.Now().Unix(), promptTokens: promptTokens,
	}
	if req.Stream {
		resp.stream()
	} else {
		resp.unary()
	}
	// The response loop may have seen the disconnect (its reads use the
	// request's context) before the AfterFunc ran, or a write may have
	// failed or stalled: count it either way, once.
	stopWatching()
	// respCtx done: a run of onDisconnect started (it may still be
	// registering the pending aborts): wait for it (once) before killAll.
	if respCtx.Err() != nil || r.Context().Err() != nil || out.failed {
		onDisconnect()
	}
	killAll()
	for _, c := range choices {
		f.metrics.outcome(req.Model, c.outcome())
	}
}

// errShutdown ends a response whose worker requests Drain killed.
var errShutdown = errors.New("the frontend is shutting down and its drain timeout passed")

// testHookBeforeResponse, when set (by tests only), runs in serve once the
// worker requests are sent, before the response is written.
var testHookBeforeResponse func()

// readBody reads at most limit bytes of body (a *http.MaxBytesError past
// that). The buffer grows as bytes arrive, never past a declared length
// within the limit: a client that declares a large body and sends little of
// it holds little (firstBodyChunk), at most 4 times what it sent. The
// buffer doubles until a quarter of the declared length has arrived, then
// takes the whole length, so the largest accepted body costs 1.25 times its
// size at that step and half its size in garbage before it.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	n := r.ContentLength
	if n < 0 || n > limit {
		return io.ReadAll(body)
	}
	buf := make([]byte, 0, min(n, firstBodyChunk))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			size := min(n, 2*int64(cap(buf)))
			if 4*int64(len(buf)) >= n {
				size = n
			}
			grown := make([]byte, len(buf), size)
			copy(grown, buf)
			buf = grown
		}
		m, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF && int64(len(buf)) < n {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	return buf, nil
}

// firstBodyChunk is the buffer a body starts with (its declared length if
// smaller): what a connection that declared a body and sent none holds.
const firstBodyChunk = 16 << 10

// stallWriter writes a response with a deadline on every write: a client
// that stops reading for the stall timeout is treated as gone.
type stallWriter struct {
	w      http.ResponseWriter
	ctl    *http.ResponseController
	stall  time.Duration
	armed  time.Time // when the write deadline was last pushed back
	failed bool
}

// arm pushes the write deadline back; at most once a second (the deadline
// is then between stall-1s and stall away), so a fast stream does not pay
// for it per token.
func (s *stallWriter) arm() {
	if now := time.Now(); now.Sub(s.armed) >= time.Second {
		s.armed = now
		_ = s.ctl.SetWriteDeadline(now.Add(s.stall))
	}
}

func (s *stallWriter) Write(b []byte) (int, error) {
	if s.failed {
		return 0, io.ErrClosedPipe
	}
	s.arm()
	n, err := s.w.Write(b)
	if err != nil {
		s.failed = true
	}
	return n, err
}

// Flush sends what is buffered; false once the client is gone or stalled.
func (s *stallWriter) Flush() bool {
	if s.failed {
		return false
	}
	s.arm()
	if err := s.ctl.Flush(); err != nil {
		s.failed = true
	}
	return !s.failed
}

// disconnected kills the request of a client that went away and records it
// as a cancellation waiting for the worker's confirmation.
func (f *Frontend) disconnected(reqCtx *ctxtree.Context, s *plane.Stream, id, model string) {
	if reqCtx.IsKilled() {
		return
	}
	key := s.Key()
	f.mu.Lock()
	// Registered before the kill, so that no confirmation can arrive first.
	p := f.remember(&pendingAbort{key: key, model: model, at: time.Now(), stream: s})
	f.mu.Unlock()
	if !reqCtx.Cancel(ctxtree.Killed, ctxtree.ReasonClientDisconnected) {
		f.mu.Lock()
		f.forget(p)
		f.mu.Unlock()
		return
	}
	slog.Info("client disconnected: request killed", "request_id", id, "request_key", key, "model", model)
	// Counted as a cancellation when the kill's outcome is known: at the
	// worker's close (or its confirmation), about one round trip from now.
	s.KillOutcome(func(aborted bool) { f.killOutcome(p, aborted) })
}

// remember puts p in the pending table (mu held) and returns it. Entries
// never confirmed (the worker finished first, or died) are forgotten after
// pendingTTL, oldest first, as later ones arrive: O(1) per disconnect.
func (f *Frontend) remember(p *pendingAbort) *pendingAbort {
	for e := f.byAge.Front(); e != nil && p.at.Sub(e.Value.(*pendingAbort).at) > pendingTTL; e = f.byAge.Front() {
		f.forget(e.Value.(*pendingAbort))
	}
	f.forget(f.pending[p.key]) // keys are the plane's, unique; a second entry replaces the first
	f.pending[p.key] = p
	p.age = f.byAge.PushBack(p)
	return p
}

// forget drops p from the pending table (mu held); p may be nil or gone.
func (f *Frontend) forget(p *pendingAbort) {
	if p == nil || p.age == nil {
		return
	}
	f.byAge.Remove(p.age)
	p.age = nil
	if f.pending[p.key] == p {
		delete(f.pending, p.key)
	}
}

// pendingTTL bounds how long a disconnect waits for its confirmation before
// it is forgotten, so the table cannot grow without bound.
const pendingTTL = 5 * time.Minute

// next waits for the stream's next item, or the request's end.
func next(ctx context.Context, s *plane.Stream) (workerItem, error) {
	raw, err := s.Next(ctx)
	if err != nil {
		return workerItem{}, err
	}
	it, err := tokens.ParseItem(raw)
	if err != nil {
		return workerItem{}, fmt.Errorf("worker sent a %w", err)
	}
	return it, nil
}

// response writes the answer to one HTTP request from its choices' streams.
type response struct {
	f            *Frontend
	w            *stallWriter
	ctx          context.Context // the request's, also done when its client is gone (serve)
	plan         *plan
	choices      []*choice
	id, model    string
	created      int64
	promptTokens int
	chunkTail    []byte // what follows the choice in each chunk (appendChunk)
}

func (p *response) object() string {
	switch {
	case p.plan.chat && p.plan.req.Stream:
		return "chat.completion.chunk"
	case p.plan.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (p *response) usage() map[string]any {
	completion := 0
	for _, c := range p.choices {
		completion += c.tokens
	}
	return map[string]any{"prompt_tokens": p.promptTokens, "completion_tokens": completion, "total_tokens": p.promptTokens + completion}
}

// run reads the choices' streams until all have ended, calling on for every
// item of a choice still running; it returns the first error (io.EOF when
// all ended normally, the request's context's error on a disconnect).
func (p *response) run(on func(c *choice, text string, finished bool) error) error {
	ctx, cancel := context.WithCancel(p.ctx)
	var recv func() (event, bool) // false: ctx is done
	if len(p.choices) == 1 {
		// One choice (n=1, the usual case): read it here, without a pump
		// goroutine and its hand-off per token.
		c := p.choices[0]
		recv = func() (event, bool) {
			it, err := c.next(ctx)
			if err != nil && ctx.Err() != nil {
				return event{}, false
			}
			return event{c: c, item: it, err: err}, true
		}
		defer cancel()
	} else {
		events, wait := pump(ctx, p.choices)
		defer wait()
		defer cancel()
		recv = func() (event, bool) {
			select {
			case ev := <-events:
				return ev, true
			case <-ctx.Done():
				return event{}, false
			}
		}
	}
	running := len(p.choices)
	for running > 0 {
		ev, ok := recv()
		if !ok || ctx.Err() != nil {
			// Gone: a pump's event can win the select over ctx.Done(), and
			// a stream the disconnect killed ends as cleanly as a finished one.
			return ctx.Err()
		}
		c := ev.c
		if c.ended {
			continue // ended by the frontend at a stop string
		}
		if ev.err != nil && c.endErr == nil {
			c.endErr = ev.err
		}
		if ev.err != nil && !c.stream().Completed() {
			if byDeadline(c) {
				return errDeadline
			}
			if c.reqCtx.Reason() == ctxtree.ReasonShutdown {
				return errShutdown
			}
		}
		if ev.err == io.EOF {
			c.ended = true
			running--
			c.complete.Store(!c.stream().Context().IsStopped())
			if c.finish == "" { // the worker gave no finish reason
				c.finish = "stop"
				if err := on(c, c.stop.flush(), true); err != nil {
					return err
				}
			}
			continue
		}
		if ev.err != nil {
			if p.ctx.Err() != nil {
				return p.ctx.Err()
			}
			return ev.err
		}
		text, finished := c.take(ev.item)
		if finished && c.finish == "stop" && c.stop.hit {
			// A stop string: the rest of this choice is not wanted.
			c.ended = true
			running--
			c.complete.Store(true)
			c.stream().Kill()
		}
		if err := on(c, text, finished); err != nil {
			return err
		}
	}
	return io.EOF
}

// streamChunk is one event of a streamed response. Its fields are in the
// order a map's keys would be written (alphabetical), as before it was a
// struct: typed, it is encoded without a map per token.
type streamChunk struct {
	Choices []chunkChoice `json:"choices"`
	Created int64         `json:"created"`
	ID      string        `json:"id"`
	Model   string        `json:"model"`
	Object  string        `json:"object"`
}

// streamChunkUsage is streamChunk with "usage" (stream_options.include_usage:
// null in every chunk but the last).
type streamChunkUsage struct {
	Choices []chunkChoice `json:"choices"`
	Created int64         `json:"created"`
	ID      string        `json:"id"`
	Model   string        `json:"model"`
	Object  string        `json:"object"`
	Usage   any           `json:"usage"`
}

// chunkChoice is a choice of a chunk: "delta" for chat, "text" for
// completions.
type chunkChoice struct {
	Delta        *chunkDelta `json:"delta,omitempty"`
	FinishReason *string     `json:"finish_reason"`
	Index        int         `json:"index"`
	Text         *string     `json:"text,omitempty"`
}

type chunkDelta struct {
	Content string `json:"content"`
	Role    string `json:"role,omitempty"`
}

func (p *response) chunk(choices []chunkChoice, usage any) []byte {
	var b []byte
	if p.plan.includeUsage {
		b, _ = json.Marshal(streamChunkUsage{Choices: choices, Created: p.created, ID: p.id, Model: p.model, Object: p.object(), Usage: usage})
	} else {
		b, _ = json.Marshal(streamChunk{Choices: choices, Created: p.created, ID: p.id, Model: p.model, Object: p.object()})
	}
	return b
}

// appendChunk appends the bytes of p.chunk([]chunkChoice{ch}, nil), one
// token's event, without encoding/json's reflection: everything after the
// choice is the same for every chunk of the response and encoded once.
func (p *response) appendChunk(b []byte, ch chunkChoice) []byte {
	if p.chunkTail == nil {
		p.chunkTail = p.chunk([]chunkChoice{}, nil)[len(`{"choices":[`):] // `],"created":...}`
	}
	b = append(b, `{"choices":[{`...)
	if ch.Delta != nil {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, ch.Delta.Content)
		if ch.Delta.Role != "" {
			b = append(b, `,"role":`...)
			b = appendJSONString(b, ch.Delta.Role)
		}
		b = append(b, `},`...)
	}
	b = append(b, `"finish_reason":`...)
	if ch.FinishReason == nil {
		b = append(b, `null`...)
	} else {
		b = appendJSONString(b, *ch.FinishReason)
	}
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(ch.Index), 10)
	if ch.Text != nil {
		b = append(b, `,"text":`...)
		b = appendJSONString(b, *ch.Text)
	}
	b = append(b, '}')
	return append(b, p.chunkTail...)
}

// appendJSONString appends s as encoding/json encodes a string: as it is
// when it is printable ASCII that needs no escape (HTML's <, > and & are
// escaped by encoding/json), else by encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (p *response) stream() {
	w := p.w
	w.w.Header().Set("Content-Type", "text/event-stream")
	w.w.Header().Set("Cache-Control", "no-cache")
	w.w.WriteHeader(http.StatusOK)
	if !w.Flush() {
		return
	}
	var buf []byte // one event, reused
	err := p.run(func(c *choice, text string, finished bool) error {
		if text == "" && !finished && c.started {
			return nil
		}
		ch := chunkChoice{Index: c.index}
		if finished {
			ch.FinishReason = &c.finish
		}
		if p.plan.chat {
			ch.Delta = &chunkDelta{Content: text}
			if !c.started {
				ch.Delta.Role = "assistant"
			}
		} else {
			ch.Text = &text
		}
		c.started = true
		buf = append(buf[:0], "data: "...)
		buf = append(p.appendChunk(buf, ch), "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return err // the client is gone or stalled: serve kills the request
		}
		if !w.Flush() {
			return io.ErrClosedPipe
		}
		return nil
	})
	if err != io.EOF {
		if p.ctx.Err() == nil && !w.failed {
			msg, status, kind, code := err.Error(), http.StatusInternalServerError, "internal_error", "internal_error"
			switch {
			case errors.Is(err, errDeadline):
				status, kind, code = http.StatusGatewayTimeout, "timeout_error", "deadline_exceeded"
			case errors.Is(err, errShutdown):
				status, kind, code = http.StatusServiceUnavailable, "service_unavailable", "shutdown"
			}
			failed(w.w, status, msg)
			b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": kind, "param": nil, "code": code}})
			fmt.Fprintf(w, "data: %s\n\n", b)
			w.Flush()
		}
		return
	}
	if p.plan.includeUsage {
		fmt.Fprintf(w, "data: %s\n\n", p.chunk([]chunkChoice{}, p.usage()))
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
	w.Flush()
}

func (p *response) unary() {
	err := p.run(func(c *choice, text string, finished bool) error {
		c.all.WriteString(text)
		return nil
	})
	if err != io.EOF {
		if p.ctx.Err() != nil {
			return // disconnected: nobody to answer
		}
		status, code := http.StatusInternalServerError, "internal_error"
		switch {
		case errors.Is(err, errDeadline):
			deadlineExceeded(p.w.w)
			return
		case errors.Is(err, errShutdown):
			writeError(p.w.w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "shutdown")
			return
		case errors.Is(err, plane.ErrNoResponders):
			status, code = http.StatusServiceUnavailable, "service_unavailable"
		case errors.Is(err, plane.ErrTooLarge):
			tooLarge(p.w.w, err.Error())
			return
		}
		writeError(p.w.w, status, err.Error(), code, "", code)
		return
	}
	out := make([]any, len(p.choices))
	for i, c := range p.choices {
		ch := map[string]any{"index": c.index, "finish_reason": c.finish}
		if p.plan.chat {
			ch["message"] = map[string]any{"role": "assistant", "content": c.all.String()}
		} else {
			ch["text"] = c.all.String()
		}
		out[i] = ch
	}
	p.w.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(p.w).Encode(map[string]any{
		"id": p.id, "object": p.object(), "created": p.created, "model": p.model, "choices": out, "usage": p.usage(),
	})
}
