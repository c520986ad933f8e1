// Package plane is the request plane of dynamo-ctx: endpoints served by
// workers, clients that send them requests, and the cancellation that crosses
// between the two. It knows nothing of Python or C; the native library wraps
// it in handles, and hosts that cannot block (an asyncio loop) drive it
// through non-blocking calls plus Arm, which runs a function once the object
// may have progressed.
//
// Wire. Requests travel over NATS to the subject of one instance
// (discovery.RequestSubject); the instance acknowledges, then dials the
// caller's stream server and sends the response as frames (package transport).
// Control flows back on the same connection: Stop at most once (data keeps
// flowing), Kill (the stream ends).
//
// Guarantees, each implemented once, here:
//
//   - Identity: the worker's request context has the caller's request id.
//     An outgoing call made with a parent context uses a child of it (same id,
//     linked before the request is sent); without one, a fresh id. The id is
//     a correlation id only (a client may choose it, and two requests may
//     share it): everything keyed internally uses the request's Key, 128
//     bits from crypto/rand made by the caller's plane per logical request
//     (shared by its migration attempts), and each attempt's stream token
//     is 128 bits from crypto/rand too.
//   - Caller stop: the handler's context becomes Stopped (not Killed); items
//     already produced still arrive; the stream then ends without error.
//   - Caller kill: the handler's context becomes Killed; the stream ends.
//   - Already cancelled: a request whose context is cancelled before it is
//     sent arrives with that state applied before the handler starts.
//   - Caller lost (process died, connection dropped): the handler's context
//     is Killed with ReasonConnectionLost.
//   - Handler stopped itself and returned: the caller's stream fails with
//     ErrIncomplete ("Stream ended before generation completed").
//   - Handler failed: the caller's stream fails with a *transport.HandlerError
//     whose message is HandlerErrorPrefix followed by the handler's text.
//   - Worker lost (process died): the caller's stream fails with ErrIncomplete,
//     unless the caller had cancelled, in which case it just ends.
//   - No worker: a request to an instance that is gone fails at once with
//     ErrNoResponders.
//   - Shutdown: Runtime.Close kills every request still being served with
//     ReasonShutdown and ends every stream.
//   - Bounded memory: each direction buffers a bounded number of items; a
//     slow consumer slows its producer (Send reports ErrFull, Recv's credits
//     stop flowing).
package plane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// HandlerError is a handler's failure as the caller's stream reports it
// (Message starts with HandlerErrorPrefix).
type HandlerError = transport.HandlerError

// NATSOptions says where a runtime connects (Options.NATS).
type NATSOptions = natsbus.Options

// NATSEnv names the environment variable read for the NATS address when
// NATSOptions.URL is empty; DefaultNATSURL is the address without either.
const (
	NATSEnv        = natsbus.EnvURL
	DefaultNATSURL = natsbus.DefaultURL
)

// HandlerErrorPrefix starts the message of a handler failure, the wording
// Dynamo's clients match on.
const HandlerErrorPrefix = "a python exception was caught while processing the async generator: "

var (
	// ErrClosed is returned by calls on a runtime that was shut down.
	ErrClosed = errors.New("plane: runtime is shut down")
	// ErrNoResponders: no worker received the request (none registered, or
	// the chosen instance is gone). Migration retries it.
	ErrNoResponders = errors.New("no responders: no worker instance received the request")
	// ErrNoInstances: the client knows of no instance to route to.
	ErrNoInstances = fmt.Errorf("%w (no instances known)", ErrNoResponders)
	// ErrFull: the request's outgoing buffer is full; Arm and retry.
	ErrFull = errors.New("plane: send buffer full")
	// ErrAgain: nothing to take now; Arm and retry.
	ErrAgain = errors.New("plane: nothing ready")
	// ErrIncomplete is the stream's "Stream ended before generation completed".
	ErrIncomplete = transport.ErrIncomplete
	// ErrNotAcknowledged: the worker did not acknowledge the request within
	// the acknowledgement timeout (stopped, or gone before the server noticed).
	// Migration retries it.
	ErrNotAcknowledged = errors.New("the worker did not acknowledge the request in time")
	// ErrNotJSON: a request or response payload is not a JSON value.
	ErrNotJSON = errors.New("payload is not valid JSON")
	// ErrTooLarge: the request envelope would exceed the NATS server's
	// maximum payload; it is refused before anything is sent.
	ErrTooLarge = errors.New("request too large for the request plane")
	// ErrInvalidID: a request id breaks the id rule (ctxtree.ValidateID).
	ErrInvalidID = ctxtree.ErrInvalidID
	// ErrBadMigrationLimit: a migration limit below 0 (see SetMigrationLimit).
	ErrBadMigrationLimit = errors.New("migration_limit must be an int >= 0")
)

const (
	// DefaultAckTimeout bounds the wait for a worker's acknowledgement of a
	// request. The acknowledgement is sent by the worker's Go runtime the
	// moment the request arrives, whatever its handlers are doing, so a
	// longer wait only means a worker that is stopped, or a request that went
	// to a dead worker's subscription before the server noticed its death.
	DefaultAckTimeout = time.Second
	sendBuffer        = 256 // items a handler may queue before Send reports ErrFull
	recvBuffer        = 256 // items a migrating stream holds before it stops reading its attempt
	maxTakeBatch      = 1024
)

// Environment variables read by New when the options leave them empty.
const (
	EnvStreamAddr    = "DYNAMO_CTX_STREAM_ADDR"
	EnvAdvertiseHost = "DYNAMO_CTX_ADVERTISE_HOST"
	// EnvStreamIdleTimeout is the liveness bound of response streams, in
	// seconds (for example "2.5"); see Options.StreamIdleTimeout.
	EnvStreamIdleTimeout = "DYNAMO_CTX_STREAM_IDLE_TIMEOUT"
	// EnvStreamConnections set to "per-stream" makes the workers of this
	// process give each response stream a connection of its own; see
	// Options.ConnectionPerStream.
	EnvStreamConnections = "DYNAMO_CTX_STREAM_CONNECTIONS"
	// EnvLoadInterval is the least time between two load reports of an
	// endpoint, in seconds (for example "0.25"); see Options.LoadInterval.
	EnvLoadInterval = "DYNAMO_CTX_LOAD_INTERVAL"
)

// Options configures New.
type Options struct {
	// NATS is where the runtime connects; see natsbus.Options.
	NATS NATSOptions
	// StreamAddr is where response streams are accepted. Empty means the
	// DYNAMO_CTX_STREAM_ADDR environment variable, else "127.0.0.1:0"
	// (loopback: workers on other machines cannot reach it; a multi-machine
	// deployment sets e.g. "0.0.0.0:0" and AdvertiseHost).
	StreamAddr string
	// AdvertiseHost is the host workers dial to reach StreamAddr. Empty means
	// DYNAMO_CTX_ADVERTISE_HOST, else the listener's own address.
	AdvertiseHost string
	// Heartbeat and TTL of instance leases (zero: discovery's defaults).
	Heartbeat, TTL time.Duration
	// StreamIdleTimeout is how long a response stream's peer may stay
	// silent (no item, no heartbeat) before it is declared gone: a stopped or
	// partitioned worker's streams then migrate or end with ErrIncomplete, a
	// silent caller's handlers are killed with ReasonConnectionLost. Zero
	// means DYNAMO_CTX_STREAM_IDLE_TIMEOUT, else transport.DefaultIdleTimeout
	// (2.5 s: detection within 2.75 s). Every process of a deployment should
	// use the same value.
	StreamIdleTimeout time.Duration
	// ConnectionPerStream makes this runtime's endpoints send each response
	// stream on a connection of its own, dialled for it, as before sessions
	// existed; by default every stream to one caller shares one long-lived
	// connection (transport.Dialer). For comparisons and as a fallback; also
	// set by DYNAMO_CTX_STREAM_CONNECTIONS=per-stream ("shared", the default,
	// or empty keeps sessions; anything else is an error).
	ConnectionPerStream bool
	// AckTimeout bounds the wait for a worker to acknowledge a request
	// (zero: DefaultAckTimeout). Migration retries a request that timed out.
	AckTimeout time.Duration
	// NewContext makes every context the plane creates (a served request's,
	// an outgoing request's). Nil means ctxtree.New; the native library
	// passes one that keeps the state word outside the Go heap.
	NewContext func(id string) *ctxtree.Context
	// Continuation makes, for each migrating request, what carries it from
	// one attempt to the next (see Continuation). Nil means the request is
	// sent again unchanged: the plane knows no schema of its own. The native
	// library passes tokens.New, the token schema's.
	Continuation func() Continuation
	// LoadInterval is the least time between two load reports of an
	// endpoint served with a capacity. Zero means DYNAMO_CTX_LOAD_INTERVAL,
	// else DefaultLoadInterval (100 ms).
	LoadInterval time.Duration
}

// Continuation carries one migrating request across its attempts (a hook:
// the plane itself only moves JSON). Observe sees every item passed to the
// caller, in order; Next returns the request to send to the next worker,
// given the original one, so that it continues where the last stopped.
type Continuation interface {
	Observe(item []byte)
	Next(payload []byte) ([]byte, error)
}

// Completer is what a Continuation may also be: Complete reports, given the
// original request, whether the items passed so far already complete it
// (the worker sent its last item, and only the stream's end was lost, as
// when a worker shuts down as it finishes). A broken attempt of a complete
// request is not retried: the caller's stream ends as finished.
type Completer interface {
	Complete(payload []byte) bool
}

// Runtime is one process's membership in the request plane.
type Runtime struct {
	bus  *natsbus.Bus
	srv  *transport.Server
	dial *transport.Dialer // the response streams this runtime's endpoints send: one session per caller
	opts Options
	log  *slog.Logger

	mu        sync.Mutex
	closed    bool
	endpoints map[*Endpoint]struct{}
	clients   map[*Client]struct{}
	streams   map[*Stream]struct{}        // caller streams not yet ended
	local     map[string]*ctxtree.Context // stream token -> request context, while it is being sent
	done      chan struct{}

	hostTick atomic.Int64 // the host's last HostTick, Unix ns (0: never; host.go)

	aborts string // where workers confirm the aborts of this runtime's requests (serve.go)
}

// ackShuttingDown is a worker's refusal of a request that arrived while its
// endpoint was closing; the caller treats it as "no responders".
const ackShuttingDown = "endpoint is shutting down"

// IsClosed reports whether the runtime was closed.
func (r *Runtime) IsClosed() bool { return r.isClosed() }

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

func (r *Runtime) trackStream(s *Stream) {
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.streams[s] = struct{}{}
	}
	r.mu.Unlock()
	if closed {
		s.abandon()
	}
}

// servesInstance reports whether instance id is an endpoint of this runtime.
func (r *Runtime) servesInstance(id uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for e := range r.endpoints {
		if e.instanceID == id {
			return true
		}
	}
	return false
}

// localCaller returns the request context of this runtime's own stream
// token, if the request is being sent from this process.
func (r *Runtime) localCaller(token string) *ctxtree.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.local[token]
}

func (r *Runtime) setLocal(token string, c *ctxtree.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c == nil {
		delete(r.local, token)
	} else {
		r.local[token] = c
	}
}

func (r *Runtime) forgetStream(s *Stream) {
	r.mu.Lock()
	delete(r.streams, s)
	r.mu.Unlock()
}

// New connects to NATS (embedding a server when none answers at the default
// address) and opens the stream server.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.StreamAddr == "" {
		opts.StreamAddr = os.Getenv(EnvStreamAddr)
	}
	if opts.StreamAddr == "" {
		opts.StreamAddr = "127.0.0.1:0"
	}
	if opts.AdvertiseHost == "" {
		opts.AdvertiseHost = os.Getenv(EnvAdvertiseHost)
	}
	if opts.NewContext == nil {
		opts.NewContext = func(id string) *ctxtree.Context { return ctxtree.New(id) }
	}
	for _, d := range []struct {
		opt *time.Duration
		env string
	}{{&opts.StreamIdleTimeout, EnvStreamIdleTimeout}, {&opts.LoadInterval, EnvLoadInterval}} {
		if *d.opt != 0 {
			continue
		}
		if v := os.Getenv(d.env); v != "" {
			secs, err := strconv.ParseFloat(v, 64)
			if err != nil || secs <= 0 || secs > 3600 {
				return nil, fmt.Errorf("%s=%q: want a number of seconds in (0, 3600]", d.env, v)
			}
			*d.opt = time.Duration(secs * float64(time.Second))
		}
	}
	switch v := os.Getenv(EnvStreamConnections); v {
	case "", "shared":
	case "per-stream":
		opts.ConnectionPerStream = true
	default:
		return nil, fmt.Errorf("%s=%q: want \"shared\" or \"per-stream\"", EnvStreamConnections, v)
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	if opts.LoadInterval <= 0 {
		opts.LoadInterval = DefaultLoadInterval
	}
	bus, err := natsbus.Connect(ctx, opts.NATS)
	if err != nil {
		return nil, err
	}
	srv, err := transport.Listen(opts.StreamAddr, opts.streamOpts()...)
	if err != nil {
		bus.Close()
		return nil, err
	}
	r := &Runtime{
		bus: bus, srv: srv, opts: opts, log: slog.Default(), aborts: AbortSubjectOf(NewKey()),
		dial:      transport.NewDialer(0),
		endpoints: map[*Endpoint]struct{}{},
		clients:   map[*Client]struct{}{},
		streams:   map[*Stream]struct{}{},
		local:     map[string]*ctxtree.Context{},
		done:      make(chan struct{}),
	}
	// After a reconnection (a replacement server, another cluster node), every
	// instance re-announces at once instead of at its next heartbeat.
	bus.OnReconnect(r.reannounce)
	return r, nil
}

func (r *Runtime) reannounce() {
	for _, e := range keysOf(&r.mu, r.endpoints) {
		if e.lease != nil {
			e.lease.Announce()
		}
	}
	// The server reconnected to may have lost a watcher's consumer in the
	// discovery stream, or the stream (a replacement embedded server).
	for _, c := range keysOf(&r.mu, r.clients) {
		c.watcher.Resync()
	}
}

// keysOf is a copy of m's keys, taken with mu held.
func keysOf[K comparable, V any](mu *sync.Mutex, m map[K]V) []K {
	mu.Lock()
	defer mu.Unlock()
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// streamOpts are the stream options of both sides of this runtime's streams.
func (o *Options) streamOpts() []transport.Option {
	if o.StreamIdleTimeout == 0 {
		return nil
	}
	return []transport.Option{transport.WithIdleTimeout(o.StreamIdleTimeout)}
}

// dialStream connects a response stream to the caller at addr: a stream of
// the session to that caller, or a connection of its own (see
// Options.ConnectionPerStream).
func (r *Runtime) dialStream(ctx context.Context, addr, token string) (*transport.Outgoing, error) {
	opts := append(r.opts.streamOpts(), transport.WithHeartbeatGate(r.HostAwake))
	if r.opts.ConnectionPerStream {
		return transport.Dial(ctx, addr, token, opts...)
	}
	return r.dial.Dial(ctx, addr, token, opts...)
}

// NewContext makes a context the way the plane makes its own (see
// Options.NewContext).
func (r *Runtime) NewContext(id string) *ctxtree.Context { return r.opts.NewContext(id) }

// streamAddr is the address workers dial to deliver a response stream.
func (r *Runtime) streamAddr() string {
	addr := r.srv.Addr().String()
	if r.opts.AdvertiseHost == "" {
		return addr
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return net.JoinHostPort(r.opts.AdvertiseHost, port)
}

// Bus returns the runtime's NATS connection.
func (r *Runtime) Bus() *natsbus.Bus { return r.bus }

// Done is closed when the runtime is shut down.
func (r *Runtime) Done() <-chan struct{} { return r.done }

// Close shuts the runtime down: requests being served are killed with
// ReasonShutdown, leases are dropped, streams end, the connection closes.
// Requests whose handlers returned first keep their end frames: Close
// waits up to endFrameWait for them to be queued, then up to 1 s more for
// the callers to read them (transport.Dialer.Close). It is idempotent.
func (r *Runtime) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	eps := make([]*Endpoint, 0, len(r.endpoints))
	for e := range r.endpoints {
		eps = append(eps, e)
	}
	cls := make([]*Client, 0, len(r.clients))
	for c := range r.clients {
		cls = append(cls, c)
	}
	sts := make([]*Stream, 0, len(r.streams))
	for s := range r.streams {
		sts = append(sts, s)
	}
	r.mu.Unlock()
	// Streams still open are the caller's side of requests. Closing the
	// stream server below drops their connections (the workers see the
	// caller lost); a stream whose producer waits for its consumer is
	// released so that it sees that too.
	for _, s := range sts {
		s.abandon()
	}
	// Every endpoint stops first, then one wait for all their end frames.
	finishes := make([]func(time.Time), 0, len(eps))
	for _, e := range eps {
		if finish := e.stop(); finish != nil {
			finishes = append(finishes, finish)
		}
	}
	ends := time.Now().Add(endFrameWait)
	for _, finish := range finishes {
		finish(ends)
	}
	for _, c := range cls {
		c.Close()
	}
	r.dial.Close()
	r.srv.Close()
	r.bus.Close()
	close(r.done)
}

// Drain drains every endpoint this runtime serves (Endpoint.Drain): out of
// discovery, refusing new requests, serving those in flight.
func (r *Runtime) Drain() {
	for _, e := range r.servedEndpoints() {
		e.Drain()
	}
}

// Active is the number of requests this runtime's endpoints are serving.
func (r *Runtime) Active() int {
	n := 0
	for _, e := range r.servedEndpoints() {
		n += e.Active()
	}
	return n
}

func (r *Runtime) servedEndpoints() []*Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	eps := make([]*Endpoint, 0, len(r.endpoints))
	for e := range r.endpoints {
		eps = append(eps, e)
	}
	return eps
}

func (r *Runtime) track(add func()) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	add()
	return nil
}

// ValidatePath checks an endpoint path "namespace.component.endpoint" by
// the one rule, discovery.ValidatePath.
func ValidatePath(path string) error { return discovery.ValidatePath(path) }

// MaxIDLen bounds a request id, in bytes: the id rule's, ctxtree.MaxIDLen
// (a request's id is its context's).
const MaxIDLen = ctxtree.MaxIDLen

// ValidateID checks a request id by the one id rule, ctxtree.ValidateID
// (1 to MaxIDLen bytes of printable UTF-8); its errors wrap ErrInvalidID.
func ValidateID(id string) error { return ctxtree.ValidateID(id) }

// NewKey returns a new request key: 128 bits from crypto/rand, in hex. Stream
// tokens are made the same way.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics if it cannot)
	return hex.EncodeToString(b[:])
}

// ValidKey reports whether k has the form NewKey gives (32 lowercase hex).
func ValidKey(k string) bool {
	if len(k) != 32 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

type ack struct {
	Error string      `json:"error,omitempty"`
	Load  *LoadReport `json:"load,omitempty"` // with ackBusy: the worker's load (workerload.go)
}

// arm is a one-shot readiness callback: set by a host that found nothing to
// do, run (outside the object's lock) by whatever makes progress.
type arm struct{ f func() }

func (a *arm) take() func() {
	f := a.f
	a.f = nil
	return f
}

// setLocked is the body of every Arm method, called with mu held: it
// releases mu, then runs f at once if ready, else keeps f for take.
func (a *arm) setLocked(mu *sync.Mutex, ready bool, f func()) {
	if !ready {
		a.f = f
	}
	mu.Unlock()
	if ready {
		f()
	}
}

// waitArmed blocks until arm runs the callback it is given (see the Arm
// methods), or ctx ends: how Go consumers wait on the non-blocking API.
func waitArmed(ctx context.Context, arm func(func())) error {
	ready := make(chan struct{})
	arm(func() { close(ready) })
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// poke wakes whoever waits on a buffered(1) channel, without blocking: one
// pending wake-up is as good as several.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func call(f func()) {
	if f != nil {
		f()
	}
}

func newToken() string { return transport.NewToken() }

// nc returns the NATS connection.
func (r *Runtime) nc() *nats.Conn { return r.bus.Conn() }

func (r *Runtime) leaseOpts() []discovery.RegisterOption {
	var opts []discovery.RegisterOption
	if r.opts.Heartbeat > 0 {
		opts = append(opts, discovery.WithHeartbeat(r.opts.Heartbeat))
	}
	if r.opts.TTL > 0 {
		opts = append(opts, discovery.WithLeaseTTL(r.opts.TTL))
	}
	return opts
}

func (r *Runtime) watchOpts() []discovery.WatchOption {
	if r.opts.TTL > 0 {
		return []discovery.WatchOption{discovery.WithTTL(r.opts.TTL)}
	}
	return nil
}
