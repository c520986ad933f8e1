package discovery

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// An "expired" stored early in a leader's term is in doubt; one stored
// later, or on a server that is not clustered, is not; one applied while
// the stream could not be asked always is.
func TestTermDoubts(t *testing.T) {
	since := time.Unix(1000, 0)
	ttl := 3 * time.Second
	assert.True(t, term{since: since}.doubts(since.Add(time.Second), ttl))
	assert.True(t, term{since: since}.doubts(since.Add(ttl+lateSlack-time.Millisecond), ttl))
	assert.False(t, term{since: since}.doubts(since.Add(ttl+lateSlack+time.Millisecond), ttl))
	assert.False(t, term{}.doubts(since, ttl), "a single server elects no one")
	assert.True(t, term{unknown: true}.doubts(since.Add(time.Hour), ttl))
}

// A doubted "expired" keeps the instance for a TTL, during which its "up"
// keeps it for good; a trusted one drops it at once.
func TestExpiredInDoubt(t *testing.T) {
	w := &Watcher{ttl: 3 * time.Second, instances: map[uint64]*entry{}, tombstones: map[uint64]tombstone{},
		changed: make(chan struct{}), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	now := time.Now()
	up := announcement{Op: opUp, ID: 7, Lease: 1, Proof: "p"}
	w.applyStateLocked(up, now, now, term{})
	armed := now.Add(-3 * time.Second)
	expired := announcement{Op: opExpired, ID: 7, Lease: 1, At: armed.UnixNano(), TTL: 3}

	w.applyStateLocked(expired, now, now, term{since: now.Add(-2 * time.Second)})
	e := w.instances[7]
	if assert.NotNil(t, e, "in doubt: still listed") {
		assert.Equal(t, now.Add(3*time.Second), e.deadline)
	}
	w.applyStateLocked(up, now, now, term{})
	assert.True(t, w.instances[7].deadline.IsZero(), "its \"up\" again: kept")

	w.applyStateLocked(expired, now, now, term{since: now.Add(-time.Hour)})
	assert.NotContains(t, w.instances, uint64(7), "an expiry on time in a long term: dropped")
}
