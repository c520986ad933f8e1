// Package discovery announces endpoint instances over NATS and tracks them,
// with leases that expire when the announcing process stops heartbeating.
//
// An endpoint is named by a path "namespace.component.endpoint"; each of the
// three parts is non-empty and contains no '.', '*', '>' or whitespace (they
// become NATS subject tokens). An instance is one process serving the
// endpoint, named by a non-zero uint64 id (see NewInstanceID) and carrying
// opaque metadata.
//
// A Lease (from Register) guarantees:
//
//   - Registered: when Register returns, the server has the instance's
//     query subscription and its first "up" announcement, so a Watch that
//     starts afterwards finds it through its query.
//   - Heartbeat: "up" is re-announced every heartbeat interval (default 1 s)
//     until Close.
//   - Ordered end: Close stops the heartbeat, then announces "down"; no "up"
//     of this lease is sent after its "down". Close is idempotent, waits
//     (at most 2 s) until the server has the "down", so it is not lost if
//     the process exits next, and leaves no goroutine behind.
//
// A Watcher (from Watch) guarantees:
//
//   - Snapshot: when Watch returns, Instances includes every instance whose
//     query reply arrived within the query window (default 100 ms, cut short
//     to a 20 ms grace after the first reply, and ended at once when the
//     server reports that no instance exists). An instance whose reply came
//     later appears with its next heartbeat.
//   - Liveness: an instance announcing "up" is present from that
//     announcement on; one that announces "down" is removed as soon as the
//     announcement arrives; one not heard from for the TTL (default 3 s) is
//     removed within TTL + TTL/4 of its last announcement. With the defaults
//     a crashed process disappears within 4 s.
//   - No resurrection: an "up" of a lease that already said "down" is
//     ignored, however the two messages are reordered in delivery (they
//     reach the watcher through different subscriptions).
//   - Notification: the channel returned by Changes is closed at the next
//     change of the instance set (addition, removal, or new metadata) or at
//     Close. Taking the channel before reading Instances never misses one.
//
// Requests to an instance go to RequestSubject(path, id), on which only that
// instance subscribes. NATS answers a request to a subject without
// subscribers with a "no responders" status at once, which nats.go's
// Request methods return as nats.ErrNoResponders: a request to an instance
// whose process died fails immediately instead of waiting for a timeout,
// even before the lease expires. That requires the request to be sent with
// headers support, the default in nats.go.
package discovery

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
)

const (
	// DefaultHeartbeat is the default interval between "up" announcements.
	DefaultHeartbeat = time.Second
	// DefaultTTL is the default time after which a silent instance is
	// dropped: three heartbeats, so two lost messages are tolerated.
	DefaultTTL = 3 * time.Second
	// DefaultQueryWindow is the default longest time Watch waits for
	// replies to its query.
	DefaultQueryWindow = 100 * time.Millisecond
	// queryGrace is how long Watch keeps collecting after the first reply:
	// instances on one server reply within microseconds of each other, and
	// a slow one is caught by its next heartbeat anyway.
	queryGrace = 20 * time.Millisecond
	// flushTimeout bounds how long Register and Close wait for the server
	// to acknowledge what they sent.
	flushTimeout = 2 * time.Second
)

// Subject layout. Announcements and queries use separate prefixes so that a
// watcher's announcement subscription never receives queries.
const (
	announcePrefix = "dc.inst."
	queryPrefix    = "dc.query."
	requestPrefix  = "dc.req."
)

// ErrClosed is returned by WaitForInstances after the Watcher is closed.
var ErrClosed = errors.New("discovery: watcher closed")

// Instance is one registered instance of an endpoint.
type Instance struct {
	ID   uint64
	Meta []byte
}

// NewInstanceID returns a random id in [1, 2^63): non-zero because zero
// means "no instance" to callers, and below 2^63 so that it survives a trip
// through a signed 64-bit integer (other languages, JSON readers).
func NewInstanceID() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand.Read never fails on supported platforms
		}
		if id := binary.LittleEndian.Uint64(b[:]) >> 1; id != 0 {
			return id
		}
	}
}

// ErrBadPath is matched (errors.Is) by the errors of ValidatePath and
// ValidateName.
var ErrBadPath = errors.New("invalid endpoint path")

// ValidatePath checks an endpoint path "namespace.component.endpoint": three
// parts, each valid by ValidateName. This is the one rule for endpoint paths:
// plane, the C ABI (dc_endpoint_path_check) and the Python API use it.
func ValidatePath(path string) error {
	parts := strings.Split(path, ".")
	if len(parts) != 3 {
		return fmt.Errorf("%w: %q must be namespace.component.endpoint", ErrBadPath, path)
	}
	for _, p := range parts {
		if ValidateName(p) != nil {
			return fmt.Errorf("%w: %q: each part must be non-empty without '*', '>', whitespace or control characters", ErrBadPath, path)
		}
	}
	return nil
}

// ValidateName checks one part of an endpoint path (a namespace, component
// or endpoint name): non-empty, without '.', '*', '>' (NATS subject syntax),
// whitespace or control characters.
func ValidateName(name string) error {
	if name == "" || strings.ContainsFunc(name, func(r rune) bool {
		return r == '.' || r == '*' || r == '>' || unicode.IsSpace(r) || unicode.IsControl(r)
	}) {
		return fmt.Errorf("%w: name %q must be non-empty without '.', '*', '>', whitespace or control characters", ErrBadPath, name)
	}
	return nil
}

// RequestSubject is the subject on which instance id of the endpoint at path
// receives requests: "dc.req.<namespace>.<component>.<endpoint>.<hex id>".
// path must be valid (see ValidatePath). A request to it when the instance
// is gone fails at once with nats.ErrNoResponders (see the package
// documentation).
func RequestSubject(path string, instanceID uint64) string {
	return fmt.Sprintf("%s%s.%x", requestPrefix, path, instanceID)
}

func announceSubject(path string) string { return announcePrefix + path }
func querySubject(path string) string    { return queryPrefix + path }

// announcement is the wire form of "up" and "down". Lease is a random nonce
// per Lease, so a watcher can tell a stale "up" of a closed lease from a new
// registration that reuses the instance id.
//
// Withdrawal is authenticated: every "up" carries Proof, the SHA-256 of a
// secret only the lease knows, and its "down" reveals the secret. A watcher
// accepts a "down" only if the secret hashes to the proof of the lease it
// withdraws, so a process on the bus that has seen the announcements still
// cannot withdraw another's instance; only the lease itself or its expiry
// can.
type announcement struct {
	Op     string `json:"op"` // "up" or "down"
	ID     uint64 `json:"id"`
	Lease  uint64 `json:"lease"`
	Meta   []byte `json:"meta,omitempty"`
	Proof  string `json:"proof,omitempty"`  // "up": hex SHA-256 of the secret
	Secret string `json:"secret,omitempty"` // "down": the secret
}

// proofOf is the proof that goes with secret.
func proofOf(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

const (
	opUp   = "up"
	opDown = "down"
)

// RegisterOption configures Register.
type RegisterOption func(*registerConfig)

type registerConfig struct {
	heartbeat time.Duration
}

// WithHeartbeat sets the interval between "up" announcements. Watchers'
// TTL should be a few times this value.
func WithHeartbeat(d time.Duration) RegisterOption {
	return func(c *registerConfig) {
		if d > 0 {
			c.heartbeat = d
		}
	}
}

// Lease keeps one instance announced until Close.
type Lease struct {
	nc   *nats.Conn
	path string
	id   uint64

	mu     sync.Mutex // orders every "up" before the "down"
	closed bool
	up     []byte
	down   []byte

	sub       *nats.Subscription
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Register announces instance instanceID of the endpoint at path, with meta,
// and keeps it announced until the Lease is closed (see the package
// documentation). instanceID must be non-zero. nc stays owned by the caller;
// closing it ends the heartbeats as a process death would, without "down".
func Register(nc *nats.Conn, path string, instanceID uint64, meta []byte, opts ...RegisterOption) (*Lease, error) {
	if err := ValidatePath(path); err != nil {
		return nil, err
	}
	if instanceID == 0 {
		return nil, errors.New("discovery: instance id must be non-zero")
	}
	cfg := registerConfig{heartbeat: DefaultHeartbeat}
	for _, o := range opts {
		o(&cfg)
	}
	nonce := NewInstanceID()
	var sb [32]byte
	_, _ = rand.Read(sb[:])
	secret := hex.EncodeToString(sb[:])
	up, err := json.Marshal(announcement{Op: opUp, ID: instanceID, Lease: nonce, Meta: meta, Proof: proofOf(secret)})
	if err != nil {
		return nil, err
	}
	down, err := json.Marshal(announcement{Op: opDown, ID: instanceID, Lease: nonce, Secret: secret})
	if err != nil {
		return nil, err
	}
	l := &Lease{
		nc: nc, path: path, id: instanceID, up: up, down: down,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.sub, err = nc.Subscribe(querySubject(path), l.answer)
	if err != nil {
		return nil, fmt.Errorf("discovery: register %s: %w", path, err)
	}
	if err := nc.Publish(announceSubject(path), up); err != nil {
		_ = l.sub.Unsubscribe()
		return nil, fmt.Errorf("discovery: register %s: %w", path, err)
	}
	// The guarantee "a later Watch finds it" needs the server to hold the
	// subscription before Register returns.
	if err := nc.FlushTimeout(flushTimeout); err != nil {
		_ = l.sub.Unsubscribe()
		return nil, fmt.Errorf("discovery: register %s: %w", path, err)
	}
	go l.heartbeat(cfg.heartbeat)
	return l, nil
}

// ID returns the instance id.
func (l *Lease) ID() uint64 { return l.id }

// Path returns the endpoint path.
func (l *Lease) Path() string { return l.path }

// answer replies to a watcher's query with this instance's "up".
func (l *Lease) answer(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	l.publish(m.Reply)
}

// publish sends "up" to subj unless the lease is closed. Holding mu while
// publishing orders it before Close's "down" on the connection.
func (l *Lease) publish(subj string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	// An error means the connection is closed (while reconnecting, nats.go
	// buffers); there is nobody to tell, and watchers will expire us.
	_ = l.nc.Publish(subj, l.up)
}

func (l *Lease) heartbeat(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.publish(announceSubject(l.path))
		}
	}
}

// Announce sends "up" now, outside the heartbeat schedule: after a
// reconnection (to a replacement server that knows nothing yet), so that
// watchers hear of the instance at once. Nothing after Close.
func (l *Lease) Announce() { l.publish(announceSubject(l.path)) }

// Close withdraws the instance: watchers drop it as soon as "down" reaches
// them. It is idempotent and safe to call concurrently.
func (l *Lease) Close() {
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		_ = l.sub.Unsubscribe()
		l.mu.Lock()
		l.closed = true
		_ = l.nc.Publish(announceSubject(l.path), l.down)
		l.mu.Unlock()
		// Make sure "down" leaves the process before, typically, it exits.
		_ = l.nc.FlushTimeout(flushTimeout)
	})
}

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

	mu        sync.Mutex
	closed    bool
	instances map[uint64]*entry
	// tombstones maps an instance id to the lease nonce that said "down",
	// for one TTL, so that a late "up" of that lease is recognised as stale.
	tombstones map[uint64]tombstone
	changed    chan struct{} // closed and replaced at each change

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type entry struct {
	lease    uint64
	proof    string
	meta     []byte
	lastSeen time.Time
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
	if err != nil {
		_ = w.sub.Unsubscribe()
		return nil, fmt.Errorf("discovery: watch %s: %w", path, err)
	}
	go w.expire()
	return w, nil
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
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
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
			return
		}
		if ok && e.lease == a.Lease {
			// Same lease, another proof: someone else speaks for it.
			w.log.Debug("ignoring an announcement whose proof does not match its lease", "id", a.ID)
			return
		}
		metaChanged := !ok || !slices.Equal(e.meta, a.Meta)
		w.instances[a.ID] = &entry{lease: a.Lease, proof: a.Proof, meta: a.Meta, lastSeen: now}
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
				if now.Sub(e.lastSeen) > w.ttl {
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

// Instances returns the live instances, sorted by id. The result is the
// caller's to keep and modify.
func (w *Watcher) Instances() []Instance {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Instance, 0, len(w.instances))
	for id, e := range w.instances {
		out = append(out, Instance{ID: id, Meta: slices.Clone(e.meta)})
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
		w.mu.Lock()
		w.closed = true
		clear(w.instances)
		clear(w.tombstones)
		close(w.changed)
		w.mu.Unlock()
	})
}
