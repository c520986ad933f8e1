package plane

// The worker's own capacity. An endpoint served with a capacity
// (WithCapacity: the sequences its engine runs at once, a worker's
// --max-num-seqs) holds one place per request it serves, from the moment
// it takes the request off the bus until the handler has returned (or it
// is known that no handler will run: the caller was gone, the fetch of its
// bytes failed, the endpoint closed first). Taking a place is decided
// under the endpoint's lock, in the same step as the count, so any number
// of callers together never get more requests onto it than its capacity: a
// request beyond that is refused at once with ackBusy, before its envelope
// is even read, and never queued. A caller's plane sends a refused request
// to another instance, or says every instance is busy (ErrBusy); it never
// reached a handler, so it is no failure (docs/design.md, section 10).
//
// The count is published (LoadReport on LoadSubject(path)): on every
// change, at most once per LoadInterval, the last change always (a trailing
// publish), so a caller's picture lags the worker's by at most an interval
// and the bus carries at most 1/LoadInterval messages per loaded worker,
// whatever the request rate. A busy refusal carries the report too, so the
// caller that was refused corrects its picture at once.

import (
	"encoding/json"
	"sync"
	"time"
)

// ackBusy is a worker's refusal of a request beyond its capacity.
const ackBusy = "busy: the worker is at its capacity"

// DefaultLoadInterval is the least time between two load reports of one
// endpoint.
const DefaultLoadInterval = 100 * time.Millisecond

// LoadSubject is where the instances of path publish their load reports:
// one subject per endpoint path, which callers that route by capacity
// subscribe to.
func LoadSubject(path string) string { return "dc.load." + path }

// LoadReport is an instance's load, as it publishes it.
type LoadReport struct {
	Instance uint64 `json:"instance"`
	// Gen counts the changes of the instance's count: a report with a
	// smaller Gen than one already seen is older, and ignored.
	Gen      uint64 `json:"gen"`
	Running  int    `json:"running"`  // requests holding a place
	Capacity int    `json:"capacity"` // its declared capacity
	Free     int    `json:"free"`     // Capacity - Running, at least 0
	// Waiting and KVUsage are the engine's own figures, when its host
	// reports them (Endpoint.SetEngineLoad): requests its scheduler holds
	// back, and the fraction of its KV cache in use.
	Waiting *int     `json:"waiting,omitempty"`
	KVUsage *float64 `json:"kv_usage,omitempty"`
}

// ServeOption configures Serve.
type ServeOption func(*serveOptions)

type serveOptions struct{ capacity int }

// WithCapacity makes the endpoint serve at most n requests at once and
// refuse the others as busy (n <= 0: no bound, the default).
func WithCapacity(n int) ServeOption {
	return func(o *serveOptions) { o.capacity = max(n, 0) }
}

// places is an endpoint's capacity and its count (guarded by Endpoint.mu).
type places struct {
	capacity int // 0: no bound, nothing counted
	running  int
	gen      uint64
	refused  uint64 // requests refused as busy, in all
	peak     int    // the most running at once
	waiting  *int
	kvUsage  *float64
}

// takePlaceLocked takes a place for a request that arrived, or reports
// that none is free (e.mu held).
func (e *Endpoint) takePlaceLocked() bool {
	p := &e.places
	if p.capacity == 0 {
		return true
	}
	if p.running >= p.capacity {
		p.refused++
		return false
	}
	p.running++
	p.gen++
	p.peak = max(p.peak, p.running)
	return true
}

// givePlace gives back the place of a request that took one (counted).
func (e *Endpoint) givePlace() {
	e.mu.Lock()
	e.places.running--
	e.places.gen++
	e.mu.Unlock()
	e.load.changed()
}

// reportLocked is the endpoint's load now (e.mu held).
func (e *Endpoint) reportLocked() LoadReport {
	p := e.places
	return LoadReport{Instance: e.instanceID, Gen: p.gen, Running: p.running, Capacity: p.capacity,
		Free: max(p.capacity-p.running, 0), Waiting: p.waiting, KVUsage: p.kvUsage}
}

// Load is the endpoint's load now, and how many requests it refused as
// busy so far and the most it ran at once.
func (e *Endpoint) Load() (now LoadReport, refused uint64, peak int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reportLocked(), e.places.refused, e.places.peak
}

// SetEngineLoad records the engine's own figures for the next load report:
// requests waiting in its scheduler, and its KV cache usage (0 to 1); a
// negative value leaves that figure out. Figures equal to those recorded
// change nothing (no report).
func (e *Endpoint) SetEngineLoad(waiting int, kvUsage float64) {
	var w *int
	var kv *float64
	if waiting >= 0 {
		w = &waiting
	}
	if kvUsage >= 0 {
		kv = &kvUsage
	}
	e.mu.Lock()
	if sameFigure(e.places.waiting, w) && sameFigure(e.places.kvUsage, kv) {
		e.mu.Unlock()
		return
	}
	e.places.waiting, e.places.kvUsage = w, kv
	e.places.gen++
	e.mu.Unlock()
	e.load.changed()
}

// sameFigure reports whether two optional figures are equal (both absent
// or the same value).
func sameFigure[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// loadPublisher publishes an endpoint's load reports, rate-limited.
type loadPublisher struct {
	e        *Endpoint
	interval time.Duration

	mu     sync.Mutex
	last   time.Time   // of the last publish
	timer  *time.Timer // a publish that is due (it reads the load then)
	closed bool
}

// changed says the load changed: it is published now when the last report
// is an interval old, else when the interval is over (once, however many
// changes come meanwhile). Nothing for an endpoint without capacity.
func (p *loadPublisher) changed() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed || p.timer != nil {
		p.mu.Unlock()
		return
	}
	now := time.Now()
	if wait := p.interval - now.Sub(p.last); wait > 0 {
		p.timer = time.AfterFunc(wait, p.due)
		p.mu.Unlock()
		return
	}
	p.last = now
	p.mu.Unlock()
	p.publish()
}

func (p *loadPublisher) due() {
	p.mu.Lock()
	p.timer = nil
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.last = time.Now()
	p.mu.Unlock()
	p.publish()
}

func (p *loadPublisher) publish() {
	p.e.mu.Lock()
	rep := p.e.reportLocked()
	p.e.mu.Unlock()
	b, err := json.Marshal(rep)
	if err == nil {
		_ = p.e.rt.nc().Publish(LoadSubject(p.e.path), b) // a lost report is made good by the next, or by a refusal
	}
}

// close stops publishing.
func (p *loadPublisher) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
}
