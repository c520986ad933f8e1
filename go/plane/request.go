package plane

// A request being served: the response stream to its caller (connected,
// the caller's control frames applied to its context, the handler's items
// written, then its end) and what the handler calls (Send, Complete, Fail).

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

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
	aborts   string // where its abort is confirmed (envelope.Aborts; "": AbortedSubject)

	// fetchBytes is the size of a request to fetch from the caller (its
	// envelope carried only that); 0 when the envelope carried it.
	fetchBytes int

	wake     chan struct{} // buffered(1): items queued or the handler finished
	hostDone chan struct{} // closed when the host's handler completed or failed
	doneOnce sync.Once
	// placed: the request holds a place of its endpoint's capacity
	// (workerload.go), given back once by freePlace.
	placed     bool
	placeFreed atomic.Bool

	mu            sync.Mutex
	items         [][]byte
	finished      bool
	failMsg       string
	clientStopped bool
	writable      arm
	localHooks    []func() bool // in-process caller: see followLocalCaller
	// out is the response stream once the caller attached it: from then
	// on sendMany writes what the credit allows straight to it, on the
	// handler's thread, when nothing waits before (items empty) and no
	// other send is under way (writing), so that a step's items cost no
	// goroutine wake-up each. writing is set by whoever sends to out (the
	// write goroutine or a direct send), mu held, so their frames never
	// interleave.
	out     *transport.Outgoing
	writing bool

	span       *tracing.Span // the handler's span (trace.go); nil: not traced
	confirming atomic.Bool   // confirmAbort runs, and ends the span
}

// run connects the response stream, relays control frames into the context,
// and writes the handler's items until the end.
func (r *Request) run(addr, token string) {
	defer r.endHandlerSpan()
	defer r.ep.forget(r)
	defer r.unfollowLocalCaller()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, err := r.ep.rt.dialStream(ctx, addr, token)
	if err != nil {
		slog.Warn("could not connect the response stream to the caller", "request_id", r.ID, "caller", addr, "error", err)
		r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
		r.freePlace() // no handler will run
		return
	}
	defer out.Close()
	// From here ctx ends every wait of this stream (waiting for credit) the
	// moment the request is killed, whoever killed it (the caller, the
	// endpoint's shutdown). A request killed before it was sent is still
	// delivered, already killed, so the handler sees it end.
	defer r.Ctx.NotifyHeld(ctxtree.Killed, func(h *ctxtree.Held) { h.Wake(cancel) })()

	// Control frames -> context, on the stream's reader goroutine as each
	// frame is read (no goroutine of our own: one hop less for a kill).
	out.OnControl(func(ev transport.Event) { r.control(out, ev) })
	if r.fetchBytes > 0 && !r.fetch(ctx, out, addr, token) {
		return
	}
	if !r.waitAttached(out, addr) {
		return
	}
	r.mu.Lock()
	r.out = out
	r.mu.Unlock()
	r.ep.publish(r)
	r.write(ctx, out)
}

// fetch fetches a request its envelope did not carry from the caller, and
// reports whether the handler may start. The request's context ends the
// fetch (ctx): a request killed while its bytes are on their way never
// reaches the handler, its buffer is dropped, and its abort is confirmed
// (the caller's Kill aborted it: Stream.KillOutcome). A fetch that fails
// otherwise (the caller lost, a request that is not JSON) is a lost caller.
func (r *Request) fetch(ctx context.Context, out *transport.Outgoing, addr, token string) bool {
	p, err := transport.FetchRequest(ctx, addr, token, r.fetchBytes, r.ep.rt.opts.streamOpts()...)
	if err == nil && !json.Valid(p) {
		err = ErrNotJSON
	}
	if err == nil {
		r.Payload = p
		return true
	}
	if !r.Ctx.IsKilled() {
		// A caller's kill cuts the fetch at once; its Kill frame follows on
		// the stream (sent when the stream attaches): wait for the stream's
		// word, so that a killed request is confirmed as one.
		t := time.NewTimer(transport.DefaultConnectTimeout)
		select {
		case <-out.Killed():
			r.Ctx.Cancel(ctxtree.Killed, frameKillReason(out)) // as control() does, maybe not yet
		case <-out.Lost():
		case <-r.Ctx.Killed():
		case <-t.C:
		}
		t.Stop()
	}
	if r.Ctx.IsKilled() {
		r.release()
		r.doneOnce.Do(func() { close(r.hostDone) }) // no handler will run
		r.freePlace()
		r.goConfirmAbort()
		return false
	}
	slog.Warn("could not fetch the request from the caller", "request_id", r.ID, "caller", addr, "bytes", r.fetchBytes, "error", err)
	r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
	r.release()
	r.freePlace()
	return false
}

// control applies a control frame of the caller's to the request's context.
func (r *Request) control(out *transport.Outgoing, ev transport.Event) {
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
		r.Ctx.Cancel(ctxtree.Killed, frameKillReason(out))
		killtrace.Mark("worker.ctx_killed", r.ID) // its watchers ran: the host's fd signalled, or its hand-off timed
	case transport.EventLost:
		r.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonConnectionLost)
	}
}

// waitAttached waits for the caller to answer the stream, and reports
// whether the handler may start. The handler starts once the caller has
// answered: a caller that gave up on this request (its acknowledgement came
// too late, as from a worker that was frozen) refuses the stream, and the
// request is dropped unstarted. A request killed meanwhile still reaches
// the handler, killed, so that it sees it end.
func (r *Request) waitAttached(out *transport.Outgoing, addr string) bool {
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
		r.freePlace()
		return false
	}
	return true
}

// write sends the handler's items as they are queued, then the end of the
// stream (end), until the handler finishes or the request is killed.
func (r *Request) write(ctx context.Context, out *transport.Outgoing) {
	killed := r.Ctx.Killed()
	for {
		select {
		case <-r.wake:
		case <-killed:
			time.Sleep(transport.KillSettle) // the host's thread first: see KillSettle
			r.release()
			r.goConfirmAbort()
			return
		}
		r.mu.Lock()
		if r.writing {
			r.mu.Unlock()
			continue // a direct send is under way: it wakes this when done
		}
		items := r.items
		r.items = nil
		finished, failMsg, clientStopped := r.finished, r.failMsg, r.clientStopped
		f := r.writable.take()
		r.writing = len(items) > 0
		r.mu.Unlock()
		call(f)
		if len(items) > 0 {
			_, err := out.SendBatch(ctx, items)
			r.mu.Lock()
			r.writing = false
			r.mu.Unlock()
			if err != nil {
				r.sendFailed(out)
				return
			}
		}
		if finished {
			r.end(out, failMsg, clientStopped)
			return
		}
	}
}

// sendFailed applies what broke a send: a Kill or a lost caller may be
// what made SendBatch fail, and the handler must see it even if the
// control event has not been delivered yet.
func (r *Request) sendFailed(out *transport.Outgoing) {
	reason := ctxtree.ReasonConnectionLost // the caller is lost, or the send broke otherwise
	select {
	case <-out.Killed():
		// The Kill's cause is set before Killed closes: the handler sees
		// why (client_disconnected, shutdown, ...) whether this or the
		// reader's control() applies the kill first.
		reason = frameKillReason(out)
	default:
	}
	r.Ctx.Cancel(ctxtree.Killed, reason)
	r.release()
	r.goConfirmAbort()
}

// end ends the stream of a handler that is done: its failure, its own stop
// (incomplete), or its end frame.
func (r *Request) end(out *transport.Outgoing, failMsg string, clientStopped bool) {
	// The handler is done: from here on neither the endpoint's
	// shutdown nor an in-process caller cancels its context, so
	// nothing moves it after the caller has seen the end frame. The
	// endpoint counts it active until the frame is queued.
	if r.ep.startEnding(r) {
		defer r.ep.endDone()
	}
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
		r.goConfirmAbort()
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

// freePlace gives the request's place on its endpoint back (once): its
// handler has returned, or none will run.
func (r *Request) freePlace() {
	if r.placed && r.placeFreed.CompareAndSwap(false, true) {
		r.ep.givePlace()
	}
}

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
func (r *Request) SendMany(items [][]byte) (int, error) { return r.SendManyIn(items, nil) }

// SendManyIn is SendMany whose direct writes are left to b's Flush (nil:
// written now): a host sending many requests' items in one call flushes
// once, and each caller's session writes them together. The caller must
// call b.Flush.
func (r *Request) SendManyIn(items [][]byte, b *transport.Batch) (int, error) {
	n, _, err := r.sendValid(items, b, false)
	return n, err
}

// SendManyPosted is SendManyIn for items the host handed over without
// waiting for the answer (posted: go/native's posted.go): it takes them all,
// beyond the send buffer's bound if need be, since the host counts them as
// sent, and reports whether the buffer is at or over its bound now (Over).
// The host's next sends are refused with ErrFull until the stream's writer
// brings it back under: what goes over is at most what the host posted
// before it learned. An item that is not JSON ends the call as in
// SendManyIn.
func (r *Request) SendManyPosted(items [][]byte, b *transport.Batch) (over bool, err error) {
	_, over, err = r.sendValid(items, b, true)
	return over, err
}

// Over reports whether the send buffer is at or over its bound (Send
// would answer ErrFull) on a request not finished.
func (r *Request) Over() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.finished && len(r.items) >= sendBuffer
}

// sendValid checks that each item is JSON, then sends those before the
// first that is not (sendMany), failing the call with ErrNotJSON after them.
func (r *Request) sendValid(items [][]byte, b *transport.Batch, all bool) (int, bool, error) {
	for i, it := range items {
		if !json.Valid(it) {
			n, over, err := r.sendMany(items[:i], b, all)
			if err != nil {
				return n, over, err
			}
			return n, over, ErrNotJSON
		}
	}
	return r.sendMany(items, b, all)
}

// sendMany queues items, as many as the send buffer takes (all of them with
// all set, beyond its bound if need be), and reports how many it took and
// whether the buffer is at or over its bound now: read under the lock that
// queued them, so that a writer woken by this call, which may take them at
// once, cannot hide it (Over, read later, could).
func (r *Request) sendMany(items [][]byte, b *transport.Batch, all bool) (int, bool, error) {
	if len(items) == 0 {
		return 0, false, nil
	}
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return len(items), false, nil
	}
	direct := 0
	if r.out != nil && !r.writing && len(r.items) == 0 {
		direct = r.sendDirectLocked(items, b)
		if direct == len(items) || r.finished {
			r.mu.Unlock()
			return len(items), false, nil
		}
		items = items[direct:] // the credit ran out: the rest waits for it in the write goroutine
	}
	n := min(len(items), sendBuffer-len(r.items))
	if all {
		n = len(items)
	}
	if n <= 0 {
		r.mu.Unlock()
		return 0, true, ErrFull
	}
	first := len(r.items) == 0
	r.items = append(r.items, items[:n]...)
	over := len(r.items) >= sendBuffer
	r.mu.Unlock()
	if first {
		r.poke()
	}
	if n < len(items) {
		return direct + n, over, ErrFull
	}
	return direct + n, over, nil
}

// sendDirectLocked writes what the credit allows of items to the stream
// now, without a goroutine (mu held on entry and on return; released while
// writing), and returns how many it took: those written, or all of them if
// the stream broke (the write goroutine sees that too and ends the
// request, which drops what the handler sends).
func (r *Request) sendDirectLocked(items [][]byte, b *transport.Batch) int {
	out := r.out
	r.writing = true
	r.mu.Unlock()
	n, err := out.TrySendBatchIn(items, b)
	r.mu.Lock()
	r.writing = false
	if err != nil {
		n = len(items)
	}
	if err != nil || len(r.items) > 0 || r.finished {
		r.poke() // what queued meanwhile, the end, or the failure: the write goroutine's
	}
	return n
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
	r.freePlace() // the handler has returned: its engine work is over
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
		caller.NotifyHeld(ctxtree.Stopped, func(h *ctxtree.Held) {
			if caller.IsKilled() {
				// A kill fires Stopped hooks too (before the Killed ones,
				// in registration order): the handler must see the kill,
				// not a stop_generating on the way to it.
				return
			}
			r.mu.Lock()
			r.clientStopped = true
			r.mu.Unlock()
			r.Ctx.CancelHolding(ctxtree.Stopped, ctxtree.ReasonStopGenerating, h)
		}),
		caller.NotifyHeld(ctxtree.Killed, func(h *ctxtree.Held) {
			r.Ctx.CancelHolding(ctxtree.Killed, remoteKillReason(caller.Cause()), h)
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

// frameKillReason is the reason the caller's Kill frame on out gives the
// handler's context.
func frameKillReason(out *transport.Outgoing) ctxtree.Reason {
	return remoteKillReason(ctxtree.Reason(out.KillCause()))
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
