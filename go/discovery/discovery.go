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
//   - Shared snapshot: Snapshot returns the instances as one immutable,
//     shared value, rebuilt only after such a change (announcements that
//     change nothing leave it as it is), so reading it costs nothing however
//     many instances there are; Instances is a copy of it.
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
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"time"
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
	// registerTimeout bounds how long Register waits for the discovery
	// stream (a cluster electing its leaders takes seconds).
	registerTimeout = 10 * time.Second
)

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
	// At is when the lease armed the schedule that wrote this "expired"
	// (unix nanoseconds, the lease's clock): a watcher tells an expiry the
	// stream made late (after an outage) from one made on time.
	At int64 `json:"at,omitempty"`
	// TTL is the schedule's period in seconds ("expired").
	TTL int64 `json:"ttl,omitempty"`
}

// proofOf is the proof that goes with secret.
func proofOf(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

const (
	opUp   = "up"
	opDown = "down"
	// opExpired is written by the discovery stream's scheduler when a
	// lease's heartbeats stopped (see stream.go).
	opExpired = "expired"
)
