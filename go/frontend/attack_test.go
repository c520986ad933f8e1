package frontend_test

// Findings of the 2026-12-04 security review (branch attack): each test
// fails on main a8a1fec (TestChatContentPartsCostLinear passes after the
// chatText fix on this branch).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// TestChatContentPartsCostLinear: a chat message whose content is a list of
// many short text parts is refused (400, the prompt is over the context
// length) in time linear in the body: concatenating the parts with
// `text += p.Text` would copy the whole text for every part, and a 4 MiB
// body of 12-byte parts would cost ~P^2*L/2 byte copies.
func TestChatContentPartsCostLinear(t *testing.T) {
	e, _ := one(t)
	e.slow = true
	const budget = 3 << 20
	part := `{"type":"text","text":"aaaaaaaaaaaa"},`
	n := budget / len(part)
	var b bytes.Buffer
	b.WriteString(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[`)
	b.WriteString(strings.Repeat(part, n-1))
	b.WriteString(`{"type":"text","text":"aaaaaaaaaaaa"}]}]}`)
	// The same size as one string: the linear cost of such a body.
	one := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("a", b.Len()-70) + `"}]}`
	start := time.Now()
	r := e.post("/v1/chat/completions", one, nil)
	base := time.Since(start)
	require.Equal(t, http.StatusBadRequest, r.status)
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	start = time.Now()
	r = e.post("/v1/chat/completions", b.String(), nil)
	took := time.Since(start)
	runtime.ReadMemStats(&ms1)
	t.Logf("%d parts, %d bytes: status %d in %v (one string of that size: %v), allocated %d MiB", n, b.Len(), r.status, took, base, (ms1.TotalAlloc-ms0.TotalAlloc)>>20)
	assert.Equal(t, http.StatusBadRequest, r.status)
	assert.Less(t, took, 10*base+time.Second, "one request of %d bytes took %v of frontend CPU", b.Len(), took)
	assert.Less(t, ms1.TotalAlloc-ms0.TotalAlloc, uint64(512<<20), "allocated %d MiB", (ms1.TotalAlloc-ms0.TotalAlloc)>>20)
}

// TestDeclaredLengthIsNotAllocatedUpFront: a client that sends only the
// headers of a request declaring a body of the limit (4 MiB) and then
// nothing makes the frontend allocate the whole 4 MiB at once (readBody's
// make([]byte, ContentLength)) and hold it for the read timeout (30 s):
// ~150 bytes sent cost 4 MiB, with no bound on such connections.
func TestDeclaredLengthIsNotAllocatedUpFront(t *testing.T) {
	e, _ := one(t)
	before := heapAlloc()
	const conns = 64
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, err := net.DialTimeout("tcp", e.fe.Addr(), planetest.WaitLimit)
		require.NoError(t, err)
		open = append(open, c)
		_, err = fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 4<<20)
		require.NoError(t, err)
	}
	time.Sleep(500 * time.Millisecond)
	after := heapAlloc()
	grew := int64(after) - int64(before)
	t.Logf("%d connections that sent headers and 1 byte of body: heap grew by %d MiB", conns, grew>>20)
	assert.Less(t, grew, int64(conns*256<<10), "each silent body holds %d KiB", grew/conns>>10)
}

// TestStopTokenIDsNotAmplified: stop_token_ids has no bound but the body's,
// and it is copied into each of the n (up to 128) worker requests, so one
// 1 MiB request becomes 128 MiB of envelopes on the bus and in the workers
// (measured with the Python mock worker and a 4 MiB body: the worker's RSS
// peaked at 4.7 GiB and stayed at 1.2 GiB, and another client's request to
// the same worker waited 49 s). The most a request within the documented
// limits can otherwise send is 128 prompts of the context length (~25 MiB).
func TestStopTokenIDsNotAmplified(t *testing.T) {
	e := newEnv(t)
	e.slow = true
	var total atomic.Int64
	e.worker("w", "dynamo", "m", 0, func(w *planetest.Worker, req *plane.Request) {
		total.Add(int64(len(req.Payload)))
		planetest.Tokens(w, req)
	})
	e.start()
	e.waitModels("m")
	ids := strings.TrimSuffix(strings.Repeat("1,", 500_000), ",")
	body := `{"model":"m","prompt":"hi","max_tokens":1,"n":128,"stop_token_ids":[` + ids + `]}`
	r := e.post("/v1/completions", body, nil)
	t.Logf("body %d bytes: status %d, %d MiB sent to the worker", len(body), r.status, total.Load()>>20)
	assert.Less(t, total.Load(), int64(32<<20), "a %d-byte request sent %d MiB to workers", len(body), total.Load()>>20)
}

// TestLongStopStringCostLinear: stop strings have no length bound, and the
// stop matcher holds back text that could start a stop string by
// concatenating it (s.pending += text) and rescanning it per token. A client
// who can predict the output (the mock engine's is deterministic; a real
// model told to repeat a word is close) gives as stop string the expected
// text plus one more character: every token then copies and rescans all the
// text so far, O(tokens^2) per choice, times n choices.
func TestLongStopStringCostLinear(t *testing.T) {
	e, _ := one(t)
	e.slow = true
	const tokens, n = 30000, 4
	plain := func(stop string) (time.Duration, int) {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": "hi", "max_tokens": tokens, "n": n, "stop": []string{stop}})
		start := time.Now()
		r := e.post("/v1/completions", string(body), nil)
		return time.Since(start), r.status
	}
	ids := make([]int, tokens)
	for i := range ids {
		ids[i] = 2 + i // planetest.Tokens continues the prompt's 2 tokens
	}
	expected := frontend.Detokenize(ids)
	base, st := plain("\x00never")
	require.Equal(t, http.StatusOK, st)
	// Longer than MaxStopLen: refused.
	_, st = plain(expected + "X")
	require.Equal(t, http.StatusBadRequest, st)
	// The longest allowed: one the output almost matches, one it never
	// starts, one whose every prefix it keeps matching (a run of one byte).
	for _, stop := range []string{
		expected[:frontend.MaxStopLen-1] + "\x00",
		"\x00" + strings.Repeat("y", frontend.MaxStopLen-1),
		strings.Repeat(expected[len(expected)-1:], frontend.MaxStopLen),
	} {
		slow, st := plain(stop)
		require.Equal(t, http.StatusOK, st)
		t.Logf("%d tokens x %d choices: %v with a short stop string, %v with a %d-byte one", tokens, n, base, slow, len(stop))
		assert.Less(t, slow, 4*base+time.Second, "the stop string made the request %.0fx slower", float64(slow)/float64(base))
	}
}

// TestJSONKeysMatchExactly: encoding/json matches object keys without regard
// to case, with Unicode folding (the Kelvin sign K matches k, the long s
// matches s), the last match winning. A gateway in front of the frontend
// (docs/security.md tells deployments to put one there for authentication
// and rate limits) that reads the body with an exact-key parser (Python's
// json, most others) and enforces, say, max_tokens <= 1 sees
// {"max_tokens": 1, "MAX_TOKENS": 7} as max_tokens 1; the frontend runs 7
// tokens. The same holds for model (routing, per-model policy), n and stream.
func TestJSONKeysMatchExactly(t *testing.T) {
	e, _ := one(t)
	for _, body := range []string{
		`{"model":"m","prompt":"hi","max_tokens":1,"MAX_TOKENS":7}`,
		`{"model":"m","prompt":"hi","max_tokens":1,"max_to` + "\u212a" + `ens":7}`,
	} {
		r := e.post("/v1/completions", body, nil)
		if r.status != http.StatusOK {
			continue // refusing the ambiguous body is fine too
		}
		usage := r.json(t)["usage"].(map[string]any)
		assert.EqualValues(t, 1, usage["completion_tokens"], "body %s: max_tokens is 1 to an exact-key reader", body)
	}
}
