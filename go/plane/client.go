package plane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

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

	parent   *Client // set on a client made by Filtered: it shares parent's watcher
	mu       sync.Mutex
	closed   bool
	children map[*Client]struct{} // clients made by Filtered, closed with this one
	waiting  []func()
	suspects map[uint64]time.Time // instance -> until when it is avoided (see suspect)
	load     map[uint64]int       // instance -> requests of this client running there (capacity.go)
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
		if len(c.Instances()) > 0 {
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
	insts := c.Instances()
	ids := make([]uint64, len(insts))
	for i, in := range insts {
		ids[i] = in.ID
	}
	return ids
}

// Instances returns the instances currently known that pass the instance
// filter, sorted by id.
func (c *Client) Instances() []discovery.Instance {
	all := c.watcher.Instances()
	f := c.filter.Load()
	if f == nil {
		return all
	}
	out := all[:0:0]
	for _, in := range all {
		if (*f)(in.Meta) {
			out = append(out, in)
		}
	}
	return out
}

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
	if c.closed || len(c.Instances()) > 0 {
		c.mu.Unlock()
		f()
		return
	}
	c.waiting = append(c.waiting, f)
	c.mu.Unlock()
	// An instance may have appeared between the check and the append.
	if len(c.Instances()) > 0 {
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
		c.watcher.Close()
	} else {
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

// pick chooses the instance of one attempt. Direct goes where it is told.
// Otherwise the candidates are the known instances minus exclude (those that
// already failed this request) and minus the client's suspects; when that
// leaves none, suspects are allowed again, then excluded ones: a request is
// never refused for want of a perfect instance while any is known. Among the
// candidates it takes the next in turn, a random one, or, when the client
// routes by capacity (capacity.go), the one with the most free capacity,
// which it then counts (counted); with admit it refuses (ErrAtCapacity)
// when that one has none.
func (c *Client) pickFor(route Route, instance uint64, exclude map[uint64]bool, admit bool) (id uint64, counted bool, err error) {
	cfg := c.capacity.Load()
	if route == Direct {
		if cfg != nil {
			c.mu.Lock()
			if c.load == nil {
				c.load = map[uint64]int{}
			}
			c.load[instance]++
			c.mu.Unlock()
			return instance, true, nil
		}
		return instance, false, nil
	}
	insts := c.Instances()
	if len(insts) == 0 {
		return 0, false, ErrNoInstances
	}
	ids := make([]uint64, len(insts))
	for i, in := range insts {
		ids[i] = in.ID
	}
	var caps map[uint64]int
	if cfg != nil {
		caps = capacities(cfg, insts) // read outside the lock: cfg.of is the caller's code
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, until := range c.suspects {
		if now.After(until) {
			delete(c.suspects, id)
		}
	}
	keep := func(avoidSuspects bool) []uint64 {
		out := make([]uint64, 0, len(ids))
		for _, id := range ids {
			if exclude[id] {
				continue
			}
			if _, bad := c.suspects[id]; bad && avoidSuspects {
				continue
			}
			out = append(out, id)
		}
		return out
	}
	cands := keep(true)
	if len(cands) == 0 {
		cands = keep(false)
	}
	if len(cands) == 0 {
		cands = ids
	}
	if cfg != nil {
		best, ok := c.mostFreeLocked(cands, caps, admit)
		if !ok {
			// Admission: an instance avoided for a recent failure that has
			// a free place is better than a refusal (its suspicion may be
			// a hiccup; one that is really gone fails the request before
			// it starts, and the frontend sends it elsewhere).
			if best, ok = c.mostFreeLocked(keep(false), caps, admit); !ok {
				return 0, false, ErrAtCapacity
			}
		}
		if c.load == nil {
			c.load = map[uint64]int{}
		}
		c.load[best]++
		return best, true, nil
	}
	if route == Random {
		return cands[rand.IntN(len(cands))], false, nil
	}
	return cands[(c.rr.Add(1)-1)%uint64(len(cands))], false, nil
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
	if !json.Valid(payload) {
		return nil, ErrNotJSON
	}
	if len(payload)+envelopeOverhead > int(c.rt.nc().MaxPayload()) {
		return nil, c.tooLarge(len(payload) + envelopeOverhead)
	}
	if parent != nil && ValidateID(parent.ID()) != nil {
		id := parent.ID()
		if len(id) > 40 {
			id = id[:40] + "..."
		}
		return nil, fmt.Errorf("%w %q (%d bytes): a request id is 1 to %d bytes of printable UTF-8", ErrInvalidID, id, len(parent.ID()), MaxIDLen)
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
	return reqCtx, nil
}

// envelopeOverhead bounds what the envelope adds to a request payload
// (id, key, address, token, field names): the id is at most MaxIDLen bytes,
// which JSON escaping may grow sixfold.
const envelopeOverhead = 6*MaxIDLen + 512

func (c *Client) tooLarge(n int) error {
	return fmt.Errorf("%w: %d bytes, the NATS server accepts at most %d", ErrTooLarge, n, c.rt.nc().MaxPayload())
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
	s := &Stream{ctx: reqCtx, key: key, parent: parent, wake: make(chan struct{}, 1), rt: c.rt, client: c}
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
		if id, counted, err = c.pickFor(route, instance, exclude, false); err != nil {
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
	// can wait for a goroutine.
	s.stopHooks = append(s.stopHooks,
		// A kill also fires Stopped hooks; it must not send a Stop first,
		// which could let the handler finish cleanly before the Kill lands.
		reqCtx.Notify(ctxtree.Stopped, func() {
			if reqCtx.IsKilled() {
				return
			}
			if local {
				go in.Stop()
			} else {
				in.Stop()
			}
		}),
		reqCtx.Notify(ctxtree.Killed, func() {
			// The frame carries the cancellation's cause, so the worker's
			// handler sees why (client_disconnected, shutdown, ...).
			cause := byte(reqCtx.Cause())
			killtrace.Mark("caller.kill_hook", reqCtx.ID())
			if local {
				go in.KillCause(cause)
			} else {
				in.KillCause(cause)
				killtrace.Mark("caller.frame_written", reqCtx.ID())
			}
			s.poke()
		}),
	)
	c.rt.trackStream(s)
	c.rt.setLocal(token, reqCtx) // until acknowledged: see Request.followLocalCaller
	st, _ := reqCtx.State()
	e := &envelope{ID: reqCtx.ID(), Key: key, Addr: c.rt.streamAddr(), Token: token, State: st, Request: payload, Metadata: o.metadata}
	if left, ok := reqCtx.Remaining(); ok {
		us := left.Microseconds()
		e.TimeoutUs = &us
	}
	env := e.encode()
	if len(env) > int(c.rt.nc().MaxPayload()) {
		// A continuation grew past the limit: refused here, never sent.
		c.rt.setLocal(token, nil)
		in.Close()
		s.end(c.tooLarge(len(env)))
		return s, nil
	}
	go s.run(c.rt.nc(), discovery.RequestSubject(c.path, id), env)
	return s, nil
}

// Stream is the caller's side of one request: items arrive in a bounded
// buffer that the host drains with Take.
type Stream struct {
	rt        *Runtime
	client    *Client       // nil for a migrating stream's outer stream
	instance  uint64        // the instance this attempt went to (0: none)
	served    atomic.Uint64 // the instance of the current attempt (see Instance)
	key       string        // the logical request's key (see NewKey)
	ctx       *ctxtree.Context
	parent    *ctxtree.Context // the caller's context (nil for none): see Killed
	in        *transport.Incoming
	attempt   atomic.Pointer[Stream] // a migrating stream's current attempt (see KillOutcome)
	unload    atomic.Pointer[func()] // gives the attempt's place on its instance back (capacity.go)
	stopHooks []func() bool
	wake      chan struct{} // buffered(1): the consumer took items
	abandoned atomic.Bool   // the runtime closed: stop holding the producer

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
	msg, err := s.dispatch(nc, subject, env)
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
		s.end(fmt.Errorf("worker refused the request: %s", a.Error))
		return
	}
	// The worker dials right after acknowledging: from now on the usual
	// connect timeout applies.
	s.in.Acknowledged()
	s.markStarted()
	for {
		item, err := s.in.Recv(context.Background())
		if err != nil {
			err = s.classify(err)
			s.failed(err)
			s.end(err)
			return
		}
		s.push(item)
	}
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
		items, err := s.Take(1)
		if err == nil {
			return items[0], nil
		}
		if err != ErrAgain {
			return nil, err
		}
		if err := waitArmed(ctx, s.armData); err != nil {
			return nil, err
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
	if s.err == nil {
		s.err = err
	}
	f := s.ready.take()
	s.mu.Unlock()
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

// Arm runs f once when Take or Started may return something new.
func (s *Stream) Arm(f func()) {
	s.mu.Lock()
	s.ready.setLocked(&s.mu, len(s.items) > 0 || s.err != nil || (s.started && !s.startSeen), f)
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
	s.ready.setLocked(&s.mu, len(s.items) > 0 || s.err != nil, f)
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
	return s.Killed() || (s.err != nil && len(s.items) == 0)
}
