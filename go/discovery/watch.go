package discovery

// A Watcher: the live instances of one endpoint, from a query and the
// announcements.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrClosed is returned by WaitForInstances after the Watcher is closed.
var ErrClosed = errors.New("discovery: watcher closed")

// WatchOption configures Watch.
type WatchOption func(*watchConfig)

type watchConfig struct {
	ttl         time.Duration
	queryWindow time.Duration
	log         *slog.Logger
}

// WithTTL sets how long an instance may stay silent before it is dropped.
func WithTTL(d time.Duration) WatchOption {
	return func(c *watchConfig) {
		if d > 0 {
			c.ttl = d
		}
	}
}

// WithQueryWindow sets the longest time Watch waits for query replies.
func WithQueryWindow(d time.Duration) WatchOption {
	return func(c *watchConfig) {
		if d > 0 {
			c.queryWindow = d
		}
	}
}

// WithLogger sets where malformed announcements are reported (debug level).
// The default is slog.Default().
func WithLogger(l *slog.Logger) WatchOption {
	return func(c *watchConfig) {
		if l != nil {
			c.log = l
		}
	}
}

// Watcher tracks the live instances of one endpoint. Its methods may be
// called concurrently.
type Watcher struct {
	path string
	ttl  time.Duration
	log  *slog.Logger
	sub  *nats.Subscription
	feed *feed // the discovery stream's; nil without JetStream

	mu        sync.Mutex
	closed    bool
	instances map[uint64]*entry
	// tombstones maps an instance id to the lease nonce that said "down",
	// for one TTL, so that a late "up" of that lease is recognised as stale.
	tombstones map[uint64]tombstone
	changed    chan struct{} // closed and replaced at each change
	// snap is the instances as Snapshot returns them; nil after a change
	// until the next Snapshot rebuilds it (set with mu held).
	snap atomic.Pointer[Snapshot]

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type entry struct {
	lease    uint64
	proof    string
	meta     []byte
	lastSeen time.Time
	// kv: announced in the discovery stream, which says when it ends; it
	// is not expired by silence. deadline, when set, is when it is dropped
	// unless the stream has its "up" again by then (see applyFull, apply).
	kv       bool
	deadline time.Time
}

type tombstone struct {
	lease uint64
	proof string // of the secret the "down" revealed
	at    time.Time
}

// Watch starts tracking the instances of the endpoint at path. It returns
// after the initial query (see the package documentation); ctx bounds only
// that wait, and the Watcher lives until Close.
func Watch(ctx context.Context, nc *nats.Conn, path string, opts ...WatchOption) (*Watcher, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	cfg := watchConfig{ttl: DefaultTTL, queryWindow: DefaultQueryWindow, log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	w := &Watcher{
		path:       path,
		ttl:        cfg.ttl,
		log:        cfg.log.With("component", "discovery", "endpoint", path),
		instances:  make(map[uint64]*entry),
		tombstones: make(map[uint64]tombstone),
		changed:    make(chan struct{}),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	var err error
	w.sub, err = nc.Subscribe(announceSubject(path), w.receive)
	if err != nil {
		return nil, fmt.Errorf("discovery: watch %s: %w", path, err)
	}
	// Query on a private inbox, read synchronously here: no goroutine and no
	// callback outlive Watch. The announcement subscription is created first,
	// so an instance registering after the query is heard by its "up".
	inbox, err := nc.SubscribeSync(nc.NewInbox())
	if err == nil {
		err = nc.PublishRequest(querySubject(path), inbox.Subject, nil)
		if err == nil {
			err = w.collect(ctx, inbox, cfg.queryWindow)
		}
		_ = inbox.Unsubscribe()
	}
	if err == nil {
		err = w.startFeed(ctx, nc)
	}
	if err != nil {
		_ = w.sub.Unsubscribe()
		return nil, fmt.Errorf("discovery: watch %s: %w", path, err)
	}
	go w.expire()
	return w, nil
}

// startFeed reads the discovery stream's states of the path in full, when
// the server has JetStream, and keeps following them.
func (w *Watcher) startFeed(ctx context.Context, nc *nats.Conn) error {
	switch err := ensureStream(ctx, nc); {
	case errors.Is(err, errNoJetStream):
		return nil
	case err != nil:
		return err
	}
	f := newFeed(w, nc, w.path)
	synced, err := f.resync(ctx)
	if err == nil {
		select {
		case <-synced:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		close(f.done)
		f.stop()
		return err
	}
	w.feed = f
	go f.run()
	return nil
}

// Resync reads the discovery stream afresh, in the background: after a
// reconnection, whose server may have lost the watcher's consumer or the
// stream itself. Instances the stream no longer has are dropped a TTL
// later unless they are announced again meanwhile.
func (w *Watcher) Resync() {
	if w.feed != nil {
		w.feed.again()
	}
}

// collect applies query replies until the window ends, the grace after the
// first reply ends, or the server reports that nobody subscribes to the
// query subject (a 503 status: no instance exists).
func (w *Watcher) collect(ctx context.Context, inbox *nats.Subscription, window time.Duration) error {
	deadline := time.Now().Add(window)
	first := true
	for {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		m, err := inbox.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			// nats.go turns the server's 503 status into ErrNoResponders.
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) {
				return nil
			}
			return err
		}
		w.receive(m)
		if first {
			first = false
			if g := time.Now().Add(queryGrace); g.Before(deadline) {
				deadline = g
			}
		}
	}
}

// receive applies one announcement.
func (w *Watcher) receive(m *nats.Msg) {
	var a announcement
	if err := json.Unmarshal(m.Data, &a); err != nil || a.ID == 0 || (a.Op != opUp && a.Op != opDown) {
		w.log.Debug("ignoring malformed announcement", "subject", m.Subject, "error", err)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.applyLocked(a, time.Now(), false)
}

// applyLocked applies an "up" or a "down", heard by heartbeat (kv false)
// or read in the discovery stream.
func (w *Watcher) applyLocked(a announcement, now time.Time, kv bool) {
	switch a.Op {
	case opUp:
		if ts, ok := w.tombstones[a.ID]; ok {
			if ts.lease == a.Lease && ts.proof == a.Proof {
				return // stale: this lease already said "down"
			}
			// Another lease reusing the id, or a forged "down" that came
			// first and does not match this lease's proof: forget it.
			delete(w.tombstones, a.ID)
		}
		e, ok := w.instances[a.ID]
		if ok && e.lease == a.Lease && e.proof == a.Proof {
			e.lastSeen = now
			if kv {
				e.kv, e.deadline = true, time.Time{}
			}
			return
		}
		if ok && e.lease == a.Lease {
			// Same lease, another proof: someone else speaks for it.
			w.log.Debug("ignoring an announcement whose proof does not match its lease", "id", a.ID)
			return
		}
		metaChanged := !ok || !slices.Equal(e.meta, a.Meta)
		w.instances[a.ID] = &entry{lease: a.Lease, proof: a.Proof, meta: a.Meta, lastSeen: now, kv: kv}
		if metaChanged {
			w.notifyLocked()
		}
	case opDown:
		proof := proofOf(a.Secret)
		if e, ok := w.instances[a.ID]; ok && e.lease == a.Lease {
			if e.proof != proof {
				w.log.Debug("ignoring a forged \"down\"", "id", a.ID)
				return
			}
			delete(w.instances, a.ID)
			w.notifyLocked()
		}
		// Kept for a TTL: an "up" of this lease delivered late is stale, if
		// its proof matches the secret revealed here.
		w.tombstones[a.ID] = tombstone{lease: a.Lease, proof: proof, at: now}
	}
}

func (w *Watcher) notifyLocked() {
	w.snap.Store(nil)
	close(w.changed)
	w.changed = make(chan struct{})
}

// expire drops silent instances and old tombstones. Sweeping every TTL/4
// bounds the removal delay to TTL + TTL/4 at a negligible cost.
func (w *Watcher) expire() {
	defer close(w.done)
	t := time.NewTicker(max(w.ttl/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case now := <-t.C:
			w.mu.Lock()
			removed := false
			for id, e := range w.instances {
				if e.kv && (e.deadline.IsZero() || now.Before(e.deadline)) {
					continue
				}
				if e.kv || now.Sub(e.lastSeen) > w.ttl {
					delete(w.instances, id)
					removed = true
				}
			}
			for id, ts := range w.tombstones {
				if now.Sub(ts.at) > w.ttl {
					delete(w.tombstones, id)
				}
			}
			if removed && !w.closed {
				w.notifyLocked()
			}
			w.mu.Unlock()
		}
	}
}

// Path returns the endpoint path being watched.
func (w *Watcher) Path() string { return w.path }

// Snapshot is the live instances of a Watcher at one moment, sorted by id.
// It is immutable and shared by every reader: neither it nor the metadata of
// its instances may be modified.
type Snapshot struct {
	instances []Instance
}

// Instances returns the snapshot's instances, sorted by id. The slice and
// each instance's Meta are shared: read them, never modify them.
func (s *Snapshot) Instances() []Instance { return s.instances }

// Len is the number of instances.
func (s *Snapshot) Len() int { return len(s.instances) }

var emptySnapshot = &Snapshot{}

// Snapshot returns the live instances. It is rebuilt only after a change of
// the instance set (an addition, a removal or new metadata: what closes the
// Changes channel), on the first call after it; in between every call
// returns the same *Snapshot, without copying or allocating, so a caller
// may compare two by pointer to tell whether anything changed.
func (w *Watcher) Snapshot() *Snapshot {
	if s := w.snap.Load(); s != nil {
		return s
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.snap.Load(); s != nil {
		return s
	}
	s := emptySnapshot
	if !w.closed && len(w.instances) > 0 {
		out := make([]Instance, 0, len(w.instances))
		for id, e := range w.instances {
			// e.meta is never modified: a change replaces the entry.
			out = append(out, Instance{ID: id, Meta: e.meta})
		}
		slices.SortFunc(out, func(a, b Instance) int {
			switch {
			case a.ID < b.ID:
				return -1
			case a.ID > b.ID:
				return 1
			}
			return 0
		})
		s = &Snapshot{instances: out}
	}
	w.snap.Store(s)
	return s
}

// Instances returns the live instances, sorted by id. The result is the
// caller's to keep and modify: a copy of Snapshot's.
func (w *Watcher) Instances() []Instance {
	snap := w.Snapshot().Instances()
	out := make([]Instance, len(snap))
	for i, in := range snap {
		out[i] = Instance{ID: in.ID, Meta: slices.Clone(in.Meta)}
	}
	return out
}

// Changes returns a channel that is closed at the next change of the
// instance set after this call, or at Close. Use it as
//
//	for {
//		ch := w.Changes()
//		use(w.Instances())
//		<-ch
//	}
func (w *Watcher) Changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

// WaitForInstances returns the live instances as soon as there is at least
// one. It returns ctx's error if ctx ends first, and ErrClosed if the
// Watcher is closed first.
func (w *Watcher) WaitForInstances(ctx context.Context) ([]Instance, error) {
	for {
		ch := w.Changes()
		if inst := w.Instances(); len(inst) > 0 {
			return inst, nil
		}
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// Close stops tracking: the subscription is removed, the expiry goroutine
// has exited when Close returns, Instances is empty from then on, and
// waiters on Changes and WaitForInstances are released. Idempotent.
func (w *Watcher) Close() {
	w.closeOnce.Do(func() {
		_ = w.sub.Unsubscribe()
		close(w.stop)
		<-w.done
		if w.feed != nil {
			w.feed.stop()
		}
		w.mu.Lock()
		w.closed = true
		clear(w.instances)
		clear(w.tombstones)
		w.snap.Store(nil)
		close(w.changed)
		w.mu.Unlock()
	})
}
