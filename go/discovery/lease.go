package discovery

// A Lease: one instance announced, by heartbeat, until Close.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// RegisterOption configures Register.
type RegisterOption func(*registerConfig)

type registerConfig struct {
	heartbeat time.Duration
	ttl       time.Duration
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

// WithLeaseTTL sets how long after its last heartbeat the discovery stream
// expires the instance (whole seconds, at least one: the stream's
// scheduler counts in seconds). Without JetStream the watchers' TTL
// (WithTTL) applies instead.
func WithLeaseTTL(d time.Duration) RegisterOption {
	return func(c *registerConfig) {
		if d > 0 {
			c.ttl = d
		}
	}
}

// Lease keeps one instance announced until Close.
type Lease struct {
	nc   *nats.Conn
	path string
	id   uint64
	// js is the lease's state in the discovery stream; nil when the server
	// has no JetStream and the lease announces by heartbeat to every
	// watcher instead.
	js *streamLease

	mu     sync.Mutex // orders every "up" before the "down"
	closed bool
	up     []byte
	down   []byte

	sub       *nats.Subscription
	kick      chan struct{} // buffered(1): Announce wakes the heartbeat
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
	cfg := registerConfig{heartbeat: DefaultHeartbeat, ttl: DefaultTTL}
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
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	switch err := ensureStream(ctx, nc); {
	case err == nil:
		l.js = newStreamLease(path, instanceID, nonce, cfg.ttl, cfg.heartbeat)
		if err := l.js.start(ctx, nc, up); err != nil {
			return nil, fmt.Errorf("discovery: register %s: %w", path, err)
		}
		go l.heartbeat(cfg.heartbeat)
		return l, nil
	case !errors.Is(err, errNoJetStream):
		return nil, fmt.Errorf("discovery: register %s: %w", path, err)
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
		case <-l.kick:
		}
		if l.js != nil {
			l.js.beat(l.nc, l.up)
		} else {
			l.publish(announceSubject(l.path))
		}
	}
}

// Announce sends "up" now, outside the heartbeat schedule: after a
// reconnection (to a replacement server that knows nothing yet), so that
// watchers hear of the instance at once. Nothing after Close. With the
// discovery stream it wakes the heartbeat, which puts "up" again if the
// stream lost it, and returns at once.
func (l *Lease) Announce() {
	if l.js != nil {
		select {
		case l.kick <- struct{}{}:
		default:
		}
		return
	}
	l.publish(announceSubject(l.path))
}

// Close withdraws the instance: watchers drop it as soon as "down" reaches
// them. It is idempotent and safe to call concurrently.
func (l *Lease) Close() {
	l.closeOnce.Do(func() {
		close(l.stop)
		if l.js != nil {
			l.js.stop() // a heartbeat waiting on the stream gives up
		}
		<-l.done
		if l.js != nil {
			l.mu.Lock()
			l.closed = true
			l.mu.Unlock()
			l.js.close(l.nc, l.down)
			return
		}
		_ = l.sub.Unsubscribe()
		l.mu.Lock()
		l.closed = true
		_ = l.nc.Publish(announceSubject(l.path), l.down)
		l.mu.Unlock()
		// Make sure "down" leaves the process before, typically, it exits.
		_ = l.nc.FlushTimeout(flushTimeout)
	})
}
