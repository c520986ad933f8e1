package plane

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// Endpoint is one served instance of an endpoint path. Incoming requests
// queue up until the host takes them with Accept.
type Endpoint struct {
	rt         *Runtime
	path       string
	instanceID uint64
	lease      *discovery.Lease
	sub        *nats.Subscription

	mu       sync.Mutex
	closed   bool
	draining bool // Drain: out of discovery, refusing new requests
	pending  []*Request
	active   map[*Request]struct{}
	// ending counts the requests whose handler is done and whose end
	// frame is being written (Request.end); endingZero is closed when it
	// goes back to 0 (nil while it is 0).
	ending     int
	endingZero chan struct{}
	ready      arm
	closedCh   chan struct{}
	readers    chan struct{}  // one token per goroutine reading an envelope (see onMsg)
	reading    sync.WaitGroup // those goroutines: Close waits for them
	places     places         // its capacity and count (workerload.go)
	load       *loadPublisher // its load reports; nil without a capacity
}

// Serve registers a new instance of path and starts receiving its requests.
// meta is published with the instance (for example the model it serves).
// WithCapacity bounds the requests it serves at once (workerload.go).
func (r *Runtime) Serve(path string, meta []byte, opts ...ServeOption) (*Endpoint, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	if r.isClosed() {
		return nil, ErrClosed
	}
	e := &Endpoint{
		rt: r, path: path, instanceID: discovery.NewInstanceID(),
		active: map[*Request]struct{}{}, closedCh: make(chan struct{}),
		readers: make(chan struct{}, envelopeReaders),
	}
	var o serveOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.capacity > 0 {
		e.places.capacity = o.capacity
		e.load = &loadPublisher{e: e, interval: r.opts.LoadInterval}
	}
	sub, err := r.nc().Subscribe(discovery.RequestSubject(path, e.instanceID), e.onMsg)
	if err != nil {
		return nil, err
	}
	e.sub = sub
	// Flush so that the subscription exists at the server before anyone can
	// learn of the instance: a request must never see "no responders" for a
	// live instance.
	if err := r.nc().Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	lease, err := discovery.Register(r.nc(), path, e.instanceID, meta, r.leaseOpts()...)
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	e.lease = lease
	if err := r.track(func() { r.endpoints[e] = struct{}{} }); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// InstanceID is the id under which this endpoint instance is discoverable.
func (e *Endpoint) InstanceID() uint64 { return e.instanceID }

// Path is the endpoint path.
func (e *Endpoint) Path() string { return e.path }

// Done is closed when the endpoint is closed.
func (e *Endpoint) Done() <-chan struct{} { return e.closedCh }

// onMsg receives the endpoint's requests, one at a time (NATS delivers a
// subscription's messages in order on one goroutine). Reading an envelope
// means checking its JSON, 0.1 ms for 10 kB, so a burst of a few thousand
// long prompts would keep the last callers waiting for their acknowledgement
// past its timeout: envelopes are read on up to envelopeReaders goroutines,
// and a burst beyond that waits in the subscription's buffer.
func (e *Endpoint) onMsg(m *nats.Msg) {
	if m.Reply == "" {
		return // not sent by a plane (every request waits for its acknowledgement)
	}
	e.readers <- struct{}{}
	e.mu.Lock()
	if e.closed || e.draining {
		e.mu.Unlock()
		<-e.readers
		_ = m.Respond(mustJSON(ack{Error: ackShuttingDown}))
		return
	}
	if !e.takePlaceLocked() {
		rep := e.reportLocked()
		e.mu.Unlock()
		<-e.readers
		_ = m.Respond(mustJSON(ack{Error: ackBusy, Load: &rep})) // at once, unread: workerload.go
		return
	}
	e.reading.Add(1)
	e.mu.Unlock()
	e.load.changed()
	go func() {
		defer e.reading.Done()
		defer func() { <-e.readers }()
		e.receive(m)
	}()
}

// envelopeReaders bounds the goroutines reading envelopes (see onMsg).
var envelopeReaders = max(2, runtime.GOMAXPROCS(0))

// receive reads one request envelope, acknowledges it and starts serving it.
// It holds the place onMsg took for it: a request it refuses gives it back
// at once, one it serves owns it until its handler has returned
// (Request.freePlace).
func (e *Endpoint) receive(m *nats.Msg) {
	env, err := readEnvelope(m.Data)
	if err == nil {
		err = env.check()
	}
	if err != nil {
		if err != errRequestTooLarge {
			err = errMalformedEnvelope
		}
		e.refusedPlace()
		_ = m.Respond(mustJSON(ack{Error: err.Error()}))
		return
	}
	req := &Request{
		ep: e, ID: env.ID, Key: env.Key, Payload: env.Request, Metadata: env.Metadata, Ctx: e.rt.opts.NewContext(env.ID), aborts: env.Aborts,
		wake: make(chan struct{}, 1), hostDone: make(chan struct{}), fetchBytes: env.RequestBytes, placed: e.places.capacity > 0,
	}
	e.startHandlerSpan(req, env.Trace) // before the envelope's state applies: the span sees it
	if env.State >= ctxtree.Stopped {
		// The caller's context was cancelled before sending: apply it before
		// the handler can see the request. A stop is the caller's, not the
		// handler's own.
		req.clientStopped = true
		reason := ctxtree.ReasonStopGenerating
		if env.State == ctxtree.Killed {
			reason = ctxtree.ReasonKill
		}
		req.Ctx.Cancel(env.State, reason)
	}
	if env.TimeoutUs != nil {
		// The handler's context dies with the request's deadline by its own
		// timer, also when the caller is frozen or gone; one already passed
		// kills it before the handler sees the request.
		req.Ctx.SetDeadline(time.Now().Add(time.Duration(*env.TimeoutUs) * time.Microsecond))
	}
	if !e.rt.HostAwake() {
		e.refusedPlace()
		_ = m.Respond(mustJSON(ack{Error: ackHostStalled})) // host.go
		return
	}
	e.mu.Lock()
	if e.closed || e.draining {
		e.mu.Unlock()
		e.refusedPlace()
		_ = m.Respond(mustJSON(ack{Error: ackShuttingDown}))
		return
	}
	e.active[req] = struct{}{}
	e.mu.Unlock()
	if env.Addr == e.rt.streamAddr() {
		req.followLocalCaller(env.Token)
	}
	_ = m.Respond(mustJSON(ack{}))
	go req.run(env.Addr, env.Token)
}

// refusedPlace gives back the place onMsg took for a request that receive
// refused.
func (e *Endpoint) refusedPlace() {
	if e.places.capacity > 0 { // set once, before the first request
		e.givePlace()
	}
}

// publish makes req visible to Accept once its stream is connected.
func (e *Endpoint) publish(req *Request) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		req.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonShutdown)
		req.freePlace() // no handler will take it
		return
	}
	e.pending = append(e.pending, req)
	f := e.ready.take()
	e.mu.Unlock()
	call(f)
}

func (e *Endpoint) forget(req *Request) {
	e.mu.Lock()
	delete(e.active, req)
	e.mu.Unlock()
}

// startEnding moves req from the active requests to the ending ones: its
// handler is done, and its end frame is on its way (Request.end). Close no
// longer kills it; Active still counts it, until endDone. It reports
// whether req was active (then endDone must follow).
func (e *Endpoint) startEnding(req *Request) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.active[req]; !ok {
		return false
	}
	delete(e.active, req)
	e.ending++
	if e.endingZero == nil {
		e.endingZero = make(chan struct{})
	}
	return true
}

// endDone ends what startEnding began: the end frame is queued on its
// session (or its write failed).
func (e *Endpoint) endDone() {
	e.mu.Lock()
	e.ending--
	if e.ending == 0 {
		close(e.endingZero)
		e.endingZero = nil
	}
	e.mu.Unlock()
}

// endFrameWait bounds how long Close (and Runtime.Close, for all its
// endpoints) waits for the end frames of requests whose handlers finished
// just before it (a session that is full, its caller not reading, holds a
// write).
const endFrameWait = time.Second

// serving reports whether req is among the requests being served (not yet
// ending).
func (e *Endpoint) serving(req *Request) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.active[req]
	return ok
}

// waitEnding waits, until deadline at most, for the end frames being
// written.
func (e *Endpoint) waitEnding(deadline time.Time) {
	e.mu.Lock()
	zero := e.endingZero
	e.mu.Unlock()
	if zero == nil {
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-zero:
	case <-t.C:
	}
}

// Accept takes the oldest request waiting for a handler, or returns
// ErrAgain (ErrClosed once the endpoint is closed and nothing waits).
func (e *Endpoint) Accept() (*Request, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.pending) == 0 {
		if e.closed {
			return nil, ErrClosed
		}
		return nil, ErrAgain
	}
	req := e.pending[0]
	e.pending[0] = nil
	e.pending = e.pending[1:]
	return req, nil
}

// Next blocks until a request waits for a handler and takes it, or returns
// ErrClosed once the endpoint is closed (or ctx's error). It is Accept for Go
// consumers; hosts that cannot block use Accept and Arm.
func (e *Endpoint) Next(ctx context.Context) (*Request, error) {
	for {
		req, err := e.Accept()
		if err != ErrAgain {
			return req, err
		}
		if err := waitArmed(ctx, e.Arm); err != nil {
			return nil, err
		}
	}
}

// Arm runs f once, when Accept may return something new or the endpoint
// closes; at once if that is already so. f must not block.
func (e *Endpoint) Arm(f func()) {
	e.mu.Lock()
	e.ready.setLocked(&e.mu, len(e.pending) > 0 || e.closed, f)
}

// Drain takes the instance out of discovery at once and refuses the
// requests that still arrive (a caller sends those to another instance:
// they never reached a worker), while the requests being served run on.
// Close ends whatever still runs.
func (e *Endpoint) Drain() {
	e.mu.Lock()
	if e.closed || e.draining {
		e.mu.Unlock()
		return
	}
	e.draining = true
	e.mu.Unlock()
	if e.lease != nil {
		e.lease.Close() // announced at once: watchers drop the instance
	}
}

// Active is the number of requests the endpoint is serving: taken by the
// host or waiting to be, or done with their end frame not yet queued on
// its connection. At 0 a drain may shut down: Close writes what is queued.
func (e *Endpoint) Active() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active) + e.ending
}

// Close stops serving: the instance leaves discovery, new requests are
// refused, and requests being served are killed with ReasonShutdown. Those
// whose handler returned first keep their end frames: Close waits up to
// endFrameWait for them to be queued.
func (e *Endpoint) Close() {
	if finish := e.stop(); finish != nil {
		finish(time.Now().Add(endFrameWait))
	}
}

// stop is the first half of Close: it refuses requests and kills those
// being served. The second, finish, waits for the end frames of those
// that finished first (until deadline at most) and ends the endpoint. It
// returns nil if the endpoint was closed already.
func (e *Endpoint) stop() (finish func(deadline time.Time)) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	active := make([]*Request, 0, len(e.active))
	for r := range e.active {
		active = append(active, r)
	}
	f := e.ready.take()
	e.mu.Unlock()
	e.load.close()
	if e.lease != nil {
		e.lease.Close()
	}
	if e.sub != nil {
		_ = e.sub.Unsubscribe()
	}
	// An envelope being read when the endpoint closed is refused (receive
	// sees closed); its goroutine must not outlive Close.
	e.reading.Wait()
	for _, r := range active {
		if e.serving(r) { // not if its end began meanwhile (Request.end)
			r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonShutdown)
		}
	}
	return func(deadline time.Time) {
		e.waitEnding(deadline) // the end frames of those that finished first: then the sessions close
		close(e.closedCh)
		e.rt.mu.Lock()
		delete(e.rt.endpoints, e)
		e.rt.mu.Unlock()
		call(f)
	}
}

// AbortedSubject carries AbortConfirmation messages: a worker publishes one
// when the handler of a killed request has returned, which is when its
// engine work was aborted and its resources freed. It publishes it on the
// subject its caller named in the request's envelope, the caller's own
// (AbortSubjectOf: one delivery, to the one process that asked), or, for a
// caller of an earlier version that named none, on AbortedSubject itself,
// which every caller subscribes to (OnAbortConfirmed). A worker of an
// earlier version publishes every confirmation on AbortedSubject: callers
// hear those too, so mixed versions lose none.
const AbortedSubject = "dc.aborted"

// AbortSubjectOf is the subject of the abort confirmations of one caller
// (a runtime), named by a key (NewKey) it chose at random.
func AbortSubjectOf(key string) string { return AbortedSubject + "." + key }

// validAbortSubject: what an envelope may name (a stranger on the bus could
// otherwise have workers publish where it likes).
func validAbortSubject(s string) bool {
	key, ok := strings.CutPrefix(s, AbortedSubject+".")
	return ok && ValidKey(key)
}

// AbortConfirmation is the message on AbortedSubject.
type AbortConfirmation struct {
	ID       string `json:"id"`       // the request's correlation id (for logs)
	Key      string `json:"key"`      // the request's key: what a caller matches on
	Path     string `json:"path"`     // the endpoint path
	Instance uint64 `json:"instance"` // the worker instance
	Reason   string `json:"reason"`   // why the request was killed, as the worker saw it
}

// abortConfirmTimeout bounds how long a worker waits for a killed handler
// to return before it stops waiting (and confirms nothing).
const abortConfirmTimeout = 60 * time.Second

// confirmAbort waits for the host's handler of a killed request to return
// and publishes the confirmation.
func (r *Request) confirmAbort() {
	if r.span != nil {
		defer r.finishSpan()
	}
	select {
	case <-r.hostDone:
	case <-r.ep.closedCh:
		return
	case <-time.After(abortConfirmTimeout):
		slog.Warn("killed handler did not return: abort not confirmed", "request_id", r.ID, "request_key", r.Key,
			"waited", abortConfirmTimeout.String())
		return
	}
	reason := r.Ctx.Reason()
	if !r.Ctx.IsKilled() {
		reason = ctxtree.ReasonKill // the Kill overtook the end frame (see run)
	}
	msg := AbortConfirmation{ID: r.ID, Key: r.Key, Path: r.ep.path, Instance: r.ep.instanceID, Reason: reason.String()}
	subject := r.aborts
	if subject == "" {
		subject = AbortedSubject // a caller of an earlier version
	}
	if err := r.ep.rt.nc().Publish(subject, mustJSON(msg)); err != nil {
		level := slog.LevelWarn
		if errors.Is(err, nats.ErrConnectionClosed) {
			level = slog.LevelDebug // this process is shutting down: nothing is lost but the notice
		}
		slog.Log(context.Background(), level, "abort confirmation not published", "request_id", r.ID, "request_key", r.Key, "error", err)
		return
	}
	r.span.Event(tracing.EventAbortConfirmed, attribute.String(tracing.AttrReason, msg.Reason))
	slog.Debug("abort confirmed", "request_id", r.ID, "request_key", r.Key)
}

// OnAbortConfirmed calls f for the abort confirmations of this runtime's
// requests, until the returned unsubscribe is called or the runtime closes:
// those published on the runtime's own subject, and every confirmation
// published on the shared AbortedSubject (by workers of an earlier version,
// which confirm every abort there). f runs on a NATS delivery goroutine.
// Anyone on the bus can publish on either: the caller counts a confirmation
// only if its Key and Instance match a request it knows and the instance
// that served it (see Stream.Key and Stream.Instance).
func (r *Runtime) OnAbortConfirmed(f func(AbortConfirmation)) (unsubscribe func(), err error) {
	deliver := func(m *nats.Msg) {
		var a AbortConfirmation
		if json.Unmarshal(m.Data, &a) == nil {
			f(a)
		}
	}
	var subs []*nats.Subscription
	unsubscribe = func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}
	for _, subject := range []string{r.aborts, AbortedSubject} {
		sub, err := r.nc().Subscribe(subject, deliver)
		if err != nil {
			unsubscribe()
			return nil, err
		}
		subs = append(subs, sub)
	}
	if err := r.nc().Flush(); err != nil {
		unsubscribe()
		return nil, err
	}
	return unsubscribe, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
