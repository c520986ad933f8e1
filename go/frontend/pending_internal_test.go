package frontend

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The table of disconnects waiting for their confirmation forgets entries
// pendingTTL old as new ones arrive, and forgets a confirmed one at once:
// it holds only what may still be confirmed, whatever the order.
func TestPendingAbortsExpire(t *testing.T) {
	f := &Frontend{pending: map[string]*pendingAbort{}}
	t0 := time.Now()
	var ps []*pendingAbort
	for i := range 10 {
		ps = append(ps, f.remember(&pendingAbort{key: fmt.Sprint(i), at: t0.Add(time.Duration(i) * time.Second)}))
	}
	f.forget(ps[7]) // confirmed
	f.forget(ps[7]) // twice: nothing
	assert.Len(t, f.pending, 9)
	assert.Equal(t, 9, f.byAge.Len())

	// The TTL (5 min) after the sixth: the first six are past it.
	f.remember(&pendingAbort{key: "late", at: t0.Add(pendingTTL + 5500*time.Millisecond)})
	assert.Len(t, f.pending, 4) // 6, 8, 9, late
	for _, k := range []string{"6", "8", "9", "late"} {
		assert.Contains(t, f.pending, k)
	}
	assert.Equal(t, len(f.pending), f.byAge.Len())

	// The same key again replaces the entry.
	again := f.remember(&pendingAbort{key: "9", at: t0.Add(pendingTTL + 6*time.Second)})
	assert.Same(t, again, f.pending["9"])
	assert.Equal(t, len(f.pending), f.byAge.Len())
	f.forget(ps[9]) // the replaced one: the new one stays
	assert.Same(t, again, f.pending["9"])
}
