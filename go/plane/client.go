package plane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// Route chooses the instance a request goes to.
type Route int

const (
	RoundRobin Route = iota
	Random
	Direct
)

// Client sends requests to the instances of one endpoint path.
type Client struct {
	rt      *Runtime
	path    string
	watcher *discovery.Watcher
	rr      atomic.Uint64

	migrationLimit atomic.Int64
	filter         atomic.Pointer[func([]byte) bool]
	capacity       atomic.Pointer[capacityConfig] // routing by free capacity (capacity.go); nil: none
	view           atomic.Pointer[view]           // what a pick reads (route.go)
	viewMu         sync.Mutex                     // held while a view is built

	parent   *Client // set on a client made by Filtered: it shares parent's watcher
	mu       sync.Mutex
	closed   bool
	children map[*Client]struct{} // clients made by Filtered, closed with this one
	waiting  []func()
	suspects map[uint64]time.Time // instance -> until when it is avoided (see suspect)
	load     map[uint64]int       // instance -> requests of this client running there (capacity.go)
	others   map[uint64]seenLoad  // instance -> the others' requests there, as it reported (load.go)
	board    *loadBoard           // the load reports of path (load.go); on the root client only
	tree     *freeTree            // free places per instance of a view, with capacity (route.go)
	stop     chan struct{}
	wg       sync.WaitGroup
}

// suspectFor is how long an instance that failed a request (no responders,
// no acknowledgement, a broken or silent stream) is avoided by new requests
// while other instances exist: long enough for discovery to drop it if it
// is dead (its lease expires within the TTL plus a quarter).
const suspectFor = 5 * time.Second

// Client starts watching path's instances.
func (r *Runtime) Client(ctx context.Context, path string) (*Client, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	if r.isClosed() {
		return nil, ErrClosed
	}
	w, err := discovery.Watch(ctx, r.nc(), path, r.watchOpts()...)
	if err != nil {
		return nil, err
	}
	c := &Client{rt: r, path: path, watcher: w, stop: make(chan struct{}), suspects: map[uint64]time.Time{}}
	if err := r.track(func() { r.clients[c] = struct{}{} }); err != nil {
		w.Close()
		return nil, err
	}
	c.wg.Add(1)
	go c.watchChanges()
	return c, nil
}

// Filtered returns a client of the same endpoint that routes only to the
// instances whose metadata f accepts (for example those serving one model),
// with its own round robin, suspects and migration limit. It shares c's view
// of the instances instead of starting its own watch: whatever c lists that
// f accepts, the new client lists too, from the moment it exists (a watch of
// its own would start from a fresh query and miss, for a while, instances c
// already knows). It is closed when c closes, or by its own Close, which
// leaves c alone. f must not be nil; SetInstanceFilter on the new client
// replaces f.
func (c *Client) Filtered(f func(meta []byte) bool) (*Client, error) {
	if f == nil {
		return nil, errors.New("plane: Filtered needs a filter")
	}
	if c.parent != nil {
		return nil, errors.New("plane: Filtered on a filtered client")
	}
	d := &Client{rt: c.rt, path: c.path, watcher: c.watcher, parent: c, stop: make(chan struct{}), suspects: map[uint64]time.Time{}}
	d.filter.Store(&f)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.children == nil {
		c.children = map[*Client]struct{}{}
	}
	c.children[d] = struct{}{}
	c.mu.Unlock()
	if err := c.rt.track(func() { c.rt.clients[d] = struct{}{} }); err != nil {
		d.Close()
		return nil, err
	}
	d.wg.Add(1)
	go d.watchChanges()
	return d, nil
}

// watchChanges runs the functions armed with ArmInstances when instances
// appear.
func (c *Client) watchChanges() {
	defer c.wg.Done()
	for {
		// Take the change channel before looking, so that a change between
		// the look and the wait closes the channel instead of being missed.
		changed := c.watcher.Changes()
		if c.NumInstances() > 0 {
			c.releaseWaiting()
		}
		c.roomMaybe() // an instance that appeared may have room (capacity.go)
		select {
		case <-changed:
		case <-c.stop:
			return
		}
	}
}

// releaseWaiting runs (once) every function armed with ArmInstances.
func (c *Client) releaseWaiting() {
	c.mu.Lock()
	fs := c.waiting
	c.waiting = nil
	c.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Path is the endpoint path.
func (c *Client) Path() string { return c.path }

// InstanceIDs returns the ids of the instances currently known, sorted.
func (c *Client) InstanceIDs() []uint64 {
	insts := c.currentView().insts
	ids := make([]uint64, len(insts))
	for i, in := range insts {
		ids[i] = in.ID
	}
	return ids
}

// NumInstances is how many instances Instances would return, without
// copying them.
func (c *Client) NumInstances() int { return len(c.currentView().insts) }

// Instances returns the instances currently known that pass the instance
// filter, sorted by id: a copy, the caller's to keep and modify.
func (c *Client) Instances() []discovery.Instance {
	insts := c.currentView().insts
	out := make([]discovery.Instance, len(insts))
	for i, in := range insts {
		out[i] = discovery.Instance{ID: in.ID, Meta: slices.Clone(in.Meta)}
	}
	return out
}

// InstanceSet is a client's instances (those that pass its filter, sorted
// by id) as of one change of them: immutable and shared. A client makes a
// new one only when its instances, its filter or its capacity setting
// change, so what a caller derives from a set may be kept until Current
// returns another (Same).
type InstanceSet struct{ v *view }

// Current is the client's current InstanceSet, without copying it.
func (c *Client) Current() InstanceSet { return InstanceSet{c.currentView()} }

// Instances are the set's instances, sorted by id: shared, so neither the
// slice nor any Meta may be modified.
func (s InstanceSet) Instances() []discovery.Instance {
	if s.v == nil {
		return nil
	}
	return s.v.insts
}

// Same reports whether s and o are the same set (one change of the
// instances).
func (s InstanceSet) Same(o InstanceSet) bool { return s.v == o.v }

// SetInstanceFilter restricts routing (and Instances, InstanceIDs,
// ArmInstances) to the instances whose metadata f accepts, for example those
// serving one model. Nil removes the filter.
func (c *Client) SetInstanceFilter(f func(meta []byte) bool) {
	if f == nil {
		c.filter.Store(nil)
		return
	}
	c.filter.Store(&f)
}

// ArmInstances runs f once when at least one instance is known (at once if
// one is) or the client closes. f must not block.
func (c *Client) ArmInstances(f func()) {
	c.mu.Lock()
	if c.closed || c.NumInstances() > 0 {
		c.mu.Unlock()
		f()
		return
	}
	c.waiting = append(c.waiting, f)
	c.mu.Unlock()
	// An instance may have appeared between the check and the append.
	if c.NumInstances() > 0 {
		c.releaseWaiting()
	}
}

// Close stops watching (and closes the clients made from this one by
// Filtered); streams already open continue.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	fs := c.waiting
	c.waiting = nil
	children := c.children
	c.children = nil
	c.mu.Unlock()
	for d := range children {
		d.Close()
	}
	close(c.stop)
	c.wg.Wait()
	if c.parent == nil {
		c.closeBoard()
		c.watcher.Close()
	} else {
		c.listenLoad(false)
		c.parent.mu.Lock()
		delete(c.parent.children, c)
		c.parent.mu.Unlock()
	}
	c.rt.mu.Lock()
	delete(c.rt.clients, c)
	c.rt.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// pick says how pickFor chooses.
type pick uint8

const (
	// pickAdmit: only an instance with a free place (else ErrAtCapacity).
	pickAdmit pick = 1 << iota
	// pickStrict: never an excluded instance (else ErrAtCapacity).
	pickStrict
)

// pickFor chooses the instance of one attempt. Direct goes where it is told.
// Otherwise the candidates are the known instances minus exclude (those that
// already failed this request) and minus the client's suspects; when that
// leaves none, suspects are allowed again, then excluded ones (unless
// pickStrict): a request is never refused for want of a perfect instance
// while any is known. Among the candidates it takes the next in turn, a
// random one, or, when the client routes by capacity (capacity.go), the one
// with the most free capacity (weighed with its engine's figures: route.go's
// freeTree), which it then counts (counted); with
// pickAdmit it refuses (ErrAtCapacity) when that one has none. It reads the
// client's view (route.go) and allocates nothing that grows with the
// instances.
func (c *Client) pickFor(route Route, instance uint64, exclude map[uint64]bool, how pick) (id uint64, counted bool, err error) {
	admit := how&pickAdmit != 0
	if route == Direct {
		if c.capacity.Load() != nil {
			c.mu.Lock()
			c.countLocked(instance)
			c.mu.Unlock()
			return instance, true, nil
		}
		return instance, false, nil
	}
	v := c.currentView() // built outside c.mu: the filter and cfg.of are the caller's code
	if len(v.insts) == 0 {
		return 0, false, ErrNoInstances
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, until := range c.suspects {
		if now.After(until) {
			delete(c.suspects, id)
		}
	}
	var buf [16]int
	avoided := c.avoidedLocked(v, exclude, true, buf[:0])
	if len(avoided) == len(v.insts) {
		avoided = c.avoidedLocked(v, exclude, false, avoided[:0])
	}
	if len(avoided) == len(v.insts) {
		if how&pickStrict != 0 {
			return 0, false, ErrAtCapacity
		}
		avoided = avoided[:0]
	}
	if v.cfg != nil {
		best, ok := c.mostFreeLocked(v, avoided, admit)
		if !ok {
			// Admission: an instance avoided for a recent failure that has
			// a free place is better than a refusal (its suspicion may be
			// a hiccup; one that is really gone fails the request before
			// it starts, and the frontend sends it elsewhere).
			if best, ok = c.mostFreeLocked(v, c.avoidedLocked(v, exclude, false, avoided[:0]), admit); !ok {
				return 0, false, ErrAtCapacity
			}
		}
		c.countLocked(best)
		return best, true, nil
	}
	n := len(v.insts) - len(avoided)
	if route == Random {
		return v.insts[nth(avoided, rand.IntN(n))].ID, false, nil
	}
	return v.insts[nth(avoided, int((c.rr.Add(1)-1)%uint64(n)))].ID, false, nil
}

// countLocked counts one more request of c's running on instance id (c.mu
// held).
func (c *Client) countLocked(id uint64) {
	if c.load == nil {
		c.load = map[uint64]int{}
	}
	c.load[id]++
	c.loadChangedLocked(id)
}

// suspect makes new requests avoid instance id for a while (see suspectFor).
func (c *Client) suspect(id uint64) {
	if id == 0 {
		return
	}
	c.mu.Lock()
	c.suspects[id] = time.Now().Add(suspectFor)
	c.mu.Unlock()
}

// SetMigrationLimit sets how many times Generate retries a broken stream on
// another worker (see GenerateMigrating); 0, the default, means never. A
// limit below 0 is refused (ErrBadMigrationLimit) and changes nothing: this
// is the one check of it, for every caller (the C export, Python, the
// frontend).
func (c *Client) SetMigrationLimit(n int) error {
	if n < 0 {
		return fmt.Errorf("%w, got %d", ErrBadMigrationLimit, n)
	}
	c.migrationLimit.Store(int64(n))
	return nil
}

// Generate sends payload (a JSON value) and returns the response stream at
// once; the request is sent in the background and Stream.Started reports its
// outcome. With a parent, the request's context is a new child of parent
// (same id, linked before sending), so cancelling parent cancels the remote
// request; without one it gets a fresh id. With a migration limit set, it is
// GenerateMigrating.
func (c *Client) Generate(payload []byte, parent *ctxtree.Context, route Route, instance uint64, opts ...GenerateOption) (*Stream, error) {
	if limit := int(c.migrationLimit.Load()); limit > 0 {
		return c.GenerateMigrating(payload, parent, route, instance, limit, opts...)
	}
	o, err := applyGenerateOptions(opts)
	if err != nil {
		if o.reservation != nil {
			o.reservation.Release()
		}
		return nil, err
	}
	return c.generateOnce(payload, parent, route, instance, nil, nil, o)
}

// requestContext checks a request and makes its context: a new child of
// parent with parent's id (linked before anything is sent), or a root with a
// fresh id.
func (c *Client) requestContext(payload []byte, parent *ctxtree.Context) (*ctxtree.Context, error) {
	if len(payload) > MaxRequestBytes { // before reading it
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(payload), MaxRequestBytes)
	}
	if !json.Valid(payload) {
		return nil, ErrNotJSON
	}
	if parent != nil {
		if err := ValidateID(parent.ID()); err != nil {
			id := parent.ID()
			if len(id) > 40 {
				id = id[:40] + "..."
			}
			return nil, fmt.Errorf("request id %q: %w", id, err)
		}
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if parent == nil {
		return c.rt.opts.NewContext(ctxtree.NewID()), nil
	}
	reqCtx := c.rt.opts.NewContext(parent.ID())
	parent.LinkChild(reqCtx)
	inheritTrace(reqCtx, parent)
	return reqCtx, nil
}

func (c *Client) tooLarge(n int) error {
	return fmt.Errorf("%w: an envelope of %d bytes, the NATS server accepts at most %d", ErrTooLarge, n, c.rt.nc().MaxPayload())
}

// generateOnce is one attempt: Generate without migration, avoiding the
// instances in exclude if it can (see pick). outer is the migrating stream
// this is an attempt of (nil: none): the attempt carries its key, and its
// Instance is this attempt's from before the request is sent.
func (c *Client) generateOnce(payload []byte, parent *ctxtree.Context, route Route, instance uint64, exclude map[uint64]bool, outer *Stream, o generateOptions) (*Stream, error) {
	reqCtx, err := c.requestContext(payload, parent)
	if err != nil {
		if o.reservation != nil {
			o.reservation.Release()
		}
		return nil, err
	}
	key := NewKey()
	if outer != nil {
		key = outer.key
	}
	s := &Stream{ctx: reqCtx, key: key, parent: parent, wake: make(chan struct{}, 1), rt: c.rt, client: c, route: route, exclude: exclude, outer: outer}
	var id uint64
	if r := o.reservation; r != nil {
		// The place Reserve took: the stream gives it back when it ends.
		if r.c != c {
			r.Release()
			s.end(errors.New("plane: a reservation of another client"))
			return s, nil
		}
		id = r.id
		if r.counted && r.done.CompareAndSwap(false, true) {
			f := c.unloader(id)
			s.unload.Store(&f)
		}
	} else {
		var counted bool
		if id, counted, err = c.pickFor(route, instance, exclude, 0); err != nil {
			s.end(err)
			return s, nil
		}
		if counted {
			f := c.unloader(id)
			s.unload.Store(&f)
		}
	}
	s.instance = id
	s.served.Store(id)
	if outer != nil {
		outer.served.Store(id)
	}
	token := newToken()
	local := c.rt.servesInstance(id)
	// The connect timeout covers the dispatch too (it restarts at the
	// acknowledgement: see run).
	in := c.rt.srv.Expect(token, transport.WithConnectTimeout(dispatchBudget+transport.DefaultConnectTimeout))
	s.in = in
	// Cancellation of the request's context reaches the worker through the
	// stream's control frames. To a remote worker they are written on the
	// cancelling goroutine: a tiny write that the worker's reader always
	// takes, where a goroutine would first cost the canceller (often the
	// host's thread) a thread's wake-up. A worker in this runtime was
	// already cancelled synchronously (followLocalCaller), so its frames
	// can wait for a goroutine, which a cancel that holds its wake-ups
	// starts when it runs them (ctxtree.Held).
	s.stopHooks = append(s.stopHooks,
		// A kill also fires Stopped hooks; it must not send a Stop first,
		// which could let the handler finish cleanly before the Kill lands.
		reqCtx.NotifyHeld(ctxtree.Stopped, func(h *ctxtree.Held) {
			if reqCtx.IsKilled() {
				return
			}
			if local {
				h.Wake(func() { go in.Stop() })
			} else {
				in.Stop()
			}
		}),
		reqCtx.NotifyHeld(ctxtree.Killed, func(h *ctxtree.Held) {
			// The frame carries the cancellation's cause, so the worker's
			// handler sees why (client_disconnected, shutdown, ...).
			cause := byte(reqCtx.Cause())
			killtrace.Mark("caller.kill_hook", reqCtx.ID())
			if local {
				h.Wake(func() { go in.KillCause(cause) })
			} else {
				in.KillCause(cause)
				killtrace.Mark("caller.frame_written", reqCtx.ID())
			}
			h.Wake(s.poke)
		}),
	)
	c.rt.trackStream(s)
	c.rt.setLocal(token, reqCtx) // until acknowledged: see Request.followLocalCaller
	st, _ := reqCtx.State()
	e := &envelope{ID: reqCtx.ID(), Key: key, Addr: c.rt.streamAddr(), Token: token, State: st, Request: payload, Metadata: o.metadata, Aborts: c.rt.aborts}
	e.Trace = c.startAttemptSpan(s, o.attempt, id)
	if left, ok := reqCtx.Remaining(); ok {
		us := left.Microseconds()
		e.TimeoutUs = &us
	}
	if len(payload) > InlineRequestBytes {
		e.Request, e.RequestBytes = nil, len(payload) // the worker fetches it
	}
	env := e.encode()
	if e.RequestBytes == 0 && len(env) > int(c.rt.nc().MaxPayload()) {
		e.Request, e.RequestBytes = nil, len(payload) // a server with a tiny limit
		env = e.encode()
	}
	if len(env) > int(c.rt.nc().MaxPayload()) || len(payload) > MaxRequestBytes {
		// A continuation grew past the limit, or the server takes less
		// than an envelope's fields: refused here, never sent.
		c.rt.setLocal(token, nil)
		in.Close()
		if len(payload) > MaxRequestBytes {
			s.end(fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(payload), MaxRequestBytes))
		} else {
			s.end(c.tooLarge(len(env)))
		}
		return s, nil
	}
	if e.RequestBytes > 0 {
		in.Offer(payload) // before the envelope names it
	}
	go s.run(c.rt.nc(), discovery.RequestSubject(c.path, id), env)
	return s, nil
}
