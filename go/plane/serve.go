package plane

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
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
	ready    arm
	closedCh chan struct{}
	readers  chan struct{}  // one token per goroutine reading an envelope (see onMsg)
	reading  sync.WaitGroup // those goroutines: Close waits for them
}

// Serve registers a new instance of path and starts receiving its requests.
// meta is published with the instance (for example the model it serves).
func (r *Runtime) Serve(path string, meta []byte) (*Endpoint, error) {
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
	e.reading.Add(1)
	e.mu.Unlock()
	go func() {
		defer e.reading.Done()
		defer func() { <-e.readers }()
		e.receive(m)
	}()
}

// envelopeReaders bounds the goroutines reading envelopes (see onMsg).
var envelopeReaders = max(2, runtime.GOMAXPROCS(0))

// receive reads one request envelope, acknowledges it and starts serving it.
func (e *Endpoint) receive(m *nats.Msg) {
	env, err := readEnvelope(m.Data)
	if err != nil || env.check() != nil {
		_ = m.Respond(mustJSON(ack{Error: errMalformedEnvelope.Error()}))
		return
	}
	req := &Request{
		ep: e, ID: env.ID, Key: env.Key, Payload: env.Request, Metadata: env.Metadata, Ctx: e.rt.opts.NewContext(env.ID),
		wake: make(chan struct{}, 1), hostDone: make(chan struct{}),
	}
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
		_ = m.Respond(mustJSON(ack{Error: ackHostStalled})) // host.go
		return
	}
	e.mu.Lock()
	if e.closed || e.draining {
		e.mu.Unlock()
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

// remoteKillReason is the reason a handler's context gets when its caller
// kills it: the cause the caller sent (client_disconnected, shutdown,
// deadline, ...), or kill when there is none.
func remoteKillReason(cause ctxtree.Reason) ctxtree.Reason {
	if !cause.Valid() || cause == ctxtree.ReasonParent || cause == ctxtree.ReasonStopGenerating {
		return ctxtree.ReasonKill
	}
	return cause
}

// followLocalCaller is the in-process shortcut: when the caller is this
// runtime, its request context's stop and kill reach the handler's context
// synchronously, not after a trip through the TCP stream (which still
// carries them too; the second delivery changes nothing). The reasons are
// the ones the control frames would give.
func (r *Request) followLocalCaller(token string) {
	caller := r.ep.rt.localCaller(token)
	if caller == nil {
		return
	}
	r.localHooks = []func() bool{
		caller.Notify(ctxtree.Stopped, func() {
			if caller.IsKilled() {
				// A kill fires Stopped hooks too (before the Killed ones,
				// in registration order): the handler must see the kill,
				// not a stop_generating on the way to it.
				return
			}
			r.mu.Lock()
			r.clientStopped = true
			r.mu.Unlock()
			r.Ctx.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
		}),
		caller.Notify(ctxtree.Killed, func() {
			r.Ctx.Cancel(ctxtree.Killed, remoteKillReason(caller.Cause()))
			killtrace.Mark("worker.ctx_killed", r.ID) // in-process: no frame
		}),
	}
}

// unfollowLocalCaller undoes followLocalCaller (idempotent).
func (r *Request) unfollowLocalCaller() {
	for _, stop := range r.localHooks {
		stop()
	}
}

// publish makes req visible to Accept once its stream is connected.
func (e *Endpoint) publish(req *Request) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		req.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonShutdown)
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
// host or waiting to be.
func (e *Endpoint) Active() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active)
}

// Close stops serving: the instance leaves discovery, new requests are
// refused, and requests being served are killed with ReasonShutdown.
func (e *Endpoint) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	active := make([]*Request, 0, len(e.active))
	for r := range e.active {
		active = append(active, r)
	}
	f := e.ready.take()
	e.mu.Unlock()
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
		r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonShutdown)
	}
	close(e.closedCh)
	e.rt.mu.Lock()
	delete(e.rt.endpoints, e)
	e.rt.mu.Unlock()
	call(f)
}

// Request is one request being served: its payload, its context, and the
// buffer of items the handler produces.
type Request struct {
	ep *Endpoint
	// ID is the caller's correlation id (also the context's id); Key is the
	// request's internal identity (see NewKey), the same for every migration
	// attempt of one logical request.
	ID, Key string
	Payload json.RawMessage
	// Metadata is the caller's request metadata (a JSON object), nil if none.
	Metadata json.RawMessage
	Ctx      *ctxtree.Context

	wake     chan struct{} // buffered(1): items queued or the handler finished
	hostDone chan struct{} // closed when the host's handler completed or failed
	doneOnce sync.Once

	mu            sync.Mutex
	items         [][]byte
	finished      bool
	failMsg       string
	clientStopped bool
	writable      arm
	localHooks    []func() bool // in-process caller: see followLocalCaller
}

// run connects the response stream, relays control frames into the context,
// and writes the handler's items until the end.
func (r *Request) run(addr, token string) {
	defer r.ep.forget(r)
	defer r.unfollowLocalCaller()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := r.ep.rt.dialStream(ctx, addr, token)
	if err != nil {
		slog.Warn("could not connect the response stream to the caller", "request_id", r.ID, "caller", addr, "error", err)
		r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		return
	}
	defer out.Close()
	// From here ctx ends every wait of this stream (waiting for credit) the
	// moment the request is killed, whoever killed it (the caller, the
	// endpoint's shutdown). A request killed before it was sent is still
	// delivered, already killed, so the handler sees it end.
	defer r.Ctx.Notify(ctxtree.Killed, cancel)()

	// Control frames -> context, on the stream's reader goroutine as each
	// frame is read (no goroutine of our own: one hop less for a kill).
	out.OnControl(func(ev transport.Event) {
		switch ev {
		case transport.EventStop:
			r.mu.Lock()
			r.clientStopped = true
			r.mu.Unlock()
			r.Ctx.Cancel(ctxtree.Stopped, ctxtree.ReasonStopGenerating)
		case transport.EventKill:
			if r.Ctx.IsKilled() {
				break // in-process callers killed it already (followLocalCaller)
			}
			killtrace.Mark("worker.frame_read", r.ID)
			r.Ctx.Cancel(ctxtree.Killed, remoteKillReason(ctxtree.Reason(out.KillCause())))
			killtrace.Mark("worker.ctx_killed", r.ID) // its watchers (the host's fd) signalled
		case transport.EventLost:
			r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		}
	})
	// sendFailed applies what broke a send: a Kill or a lost caller may be
	// what made SendBatch fail, and the handler must see it even if the
	// control event has not been delivered yet.
	sendFailed := func() {
		select {
		case <-out.Killed():
			r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonKill)
		case <-out.Lost():
			r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		default:
			r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		}
		r.release()
		go r.confirmAbort()
	}

	// The handler starts once the caller has answered: a caller that gave
	// up on this request (its acknowledgement came too late, as from a
	// worker that was frozen) refuses the stream, and the request is
	// dropped unstarted. A request killed meanwhile still reaches the
	// handler, killed, so that it sees it end.
	attachWait := time.NewTimer(transport.DefaultConnectTimeout) // a caller that never answers (liveness off) holds nothing
	defer attachWait.Stop()
	select {
	case <-out.Attached():
	case <-r.Ctx.Killed():
	case <-attachWait.C:
	case <-out.Lost():
		slog.Debug("the caller no longer expects the request: not started", "request_id", r.ID, "caller", addr)
		r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		r.release()
		return
	}
	r.ep.publish(r)
	killed := r.Ctx.Killed()
	for {
		select {
		case <-r.wake:
		case <-killed:
			time.Sleep(transport.KillSettle) // the host's thread first: see KillSettle
			r.release()
			go r.confirmAbort()
			return
		}
		r.mu.Lock()
		items := r.items
		r.items = nil
		finished, failMsg, clientStopped := r.finished, r.failMsg, r.clientStopped
		f := r.writable.take()
		r.mu.Unlock()
		call(f)
		if len(items) > 0 {
			if _, err := out.SendBatch(ctx, items); err != nil {
				sendFailed()
				return
			}
		}
		if finished {
			// The handler is done: from here on neither the endpoint's
			// shutdown nor an in-process caller cancels its context, so
			// nothing moves it after the caller has seen the end frame.
			r.ep.forget(r)
			r.unfollowLocalCaller()
			// A killed request gets no end frame, and a confirmation once
			// the handler has returned; so does one whose end frame the
			// Kill overtook (the write fails with ErrKilled). The caller
			// sees the same thing: an end frame after its Kill means the
			// Kill aborted nothing (see Stream.KillOutcome).
			var err error
			switch {
			case r.Ctx.IsKilled():
				err = transport.ErrKilled
			case failMsg != "":
				err = out.Fail(HandlerErrorPrefix + failMsg)
			case r.Ctx.IsStopped() && !clientStopped:
				// The handler stopped its own request: the caller reports it
				// as incomplete, and migration knows not to retry it.
				err = out.Incomplete("the handler stopped the request")
			default:
				err = out.Finish()
			}
			if errors.Is(err, transport.ErrKilled) {
				go r.confirmAbort()
			}
			return
		}
	}
}

// release wakes a handler blocked on a full buffer after the stream ended,
// so it sees the kill instead of waiting.
func (r *Request) release() {
	r.mu.Lock()
	r.finished = true
	r.items = nil
	f := r.writable.take()
	r.mu.Unlock()
	call(f)
}

func (r *Request) poke() { poke(r.wake) }

// Send queues one item (a JSON value) for the caller. It never blocks:
// ErrFull means the buffer is full (Arm, then retry); after the request was
// killed or finished, items are dropped silently (the handler is being
// closed).
func (r *Request) Send(item []byte) error {
	if !json.Valid(item) {
		return ErrNotJSON
	}
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return nil
	}
	if len(r.items) >= sendBuffer {
		r.mu.Unlock()
		return ErrFull
	}
	r.items = append(r.items, item)
	first := len(r.items) == 1
	r.mu.Unlock()
	if first {
		r.poke()
	}
	return nil
}

// SendMany queues items (each a JSON value) in order, as many as the
// buffer takes, and reports how many it took: all of them, or fewer with
// ErrFull (Arm, then send the rest). One call wakes the stream's writer
// once, however many items it queues. An item that is not JSON fails the
// call with ErrNotJSON after the items before it were queued. After the
// request was killed or finished, items are dropped silently (all taken).
func (r *Request) SendMany(items [][]byte) (int, error) {
	for i, it := range items {
		if !json.Valid(it) {
			n, err := r.sendMany(items[:i])
			if err != nil {
				return n, err
			}
			return n, ErrNotJSON
		}
	}
	return r.sendMany(items)
}

func (r *Request) sendMany(items [][]byte) (int, error) {
	if len(items) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return len(items), nil
	}
	n := min(len(items), sendBuffer-len(r.items))
	if n <= 0 {
		r.mu.Unlock()
		return 0, ErrFull
	}
	first := len(r.items) == 0
	r.items = append(r.items, items[:n]...)
	r.mu.Unlock()
	if first {
		r.poke()
	}
	if n < len(items) {
		return n, ErrFull
	}
	return n, nil
}

// Arm runs f once when Send may succeed again (or the request ended).
func (r *Request) Arm(f func()) {
	r.mu.Lock()
	r.writable.setLocked(&r.mu, len(r.items) < sendBuffer || r.finished, f)
}

// Complete ends the request normally: queued items are sent, then the final
// marker, unless the handler stopped the request itself (then the caller
// sees an incomplete stream) or it was killed.
func (r *Request) Complete() { r.finish("") }

// Fail ends the request with a handler error; msg is "<Type>: <message>".
func (r *Request) Fail(msg string) {
	if msg == "" {
		msg = "unknown error"
	}
	r.finish(msg)
}

func (r *Request) finish(msg string) {
	r.doneOnce.Do(func() { close(r.hostDone) })
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return
	}
	r.finished = true
	r.failMsg = msg
	r.mu.Unlock()
	r.poke()
}

// AbortedSubject carries AbortConfirmation messages: a worker publishes one
// when the handler of a killed request has returned, which is when its
// engine work was aborted and its resources freed.
const AbortedSubject = "dc.aborted"

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
	if err := r.ep.rt.nc().Publish(AbortedSubject, mustJSON(msg)); err != nil {
		level := slog.LevelWarn
		if errors.Is(err, nats.ErrConnectionClosed) {
			level = slog.LevelDebug // this process is shutting down: nothing is lost but the notice
		}
		slog.Log(context.Background(), level, "abort confirmation not published", "request_id", r.ID, "request_key", r.Key, "error", err)
		return
	}
	slog.Debug("abort confirmed", "request_id", r.ID, "request_key", r.Key)
}

// OnAbortConfirmed calls f for every abort confirmation any worker
// publishes, until the returned unsubscribe is called or the runtime closes.
// f runs on a NATS delivery goroutine. Anyone on the bus can publish here:
// the caller counts a confirmation only if its Key and Instance match a
// request it knows and the instance that served it (see Stream.Key and
// Stream.Instance).
func (r *Runtime) OnAbortConfirmed(f func(AbortConfirmation)) (unsubscribe func(), err error) {
	sub, err := r.nc().Subscribe(AbortedSubject, func(m *nats.Msg) {
		var a AbortConfirmation
		if json.Unmarshal(m.Data, &a) == nil {
			f(a)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := r.nc().Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
