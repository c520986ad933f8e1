package plane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// Stream is the caller's side of one request: items arrive in a bounded
// buffer that the host drains with Take.
type Stream struct {
	rt        *Runtime
	client    *Client         // nil for a migrating stream's outer stream
	instance  uint64          // the instance this attempt went to (0: none); moved by reroute
	route     Route           // how the attempt was routed (reroute)
	exclude   map[uint64]bool // the instances it avoids (migration's; read only)
	outer     *Stream         // the migrating stream this is an attempt of (nil: none)
	served    atomic.Uint64   // the instance of the current attempt (see Instance)
	key       string          // the logical request's key (see NewKey)
	ctx       *ctxtree.Context
	parent    *ctxtree.Context // the caller's context (nil for none): see Killed
	in        *transport.Incoming
	attempt   atomic.Pointer[Stream] // a migrating stream's current attempt (see KillOutcome)
	unload    atomic.Pointer[func()] // gives the attempt's place on its instance back (capacity.go)
	stopHooks []func() bool
	wake      chan struct{} // buffered(1): the consumer took items
	abandoned atomic.Bool   // the runtime closed: stop holding the producer
	span      *tracing.Span // this attempt's span (trace.go); nil: not traced
	// direct: the items are taken from in's queue (TryRecv), not from
	// items; set once the request reached its worker (a migrating
	// stream's outer stream, whose attempts push into items, never is).
	direct atomic.Bool
	// Next's wake-up, made at its first wait and kept: armed again at
	// every wait, it pokes nextCh (cap 1).
	nextCh   chan struct{}
	nextWake func()

	mu      sync.Mutex
	started bool // the request reached a worker (acknowledged)
	items   [][]byte
	err     error // terminal: io.EOF for a normal end
	ready   arm
	// startSeen: the host saw Started() succeed, so Arm need not fire for
	// the start any more.
	startSeen bool
}

// Context is the request's context (a child of the caller's, or a root).
func (s *Stream) Context() *ctxtree.Context { return s.ctx }

// Key is the request's key: made by this plane, shared by every migration
// attempt, carried to the worker (Request.Key) and in its abort
// confirmation. Unlike the id, no client can choose or guess it.
func (s *Stream) Key() string { return s.key }

// Instance is the worker instance the current attempt was sent to (0 before
// one was chosen): the only instance whose abort confirmation counts.
func (s *Stream) Instance() uint64 { return s.served.Load() }

// dispatchBudget bounds how long a request keeps trying to reach its
// worker while the NATS connection is down or settling after a
// reconnection (see dispatch).
const dispatchBudget = 3 * time.Second

// dispatch sends the request envelope and waits for the worker's
// acknowledgement. While the bus is down it waits for the connection (a
// replacement server, another cluster node) instead of failing; while it
// settles after a reconnection, "no responders" and a missing
// acknowledgement mean the worker has not re-subscribed yet, so the same
// envelope is sent again after a short pause. Resending is safe: the
// stream token admits one worker connection, so at most one worker serves
// the request. All of it within dispatchBudget, and never once the
// request is cancelled.
func (s *Stream) dispatch(nc *nats.Conn, subject string, env []byte) (*nats.Msg, error) {
	deadline := time.Now().Add(dispatchBudget)
	for attempt := 0; ; attempt++ {
		if s.rt.bus.Settling() {
			wctx, cancel := context.WithDeadline(context.Background(), deadline)
			stopWait := context.AfterFunc(s.ctx.Std(), cancel)
			_ = s.rt.bus.WaitConnected(wctx)
			stopWait()
			cancel()
		}
		// Under the bus's session: a connection lost while we wait for the
		// acknowledgement may have taken the request with it (the server
		// died), so it is sent again after the reconnection rather than
		// waited for until the acknowledgement timeout.
		// The worker connects back right after it acknowledges: its Hello
		// proves it has the request as well as the acknowledgement does,
		// and arrives first when the bus is slower than the direct
		// connection (a NATS host starved of CPU), where the timeout would
		// otherwise fail a request that runs and kill it by migrating.
		sctx, attached := context.WithCancelCause(s.rt.bus.Session())
		ctx, cancel := context.WithTimeout(sctx, s.rt.ackTimeout(len(env)))
		s.in.OnAttach(func() { attached(errAttached) })
		msg, err := nc.RequestWithContext(ctx, subject, env)
		s.in.OnAttach(nil)
		cancel()
		attached(nil)
		if err == nil {
			return msg, nil
		}
		if errors.Is(context.Cause(sctx), errAttached) {
			return &nats.Msg{Data: ackOK}, nil
		}
		transient := errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) ||
			errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.Canceled)
		if !transient || !s.rt.bus.Settling() || s.ctx.IsStopped() || time.Now().After(deadline) {
			return nil, err
		}
		pause := min(time.Duration(10<<min(attempt, 5))*time.Millisecond, 200*time.Millisecond)
		select {
		case <-time.After(pause):
		case <-s.ctx.Stopped():
			return nil, err
		}
	}
}

// dispatchPlaced is dispatch, sending the request on to another instance
// while the one it went to refuses it as busy (load.go): the reply of the
// last instance tried, whose refusal, if it is one, run reports.
func (s *Stream) dispatchPlaced(nc *nats.Conn, subject string, env []byte) (*nats.Msg, error) {
	var refused map[uint64]bool
	for hops := 0; ; hops++ {
		msg, err := s.dispatch(nc, subject, env)
		if err != nil || !busyAck(msg.Data) {
			return msg, err
		}
		var a ack
		_ = json.Unmarshal(msg.Data, &a)
		next, ok := s.reroute(a.Load, &refused, hops)
		if !ok {
			return msg, nil
		}
		subject = next
	}
}

// busyAck reports whether an acknowledgement is a busy refusal, without
// decoding the usual one.
func busyAck(b []byte) bool {
	return len(b) > len(ackOK) && bytes.Contains(b, []byte(ackBusy))
}

// errAttached ends the wait for an acknowledgement when the worker's
// connection arrives first; ackOK is the acknowledgement it stands for.
var (
	errAttached = errors.New("the worker connected back")
	ackOK       = []byte(`{}`)
)

// ackTimeout is the wait for the acknowledgement of an envelope of n bytes:
// AckTimeout, plus a second per MiB, since the worker receives and checks
// the whole envelope before it acknowledges (a 4 MiB prompt on a loaded
// machine can take longer than the base timeout).
func (rt *Runtime) ackTimeout(n int) time.Duration {
	return rt.opts.AckTimeout + time.Duration(n>>20)*time.Second
}

func (s *Stream) run(nc *nats.Conn, subject string, env []byte) {
	msg, err := s.dispatchPlaced(nc, subject, env)
	s.rt.setLocal(s.in.Token(), nil)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			err = ErrNoResponders
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			err = fmt.Errorf("%w (%s to %s)", ErrNotAcknowledged, s.rt.ackTimeout(len(env)), subject)
		case errors.Is(err, context.Canceled): // the bus session ended (dispatch)
			err = fmt.Errorf("%w (NATS connection lost, to %s)", ErrNotAcknowledged, subject)
		default:
			err = fmt.Errorf("request to %s failed: %w", subject, err)
		}
		s.in.Abandon() // a worker that took it late (it was frozen) must not start it
		s.failed(err)
		s.end(err)
		return
	}
	var a ack
	if json.Unmarshal(msg.Data, &a) != nil || a.Error != "" {
		s.in.Abandon()
		if a.Error == ackBusy {
			err := ErrBusy // not the instance's fault: it is not suspected
			if s.ctx.IsStopped() {
				err = io.EOF // cancelled meanwhile: nothing to report
			}
			s.end(err)
			return
		}
		if a.Error == ackShuttingDown || a.Error == ackHostStalled {
			// As good as gone: another worker may take it (migration retries).
			why := "the worker is shutting down"
			if a.Error == ackHostStalled {
				why = ackHostStalled
			}
			err := fmt.Errorf("%w (%s)", ErrNoResponders, why)
			s.failed(err)
			s.end(err)
			return
		}
		if a.Error == errRequestTooLarge.Error() {
			s.end(fmt.Errorf("%w: the worker accepts at most %d bytes", ErrTooLarge, MaxRequestBytes))
			return
		}
		s.end(fmt.Errorf("worker refused the request: %s", a.Error))
		return
	}
	// The worker dials right after acknowledging: from now on the usual
	// connect timeout applies.
	s.in.Acknowledged()
	// From now on the consumer takes the items from the connection's queue
	// itself (Take), woken by the Incoming: no goroutine passes each item
	// on. This one waits for the end alone.
	s.in.OnSignal(s.wakeConsumer)
	s.markStarted()
	err = s.classify(s.in.WaitEnd())
	s.failed(err)
	s.end(err)
}

// wakeConsumer runs the consumer's armed callback: the Incoming queued an
// item, ended, or was killed or closed.
func (s *Stream) wakeConsumer() {
	s.mu.Lock()
	f := s.ready.take()
	s.mu.Unlock()
	call(f)
}

// failed makes the client avoid the instance for a while when err says the
// instance, not the request, is the problem.
func (s *Stream) failed(err error) {
	if s.client != nil && err != io.EOF && instanceFault(err) {
		s.client.suspect(s.instance)
	}
}

func (s *Stream) markStarted() {
	s.mu.Lock()
	s.started = true
	s.direct.Store(s.in != nil)
	f := s.ready.take()
	s.mu.Unlock()
	call(f)
}

// push appends one item, then holds the producer while the buffer is full
// (for a network stream that withholds credits, so the worker slows down).
// Kill releases it.
func (s *Stream) push(item []byte) {
	s.mu.Lock()
	if !s.Killed() { // after a kill nothing is delivered (Take): not even kept
		s.items = append(s.items, item)
	}
	f := s.ready.take()
	s.mu.Unlock()
	call(f)
	for {
		s.mu.Lock()
		full := len(s.items) >= recvBuffer && !s.Killed() && !s.abandoned.Load()
		s.mu.Unlock()
		if !full {
			return
		}
		<-s.wake
	}
}

// Next blocks until the stream has an item or ends (the error, io.EOF for a
// normal end), or ctx is done. It is for Go consumers; hosts that cannot
// block use Take and Arm. Only one goroutine may consume a stream.
func (s *Stream) Next(ctx context.Context) ([]byte, error) {
	for {
		if s.direct.Load() && !s.Killed() {
			if item, err := s.in.TryRecv(); err == nil {
				return item, nil
			}
		}
		items, err := s.Take(1) // the end, a kill, ErrAgain, or an item queued since
		if err == nil {
			return items[0], nil
		}
		if err != ErrAgain {
			return nil, err
		}
		if s.nextWake == nil {
			ch := make(chan struct{}, 1)
			s.nextCh, s.nextWake = ch, func() { poke(ch) }
		}
		// A wake-up left by an arm that fired after an earlier Next gave
		// up (its ctx) only makes this loop look again.
		s.armData(s.nextWake)
		select {
		case <-s.nextCh:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// classify maps how the stream ended to what the caller sees: a caller who
// cancelled sees a clean end whatever the transport did.
func (s *Stream) classify(err error) error {
	switch {
	case !errors.Is(err, io.EOF) && expired(s.ctx):
		// The worker's timer ended it (its deadline is the caller's, plus
		// the dispatch) before this side's fired: the deadline, not a fault.
		s.ctx.Cancel(ctxtree.Killed, ctxtree.ReasonDeadline)
		return io.EOF
	case errors.Is(err, io.EOF):
		return io.EOF
	case errors.Is(err, transport.ErrKilled):
		return io.EOF
	case s.ctx.IsStopped() && errors.Is(err, transport.ErrIncomplete):
		return io.EOF
	case s.ctx.IsStopped() && errors.As(err, new(*transport.HandlerError)):
		// Whatever the handler raised after the caller stopped or killed
		// the request is not the caller's concern: the stream ends as the
		// stop or kill ends it.
		return io.EOF
	}
	return err
}

func (s *Stream) end(err error) {
	for _, stop := range s.stopHooks {
		stop()
	}
	if f := s.unload.Swap(nil); f != nil {
		(*f)() // the instance's place is free (capacity.go)
	}
	s.mu.Lock()
	first := s.err == nil
	if first {
		s.err = err
	}
	f := s.ready.take()
	s.mu.Unlock()
	if first {
		s.endAttemptSpan(err)
	}
	if s.rt != nil {
		s.rt.forgetStream(s)
	}
	s.ctx.Finish()
	call(f)
}

// Completed reports whether the worker ended the stream normally (its final
// frame arrived) and it was not killed, even if items are still buffered
// here: a kill from now on cancels nothing on the worker, whose handler has
// returned.
func (s *Stream) Completed() bool {
	s.mu.Lock()
	done := errors.Is(s.err, io.EOF)
	s.mu.Unlock()
	return done && !s.Killed()
}

// KillOutcome calls f once, when it is known, with whether a kill of the
// request aborted anything on its worker: false if the worker had ended the
// request before it read the Kill (its end frame crossed the Kill), if the
// stream had ended before the kill, or if the kill stopped a migrating
// request between attempts (no worker had it: its last one failed); true
// otherwise, including a kill that reached a worker which then died. When
// f(true), the worker publishes an abort confirmation once the handler has
// returned (see AbortConfirmation), unless it died; so a caller can count a
// cancellation only when there was something to cancel.
// f may run at once or on another goroutine, and must not block; it is not
// called until the request is killed or has ended.
func (s *Stream) KillOutcome(f func(aborted bool)) {
	switch a := s.attempt.Load(); {
	case s.in != nil:
		s.in.KillOutcome(f)
	case a != nil:
		a.KillOutcome(f)
	default:
		// A migrating request between attempts (or before its first): the
		// kill stops it while no worker has it. Or an attempt that never
		// got an instance. Either way no worker had work to abort.
		f(false)
	}
}

// abandon releases a producer held by a full buffer for good: the runtime
// is closing and nobody will consume.
func (s *Stream) abandon() {
	s.abandoned.Store(true)
	s.poke()
}

// poke wakes a producer held by a full buffer (push), so it notices a kill.
func (s *Stream) poke() { poke(s.wake) }

// Started reports whether the request reached a worker: nil once it did,
// ErrAgain while it is in flight, or the error that ended it before it started.
func (s *Stream) Started() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		s.startSeen = true
		return nil
	}
	if s.err != nil {
		if s.err == io.EOF {
			return nil // ended (cancelled) before it started: nothing to report
		}
		return s.err
	}
	return ErrAgain
}

// Killed reports whether the request was killed, or the caller's context
// it was made for was: from then on Take delivers no item.
//
// The caller's context is checked as well as the request's own because the
// request's context is unlinked from it when the stream ends (Finish), while
// items may still be buffered: a kill of the caller after that point does not
// reach the request's context, and must still stop the delivery. While the
// stream runs, a kill of the caller reaches the request's context
// synchronously (they are linked), so checking the caller's direct context
// is enough for any ancestor of it.
func (s *Stream) Killed() bool {
	return s.ctx.IsKilled() || (s.parent != nil && s.parent.IsKilled())
}

// Take moves up to max items out. When none are buffered it returns the
// terminal error (io.EOF for a normal end) or ErrAgain while the stream is
// live. Once the request or the caller's context is killed (see Killed) it
// returns no item, whatever is buffered and however the kill and the items
// interleaved: a kill is a hard abort, what arrives after it is dropped.
func (s *Stream) Take(max int) ([][]byte, error) {
	if max <= 0 || max > maxTakeBatch {
		max = maxTakeBatch
	}
	s.mu.Lock()
	killed := s.Killed()
	if killed {
		s.items = nil
	}
	if s.direct.Load() && !killed {
		// run sets err once the Incoming has ended, when every item is
		// queued: an end read before the queue is taken comes after all
		// its items. One read after could precede items still arriving.
		err := s.err
		s.mu.Unlock()
		if out := s.takeQueued(max); len(out) > 0 {
			return out, nil
		}
		switch {
		case err != nil:
			return nil, err
		case s.Killed():
			return nil, io.EOF
		}
		return nil, ErrAgain // run wakes the consumer at the end
	}
	if len(s.items) == 0 {
		err := s.err
		s.mu.Unlock()
		if err == nil {
			if killed {
				return nil, io.EOF
			}
			return nil, ErrAgain
		}
		return nil, err
	}
	n := min(max, len(s.items))
	out := s.items[:n:n]
	s.items = s.items[n:]
	if len(s.items) == 0 {
		s.items = nil
	}
	s.mu.Unlock()
	s.poke()
	return out, nil
}

// takeQueued takes up to max items from the connection's queue (direct).
func (s *Stream) takeQueued(max int) [][]byte {
	var out [][]byte
	for len(out) < max {
		item, err := s.in.TryRecv()
		if err != nil {
			break
		}
		if out == nil {
			out = make([][]byte, 0, min(max, 8))
		}
		out = append(out, item)
	}
	return out
}

// hasItems reports whether Take has an item to return (mu held).
func (s *Stream) hasItems() bool {
	return len(s.items) > 0 || (s.direct.Load() && s.in.Queued())
}

// Arm runs f once when Take or Started may return something new.
func (s *Stream) Arm(f func()) {
	s.mu.Lock()
	s.ready.setLocked(&s.mu, s.hasItems() || s.err != nil || (s.started && !s.startSeen), f)
}

// AwaitStart waits until the request reached a worker (nil; nil too when
// it ended before it started without an error: it was cancelled), or ended
// before that (its error: ErrBusy, ErrNoResponders, ...), or ctx is done
// (ctx's error). Only one goroutine may wait on a stream (see Next).
func (s *Stream) AwaitStart(ctx context.Context) error {
	for {
		if err := s.Started(); err != ErrAgain {
			return err
		}
		if err := waitArmed(ctx, s.Arm); err != nil {
			return err
		}
	}
}

// waitStarted blocks until the request reached a worker (nil) or failed
// before that (its error).
func (s *Stream) waitStarted() error {
	for {
		s.mu.Lock()
		started, err := s.started, s.err
		s.mu.Unlock()
		if started || err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		_ = waitArmed(context.Background(), s.Arm)
	}
}

// armData is Arm for a consumer that does not care about the start.
func (s *Stream) armData(f func()) {
	s.mu.Lock()
	s.ready.setLocked(&s.mu, s.hasItems() || s.err != nil, f)
}

// Kill kills the request (its context, and so the worker's) and ends the
// stream. It is what closing or dropping an unfinished stream does.
func (s *Stream) Kill() {
	s.ctx.Cancel(ctxtree.Killed, ctxtree.ReasonKill)
	s.poke()
}

// Finished reports whether the stream was killed (nothing more will be
// delivered), or has ended and everything was taken.
func (s *Stream) Finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Killed() || (s.err != nil && !s.hasItems())
}
