package frontend_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// A worker that never acknowledges (frozen, as under SIGSTOP) beside a
// healthy one, migration limit 0: no new request fails; the ones sent to
// the frozen instance are sent again to the other (they never reached a
// worker), and later ones avoid it.
func TestUnacknowledgedRequestsAreResentWithoutMigration(t *testing.T) {
	e := newEnv(t)
	e.worker("w", "dynamo", "m", 0, planetest.Tokens)
	planetest.BlackHole(t, e.host, "dynamo.backend.generate", cardJSON(t, modelcard.Card{Model: "m"})) // never acknowledges
	e.start()
	e.waitModels("m")
	require.Eventually(t, func() bool {
		r := e.do(http.MethodGet, "/health", "", nil)
		return r.json(t)["instances"] == float64(2)
	}, 5*time.Second, 10*time.Millisecond)
	start := time.Now()
	for i := range 6 {
		r := e.post("/v1/completions", `{"model":"m","prompt":"hi","max_tokens":3}`, map[string]string{"x-request-id": fmt.Sprint("r", i)})
		require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.body)
		assert.EqualValues(t, 3, r.json(t)["usage"].(map[string]any)["completion_tokens"])
	}
	t.Logf("6 requests, one instance of two frozen: all answered in %v", time.Since(start))
	assert.Less(t, time.Since(start), 2*plane.DefaultAckTimeout+5*time.Second)
}
