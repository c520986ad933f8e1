package frontend_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
)

// A panic in the response code (a bug) answers 500, kills the worker
// requests it had sent (nothing keeps generating for nobody), and is not
// counted as a client's disconnect.
func TestPanicKillsItsRequestsAndCountsNoDisconnect(t *testing.T) {
	e, got := holding(t, 4)
	defer frontend.PanicBeforeResponse()()

	for _, stream := range []bool{true, false} {
		resp, err := http.Post(e.base+"/v1/completions", "application/json", strings.NewReader(completion("m", "hi", 20, stream)))
		require.NoError(t, err)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		req := planetest.Recv(t, got, "the request at the worker")
		select {
		case <-req.Ctx.Killed():
		case <-time.After(planetest.WaitLimit):
			t.Fatal("the worker's request was not killed")
		}
		assert.NotEqual(t, ctxtree.ReasonClientDisconnected, req.Ctx.Reason(), "stream=%v", stream)
	}
	time.Sleep(200 * time.Millisecond) // a late watcher would count by now
	assert.Zero(t, e.metrics()[key(mCancellations, "m")])
}
