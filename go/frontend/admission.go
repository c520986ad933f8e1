package frontend

// Admission. A worker declares its capacity ("max_num_seqs" in its
// instance's metadata: the sequences its engine runs at once) and enforces
// it: its own count is the authority, whatever the number of frontends,
// and a request past it is refused as busy (plane's workerload.go). The
// model's client pictures each instance's free places from its own
// requests and the load the workers publish (plane's capacity.go, load.go)
// and sends each request to the one with the most. A request is admitted
// when an instance has a free place in that picture; one that every worker
// then refuses as busy comes back here, first in line (resend.go). When
// every instance of the
// model is full it waits in the model's queue, first come first served, for
// a place, up to Options.MaxQueuedRequests requests; past that it is
// answered 503, code overloaded, with Retry-After, at once. A queued
// request whose client leaves, whose deadline passes or whose frontend's
// drain ends leaves the queue and never reaches a worker.
//
// A request takes one place however many choices (n) it has: its first
// choice goes into the place, the others to the instances with the most
// free capacity, even past it; a worker that is full refuses them as busy,
// and they wait here for places as a refused first choice does. Instances
// that declare no capacity always have room.

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// Why a request left the queue without a place.
var (
	errOverloaded      = errors.New("overloaded")
	errQueueDeadline   = errors.New("the request's deadline passed while it waited for a worker")
	errQueueShutdown   = errors.New("the frontend is shutting down")
	errQueueClientGone = errors.New("the client went away while the request waited for a worker")
)

// retryAfterSeconds is the Retry-After of an overloaded answer.
const retryAfterSeconds = "1"

// gate admits the requests of one model.
type gate struct {
	c   *plane.Client
	max int // queued requests at most (0: no queue)

	mu    sync.Mutex
	queue list.List // *waiter, first come first
}

// waiter is a request in the queue: ready is closed once it was handed a
// place (r) or an error that ends its wait (err).
type waiter struct {
	ready chan struct{}
	r     *plane.Reservation
	err   error
	elem  *list.Element // in gate.queue; nil once out of it (mu held)
}

func newGate(c *plane.Client, max int) *gate {
	g := &gate{c: c, max: max}
	c.SetCapacity(func(meta []byte) int { return parseMeta(meta).MaxNumSeqs }, g.room)
	return g
}

// queued is how many requests wait.
func (g *gate) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queue.Len()
}

// admit returns a place for one request: at once when an instance has one
// and nobody waits before it; otherwise after waiting in the queue. It fails
// with errOverloaded when the queue is full, errQueueClientGone when ctx
// ends, errQueueDeadline at deadline (zero: none), errQueueShutdown when
// stopping closes (also if it was closed already), or plane's
// ErrNoInstances when the model has no instance (also while it waits).
//
// front is for a request admitted once already that every worker then
// refused as busy (their places were taken by other frontends' requests):
// it takes a free place before the requests waiting, and otherwise waits
// first in line, or is refused as overloaded when the queue is full.
func (g *gate) admit(ctx context.Context, deadline time.Time, stopping <-chan struct{}, front bool) (*plane.Reservation, error) {
	r, err := g.wait(ctx, deadline, stopping, front)
	if err != nil {
		return nil, err
	}
	// Handed a place at the moment the client left, the deadline passed or
	// the drain gave up (a select picks any ready case): the place goes on.
	if why := gone(ctx, deadline, stopping); why != nil {
		r.Release()
		return nil, why
	}
	return r, nil
}

// gone says why a request must not start now (nil: it may).
func gone(ctx context.Context, deadline time.Time, stopping <-chan struct{}) error {
	select {
	case <-stopping:
		return errQueueShutdown
	default:
	}
	switch {
	case ctx.Err() != nil:
		return errQueueClientGone
	case !deadline.IsZero() && !time.Now().Before(deadline):
		return errQueueDeadline
	}
	return nil
}

// wait is admit's first half: a place at once, or after waiting in the queue.
func (g *gate) wait(ctx context.Context, deadline time.Time, stopping <-chan struct{}, front bool) (*plane.Reservation, error) {
	if why := gone(ctx, deadline, stopping); why != nil {
		return nil, why // a request that arrives after its frontend's drain gave up starts nothing
	}
	g.mu.Lock()
	if g.queue.Len() == 0 || front {
		r, err := g.c.Reserve()
		if !errors.Is(err, plane.ErrAtCapacity) {
			g.mu.Unlock()
			return r, err
		}
	}
	if g.queue.Len() >= g.max {
		g.mu.Unlock()
		return nil, errOverloaded
	}
	w := &waiter{ready: make(chan struct{})}
	if front {
		w.elem = g.queue.PushFront(w)
	} else {
		w.elem = g.queue.PushBack(w)
	}
	g.mu.Unlock()
	// A place freed between the Reserve above and the PushBack called room
	// before this waiter was there to take it.
	g.room()

	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	var why error
	select {
	case <-w.ready:
		return w.r, w.err
	case <-ctx.Done():
		why = errQueueClientGone
	case <-expired:
		why = errQueueDeadline
	case <-stopping:
		why = errQueueShutdown
	}
	g.mu.Lock()
	if w.elem != nil {
		g.queue.Remove(w.elem)
		w.elem = nil
		g.mu.Unlock()
		return nil, why
	}
	g.mu.Unlock()
	// Handed a place as it gave up: the place goes to the next in line.
	<-w.ready
	if w.r != nil {
		w.r.Release()
	}
	return nil, why
}

// room hands free places to the waiters, first come first; the model's
// client calls it whenever one of its requests ends or its instances
// change. When the model has no instance left, every waiter is answered
// as a new request would be (model not found): nothing says one will come.
func (g *gate) room() {
	var handed []*waiter
	g.mu.Lock()
	for g.queue.Len() > 0 {
		r, err := g.c.Reserve()
		if errors.Is(err, plane.ErrAtCapacity) {
			break // the next request that ends calls again
		}
		w := g.queue.Remove(g.queue.Front()).(*waiter)
		w.elem = nil
		w.r, w.err = r, err
		handed = append(handed, w)
	}
	g.mu.Unlock()
	for _, w := range handed {
		close(w.ready)
	}
}

// notAdmittedOutcome is the one outcome of a request that admit refused
// with err (see notAdmitted).
func notAdmittedOutcome(err error) string {
	switch {
	case errors.Is(err, errOverloaded), errors.Is(err, plane.ErrNoInstances):
		return "rejected"
	case errors.Is(err, errQueueDeadline):
		return "deadline"
	case errors.Is(err, errQueueShutdown), errors.Is(err, errQueueClientGone):
		return "cancelled"
	}
	return "failed"
}

// notAdmitted answers a request that got no place (admit's error) and
// counts its choices, each with the one outcome the request had: rejected
// (overloaded, or no instance), deadline, or cancelled (the client left, the
// frontend stopped). None of them reached a worker.
func (f *Frontend) notAdmitted(w http.ResponseWriter, model string, choices int, err error) {
	outcome := f.answerNotAdmitted(w, model, err)
	for i := 0; i < choices; i++ {
		f.metrics.request(model)
		f.metrics.outcome(model, outcome)
	}
}

// answerNotAdmitted answers a request that got no place, and returns the
// outcome it had (see notAdmitted).
func (f *Frontend) answerNotAdmitted(w http.ResponseWriter, model string, err error) (outcome string) {
	outcome = notAdmittedOutcome(err)
	switch {
	case errors.Is(err, errOverloaded):
		w.Header().Set("Retry-After", retryAfterSeconds)
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf(
			"every worker of model %q is at its capacity and %d requests already wait; retry later", model, max(f.opts.MaxQueuedRequests, 0)),
			"service_unavailable", "", "overloaded")
	case errors.Is(err, errQueueDeadline):
		deadlineExceeded(w)
	case errors.Is(err, errQueueShutdown):
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "shutdown")
	case errors.Is(err, errQueueClientGone):
		slog.Debug("request left the queue: its client went away", "model", model)
	case errors.Is(err, plane.ErrNoInstances):
		modelNotFound(w, model)
	default:
		writeError(w, http.StatusInternalServerError, err.Error(), "internal_error", "", "internal_error")
	}
	return outcome
}

// writeAdmission writes the admission gauges: per model, the worker
// requests running (as this frontend counts them) and those waiting.
func (f *Frontend) writeAdmission(w io.Writer) {
	f.mu.Lock()
	byModel := map[string][]*gate{} // a model's gates: one per text its instances speak (models.go)
	for key, g := range f.gates {
		byModel[key.model] = append(byModel[key.model], g)
	}
	f.mu.Unlock()
	models := sortedKeys(byModel)
	gauge := func(name, help string, value func(g *gate) int) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, m := range models {
			n := 0
			for _, g := range byModel[m] {
				n += value(g)
			}
			fmt.Fprintf(w, "%s{%s} %d\n", name, label(m), n)
		}
	}
	gauge("dynamo_ctx_frontend_inflight_requests", "Worker requests running, as this frontend routed them.", func(g *gate) int {
		n := 0
		for _, k := range g.c.Running() {
			n += k
		}
		return n
	})
	gauge("dynamo_ctx_frontend_queued_requests", "Requests waiting for a worker with a free place.", (*gate).queued)
}
