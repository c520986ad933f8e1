package discovery

// The discovery stream's leader's term: an "expired" that a new leader's
// scheduler writes early in its term may be the election's doing, not a
// death.

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// term is when the discovery stream's leader took office, as a watcher
// applies an "expired". While a cluster elects a new leader (its node was
// lost) nothing is stored: no lease can re-arm its schedule, and a
// schedule armed before the loss comes due during the election or just
// after it, when the new leader's scheduler fires it at once. Its
// "expired" is then written on time, and yet the lease may be alive,
// re-arming at its next heartbeat. So an "expired" stored within a TTL and
// lateSlack of the leader's taking office is not trusted at once: the
// instance is dropped only if it does not put "up" again within a TTL (as
// for a late one). A live lease re-arms within a heartbeat and a JetStream
// timeout of the election's end, and finds its "up" overwritten, so it
// puts "up" again: no watcher drops it. A lease that did die in the
// election is dropped one TTL later than otherwise.
type term struct {
	since   time.Time // zero: not known to be clustered (a single server: no election)
	unknown bool      // the stream could not be asked: every "expired" is in doubt
}

// doubts reports whether an "expired" of a lease with the given TTL,
// stored at "at", may be an election's doing.
func (t term) doubts(at time.Time, ttl time.Duration) bool {
	if t.unknown {
		return true
	}
	return !t.since.IsZero() && at.Before(t.since.Add(ttl+lateSlack))
}

// termCache is the last term read. A term read when the stream said it was
// at time asOf holds for every message stored before then: if another
// leader stored it, the one read took office after it, and doubts it.
type termCache struct {
	mu   sync.Mutex
	t    term
	asOf time.Time // the stream's time when it was read; zero: never read
}

// get returns the stream leader's term as of a time after at, asking the
// stream (one JetStream API request) only when the last read is older.
func (c *termCache) get(nc *nats.Conn, at time.Time) term {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.asOf.IsZero() && !at.After(c.asOf) {
		return c.t
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return term{unknown: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
	defer cancel()
	asked := time.Now()
	s, err := js.Stream(ctx, streamName)
	if err != nil {
		return term{unknown: true}
	}
	info := s.CachedInfo()
	var t term
	if info.Cluster != nil && info.Cluster.LeaderSince != nil {
		t.since = *info.Cluster.LeaderSince
	}
	c.t, c.asOf = t, info.TimeStamp
	if c.asOf.IsZero() {
		c.asOf = asked
	}
	return t
}

// termOf is the term to apply msgs with: read only if one of them is an
// "expired" (the latest of them decides how fresh it must be).
func (f *feed) termOf(msgs []stateMsg) term {
	var latest time.Time
	for _, m := range msgs {
		if m.a.Op == opExpired && m.at.After(latest) {
			latest = m.at
		}
	}
	if latest.IsZero() {
		return term{}
	}
	return f.terms.get(f.nc, latest)
}
