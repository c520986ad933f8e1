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
//     once it has waited EvictAfter (the policy of go/listener, whose
//     listener the frontend serves on). Connections serving a request are
//     not bounded here.
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
//     declare in their metadata, their model cards (go/modelcard); requests
//     are routed only to instances of the requested model that have the
//     text (tokenizer, chat template) the request was tokenized with (text.go).
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
// The files: frontend.go holds the options, the routes and the drain;
// settings.go reads a host's settings (Settings, each one's one parser);
// serve.go serves a request, respond.go writes its response, errors.go
// answers and logs failures, models.go reads the instances' metadata,
// aborts.go counts a disconnect's abort, openai.go reads the OpenAI request
// surface, jsonkeys.go refuses keys not named exactly, text.go is the
// models' languages.
package frontend

import (
	"container/list"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/listener"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/procs"
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
	// MaxBodyBytes bounds a request body (0: DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// DefaultMaxModelLen is a model's context length when none of its
	// instances declares one (max_model_len in their model card); 0 means
	// DefaultMaxModelLen.
	DefaultMaxModelLen int
	// MaxIdleConnections bounds the connections not serving a request (new
	// ones before their first request's headers, kept-alive ones between
	// requests); past it the oldest is closed (0:
	// DefaultMaxIdleConnections).
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
	// it they are answered 503 overloaded. 0: DefaultMaxQueuedRequests;
	// below 0: no queue; at most MaxQueuedLimit.
	MaxQueuedRequests int
	// AdaptiveProcs fits the process's Ps to its load while the frontend
	// runs: one P while the process is quiet, the runtime's default once
	// it is busy (go/procs). For a process that is the frontend alone (the
	// frontend command): it sets GOMAXPROCS for the whole process.
	AdaptiveProcs bool
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
	// DefaultMaxIdleConnections is the default of
	// Options.MaxIdleConnections.
	DefaultMaxIdleConnections = 1024
	// DefaultMaxQueuedRequests is the default of Options.MaxQueuedRequests.
	DefaultMaxQueuedRequests = 1024
	// EvictAfter is how long a connection must have waited (since it was
	// accepted, or since its last response) before it may be closed to make
	// room for a new one (listener.Options.EvictAfter): long enough for a
	// burst of real clients past the bound to send their requests.
	EvictAfter = time.Second
)

func (o *Options) defaults() error {
	if o.Namespace == "" {
		o.Namespace = "dynamo"
	}
	if o.DefaultMaxTokens <= 0 {
		o.DefaultMaxTokens = 16
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxIdleConnections <= 0 {
		o.MaxIdleConnections = DefaultMaxIdleConnections
	}
	if o.DefaultMaxModelLen <= 0 {
		o.DefaultMaxModelLen = DefaultMaxModelLen
	}
	if o.MaxQueuedRequests == 0 {
		o.MaxQueuedRequests = DefaultMaxQueuedRequests
	}
	if o.MaxQueuedRequests < 0 {
		o.MaxQueuedRequests = -1
	} else if err := checkMaxQueued(o.MaxQueuedRequests); err != nil {
		return err
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
	rt        *plane.Runtime
	opts      Options
	client    *plane.Client // all instances of the backend endpoint
	srv       *listener.Server
	hangups   *hangups // clients' hang-ups seen off the scheduler (hangup.go); nil: none
	metrics   *metrics
	texts     texts                      // the models' languages, loaded from their directories, by content (text.go)
	turn      atomic.Uint64              // whose text the next request takes, among a model's instances (text.go)
	modelIx   atomic.Pointer[modelIndex] // what requests read of the instances (modelindex.go)
	modelIxMu sync.Mutex                 // held while one is made

	unsubscribe  func() // from abort confirmations
	releaseProcs func() // Options.AdaptiveProcs's hold (a no-op without)

	draining  atomic.Bool   // Drain was called
	hurry     chan struct{} // closed by a Drain during a drain: stop waiting
	hurryOnce sync.Once
	drained   chan struct{} // closed when the drain is over
	stopping  chan struct{} // closed when a drain gives up waiting: queued requests leave (admission.go)
	closeErr  error

	mu       sync.Mutex
	inflight map[*ctxtree.Context]struct{} // the contexts of the worker requests being served (Drain)
	clients  map[route]*plane.Client       // per model and text (models.go)
	gates    map[route]*gate               // with each client: admission (admission.go)
	files    *plane.Client                 // the workers serving model files (modelfiles.go), made on first use
	pending  map[string]*pendingAbort      // request key -> disconnect waiting for its confirmation
	byAge    list.List                     // the same entries (*pendingAbort), oldest first: expiry
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
		rt: rt, opts: opts, client: client, metrics: newMetrics(),
		clients: map[route]*plane.Client{}, gates: map[route]*gate{}, pending: map[string]*pendingAbort{},
		hurry: make(chan struct{}), drained: make(chan struct{}), stopping: make(chan struct{}),
		hangups: newHangups(), releaseProcs: func() {},
	}
	unsubscribe, err := rt.OnAbortConfirmed(f.onAbortConfirmed)
	if err != nil {
		client.Close()
		return nil, err
	}
	f.unsubscribe = unsubscribe
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", f.completions)
	mux.HandleFunc("POST /v1/chat/completions", f.chatCompletions)
	mux.HandleFunc("POST /tokenize", f.tokenize)
	mux.HandleFunc("POST /detokenize", f.detokenize)
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
	f.srv, err = listener.Listen(listener.Options{
		Addr: opts.Addr, MaxIdleConnections: opts.MaxIdleConnections, EvictAfter: EvictAfter,
		ReadHeaderTimeout: opts.ReadHeaderTimeout, ReadTimeout: opts.ReadTimeout, IdleTimeout: opts.IdleTimeout,
		MaxHeaderBytes: MaxHeaderBytes, ConnContext: connContext,
	}, handler)
	if err != nil {
		f.hangups.close()
		unsubscribe()
		client.Close()
		return nil, err
	}
	if opts.AdaptiveProcs {
		f.releaseProcs = procs.Acquire()
	}
	return f, nil
}

// Addr is the address the frontend listens on.
func (f *Frontend) Addr() string { return f.srv.Addr() }

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
		_ = f.srv.Wait()
		f.hangups.close()
		f.client.Close() // and the per-model clients made from it (models.go)
		f.mu.Lock()
		files := f.files
		f.mu.Unlock()
		if files != nil {
			files.Close()
		}
		f.unsubscribe()
		f.releaseProcs()
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

func (f *Frontend) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"status": "healthy", "models": f.modelNames(), "instances": f.client.NumInstances()})
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
