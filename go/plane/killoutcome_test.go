package plane_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// A caller that kills a request as it ends can tell whether the kill aborted
// anything (Stream.KillOutcome), and the worker agrees: it confirms the
// abort exactly for the kills whose outcome is true. Kills land at the last
// items, where they cross the worker's end frame, so both outcomes occur.
func TestKillOutcomeMatchesConfirmations(t *testing.T) {
	const n, iterations = 8, 300
	for _, migrating := range []bool{false, true} {
		t.Run(fmt.Sprintf("migrating=%v", migrating), func(t *testing.T) {
			path := fmt.Sprintf("test.killoutcome%v.generate", migrating)
			host, _, c := planetest.ServeAndConnect(t, path, countHandler)
			if migrating {
				c.SetMigrationLimit(2)
			}

			var mu sync.Mutex
			confirmed := map[string]int{}
			unsubscribe, err := host.OnAbortConfirmed(func(a plane.AbortConfirmation) {
				mu.Lock()
				confirmed[a.Key]++
				mu.Unlock()
			})
			require.NoError(t, err)
			defer unsubscribe()

			outcomes := make(chan [2]any, iterations)
			for i := range iterations {
				parent := ctxtree.New(fmt.Sprintf("outcome-%d", i))
				s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), parent)
				k := n - 1 - i%3 // kill after item n-3, n-2 or n-1
				_, err := planetest.Take(s, k)
				require.NoError(t, err)
				if i%4 == 0 {
					time.Sleep(time.Duration(i%5) * 50 * time.Microsecond)
				}
				parent.Kill()
				key := s.Key()
				s.KillOutcome(func(aborted bool) { outcomes <- [2]any{key, aborted} })
			}
			aborted := map[string]bool{}
			for range iterations {
				select {
				case o := <-outcomes:
					aborted[o[0].(string)] = o[1].(bool)
				case <-time.After(planetest.WaitLimit):
					t.Fatalf("%d kill outcomes of %d", len(aborted), iterations)
				}
			}
			want := 0
			for _, a := range aborted {
				if a {
					want++
				}
			}
			deadline := time.Now().Add(planetest.WaitLimit)
			for {
				mu.Lock()
				got := len(confirmed)
				mu.Unlock()
				if got >= want || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // any confirmation that should not come
			mu.Lock()
			defer mu.Unlock()
			for key, a := range aborted {
				if a {
					assert.Equal(t, 1, confirmed[key], "an aborting kill was not confirmed once")
				} else {
					assert.Zero(t, confirmed[key], "a kill that aborted nothing was confirmed")
				}
			}
			assert.Len(t, confirmed, want)
			t.Logf("%d of %d kills aborted their request", want, iterations)
		})
	}
}
