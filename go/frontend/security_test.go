package frontend_test

// Adversarial tests of the frontend: what an HTTP client or a
// process on the bus can do to other clients' requests and to the
// frontend's memory and CPU (bodies and parameters whose cost must stay
// linear in their size), and bodies that a gateway reading keys exactly
// would read differently.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pausing is an engine that sends the first token, then waits until the
// request is killed (reported on killed) or the test sends on resume, then
// sends the rest of max_tokens.
func pausing(killed chan<- *plane.Request, resume <-chan struct{}) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		p := parse(req)
		next, n := len(p.TokenIDs), p.StopConditions.MaxTokens
		if !w.SendTokens(req, next, 1, "") {
			killed <- req
			return
		}
		select {
		case <-req.Ctx.Killed():
			killed <- req
			return
		case <-resume:
		case <-w.Quit:
			return
		}
		w.SendTokens(req, next+1, n-1, "length")
	}
}

// TestRequestIDCollision: a client that reuses another's x-request-id (20
// tries, in both orders) neither blocks the victim nor cancels it by
// disconnecting; each request is killed and confirmed on its own.
func TestRequestIDCollision(t *testing.T) {
	e := newEnv(t)
	killed := make(chan *plane.Request, 4)
	resume := make(chan struct{}, 4)
	e.worker("w", "dynamo", "m", 0, pausing(killed, resume))
	e.start()
	e.waitModels("m")
	const tries, n = 20, 8
	for i := 0; i < tries; i++ {
		id := fmt.Sprintf("shared-%d", i)
		hdr := map[string]string{"x-request-id": id}
		actx, acancel := context.WithCancel(context.Background())
		var attacker, victim *http.Response
		// Even tries: the attacker squats the id first; odd: the victim is first.
		if i%2 == 0 {
			attacker = e.openCtx(actx, completion("m", "hi", n, true), hdr)
		}
		victim = e.open("/v1/completions", completion("m", "hi", n, true), hdr)
		require.Equal(t, http.StatusOK, victim.StatusCode, "try %d: the victim is not blocked", i)
		if i%2 == 1 {
			attacker = e.openCtx(actx, completion("m", "hi", n, true), hdr)
		}
		require.Equal(t, http.StatusOK, attacker.StatusCode)
		assert.Equal(t, id, victim.Header.Get("x-request-id"))
		vev, aev := newEvents(victim), newEvents(attacker)
		vfirst := vev.chunk(t)
		aev.chunk(t)
		acancel() // the attacker disconnects
		_ = attacker.Body.Close()
		k := planetest.Recv(t, killed, "the attacker's request to be killed")
		assert.Equal(t, id, k.ID)
		select {
		case other := <-killed:
			t.Fatalf("try %d: the victim's request was killed too (key %s)", i, other.Key)
		case <-time.After(20 * time.Millisecond):
		}
		resume <- struct{}{} // the victim's engine goes on
		got := choice(t, vfirst)["text"].(string)
		var finish any
		for {
			ev, err := vev.next()
			require.NoError(t, err)
			if ev == "[DONE]" {
				break
			}
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(ev), &m))
			c := choice(t, m)
			got += c["text"].(string)
			finish = c["finish_reason"]
		}
		_ = victim.Body.Close()
		assert.Equal(t, text(2, n), got, "try %d: the victim's text is exact", i)
		assert.Equal(t, "length", finish)
		e.waitMetric(key(mCancellations, "m"), float64(i+1))
		e.waitMetric(key(mConfirmed, "m"), float64(i+1))
	}
	assert.Equal(t, float64(2*tries), e.metrics()[key(mRequests, "m")])
}

// openCtx opens a streaming completion under ctx.
func (e *env) openCtx(ctx context.Context, body string, hdr map[string]string) *http.Response {
	e.t.Helper()
	req := e.request(http.MethodPost, "/v1/completions", body, hdr).WithContext(ctx)
	resp, err := e.hc.Do(req)
	require.NoError(e.t, err)
	return resp
}

// TestInvalidRequestIDs: an id that is too long or not printable UTF-8 is
// refused with 400 invalid_request_id and reaches no worker.
func TestInvalidRequestIDs(t *testing.T) {
	e, w := one(t)
	for name, hdr := range map[string]string{
		"too long":        "x-request-id: " + strings.Repeat("a", plane.MaxIDLen+1),
		"not UTF-8":       "x-request-id: req-\xff\xfe",
		"control (tab)":   "x-request-id: a\tb",
		"control (DEL)":   "x-request-id: a\x7fb",
		"control (NUL)":   "x-request-id: a\x00b",
		"dynamo header":   "x-dynamo-request-id: bad\x01",
		"overlong UTF-8":  "x-request-id: \xc0\xaf",
		"lone surrogate":  "x-request-id: \xed\xa0\x80",
		"zero width only": "x-request-id: \u200b",
	} {
		t.Run(name, func(t *testing.T) {
			resp, body := rawRequest(t, e.fe.Addr(), hdr+"\r\n", completion("m", "hi", 2, false))
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "body %s", body)
			var m map[string]map[string]any
			if json.Unmarshal(body, &m) != nil {
				// net/http itself refuses most control characters in headers.
				assert.Contains(t, string(body), "Bad Request")
				return
			}
			assert.Equal(t, "invalid_request_id", m["error"]["code"])
			assert.Equal(t, "invalid_request_error", m["error"]["type"])
			assert.Contains(t, m["error"]["message"], ctxtree.IDRule, "the message states the one id rule")
		})
	}
	assert.Empty(t, w.Reqs, "an invalid id reached the worker")
	// The longest id, and any printable UTF-8, pass.
	for _, id := range []string{strings.Repeat("b", plane.MaxIDLen), "réq-ü-日本-🙂"} {
		r := e.post("/v1/completions", completion("m", "hi", 2, false), map[string]string{"x-request-id": id})
		require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
		assert.Equal(t, id, w.NextReq(t).ID)
	}
}

// rawRequest sends a completion request with extra header lines verbatim
// (net/http's client refuses control characters) and returns the response.
func rawRequest(t *testing.T, addr, headers, body string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, planetest.WaitLimit)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(planetest.WaitLimit)))
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: %d\r\n\r\n%s", headers, len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// rawPost sends a request over its own connection: headers, then a body of
// size bytes written by a goroutine (whose errors are ignored: the server
// may answer and close before it is all sent), and returns the response.
func rawPost(t *testing.T, addr string, size int64) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, planetest.WaitLimit)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(planetest.WaitLimit)))
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		chunk := []byte(`{"model":"m","prompt":"` + strings.Repeat("x", 64<<10-23))
		for sent := int64(0); sent < size; sent += int64(len(chunk)) {
			if _, err := conn.Write(chunk[:min(int64(len(chunk)), size-sent)]); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = conn.Close()
	<-done
	return resp, body
}

// heapAlloc is the Go heap in use after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestOversizedBody: a body over the limit gets 413 request_too_large, and
// neither it nor a few at once make the frontend hold more than the limit
// each (the 64 MiB bodies are never buffered).
func TestOversizedBody(t *testing.T) {
	e, w := one(t)
	before := heapAlloc()
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	resp, body := rawPost(t, e.fe.Addr(), 64<<20)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, "body %s", body)
	var m map[string]map[string]any
	require.NoError(t, json.Unmarshal(body, &m), "body %s", body)
	assert.Equal(t, "request_too_large", m["error"]["code"])
	for _, k := range []string{"message", "type", "param", "code"} {
		assert.Contains(t, m["error"], k)
	}
	// Four at once.
	done := make(chan int, 4)
	for i := 0; i < 4; i++ {
		go func() {
			resp, _ := rawPost(t, e.fe.Addr(), 64<<20)
			done <- resp.StatusCode
		}()
	}
	for i := 0; i < 4; i++ {
		assert.Equal(t, http.StatusRequestEntityTooLarge, planetest.Recv(t, done, "a 413"))
	}
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	// Five bodies of 64 MiB: allocation stays within a few times the 4 MiB
	// limit each (io.ReadAll grows its buffer by doubling; the test's own
	// client allocates a little too), far from 64 MiB each.
	allocated := ms1.TotalAlloc - ms0.TotalAlloc
	assert.Less(t, allocated, uint64(5*32<<20), "allocated %d MiB for five oversized bodies", allocated>>20)
	after := heapAlloc()
	assert.Less(t, int64(after)-int64(before), int64(8<<20), "heap grew from %d to %d", before, after)
	assert.Empty(t, w.Reqs)

	// The limit is configurable, and a body within it is served.
	e2 := newEnv(t)
	e2.worker("w", "dynamo", "m", 0, planetest.Tokens)
	e2.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxBodyBytes: 1024})
	e2.waitModels("m")
	r := e2.post("/v1/completions", completion("m", strings.Repeat("y", 2000), 2, false), nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	r = e2.post("/v1/completions", completion("m", strings.Repeat("y", 500), 2, false), nil)
	assert.Equal(t, http.StatusOK, r.status, "body %s", r.body)
}

// TestContextLength: max_tokens and the prompt are bounded by the model's
// context length, the smallest its workers declare (max_model_len), else
// the frontend's default.
func TestContextLength(t *testing.T) {
	e := newEnv(t)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "small", MaxModelLen: 100}, planetest.Tokens)
	e.worker("d", "dynamo", "m", 0, planetest.Tokens) // declares nothing: the default
	e.start()
	e.waitModels("m", "small")
	exceeded := func(body string) {
		t.Helper()
		path := "/v1/completions"
		if strings.Contains(body, `"messages"`) {
			path = "/v1/chat/completions"
		}
		r := e.post(path, body, nil)
		require.Equal(t, http.StatusBadRequest, r.status, "body %s", r.body)
		errObj := r.json(t)["error"].(map[string]any)
		assert.Equal(t, "context_length_exceeded", errObj["code"])
		assert.Equal(t, "max_tokens", errObj["param"])
	}
	exceeded(`{"model":"m","prompt":"hi","max_tokens":1000000000000}`)
	exceeded(completion("m", "hi", frontend.DefaultMaxModelLen-1, false))
	exceeded(completion("m", strings.Repeat("p", frontend.DefaultMaxModelLen+1), 1, false))
	exceeded(completion("small", "hi", 99, false))
	exceeded(chat("small", strings.Repeat("c", 200), 1, true))
	// At the limit: 2 prompt tokens + 98 = 100.
	r := e.post("/v1/completions", completion("small", "hi", 98, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %s", r.body)
	assert.Equal(t, 98, parseReq(t, w.NextReq(t)).StopConditions.MaxTokens)
}

// TestSlowClientsDropped: a client that never finishes its headers, or its
// body, is disconnected by the deadlines.
func TestSlowClientsDropped(t *testing.T) {
	e2 := newEnv(t)
	e2.worker("w", "dynamo", "m", 0, planetest.Tokens)
	e2.startWith(frontend.Options{
		Addr: "127.0.0.1:0", MigrationLimit: -1,
		ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 400 * time.Millisecond,
	})
	e2.waitModels("m")
	closedBy := func(partial string) time.Duration {
		t.Helper()
		conn, err := net.DialTimeout("tcp", e2.fe.Addr(), planetest.WaitLimit)
		require.NoError(t, err)
		defer conn.Close()
		start := time.Now()
		_, err = io.WriteString(conn, partial)
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(planetest.WaitLimit)))
		_, _ = io.Copy(io.Discard, conn) // until the server closes (or answers and closes)
		require.Less(t, time.Since(start), planetest.WaitLimit-time.Second, "the connection was not dropped")
		return time.Since(start)
	}
	assert.GreaterOrEqual(t, closedBy("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"), 150*time.Millisecond)
	assert.GreaterOrEqual(t, closedBy("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo"), 300*time.Millisecond)
	// A stream that lasts longer than the read timeout is not cut.
	slow := newEnv(t)
	slow.worker("w", "dynamo", "m", 0, func(w *planetest.Worker, req *plane.Request) {
		for i := 0; i < 4; i++ {
			time.Sleep(250 * time.Millisecond)
			if !w.SendTokens(req, i, 1, map[bool]string{true: "length"}[i == 3]) {
				return
			}
		}
	})
	slow.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, ReadTimeout: 300 * time.Millisecond})
	slow.waitModels("m")
	resp := slow.open("/v1/completions", completion("m", "hi", 4, true), nil)
	ev := newEvents(resp)
	for i := 0; i < 4; i++ {
		ev.chunk(t)
	}
	ev.done(t)
	_ = resp.Body.Close()
	assert.Zero(t, slow.metrics()[key(mCancellations, "m")])
}

// TestForgedAbortConfirmations: a process on the bus (authenticated with the
// embedded server's token) publishes confirmations for a live, disconnected
// request: with the client's id, a wrong key, the right key from a wrong
// instance. None is counted; the serving worker's own confirmation is.
func TestForgedAbortConfirmations(t *testing.T) {
	d := newDisconnectEnv(t, 1)
	opts, err := natsbus.ClientAuth(d.host.Bus().URL())
	require.NoError(t, err)
	nc, err := nats.Connect(d.host.Bus().URL(), opts...)
	require.NoError(t, err)
	defer nc.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req := d.request(http.MethodPost, "/v1/completions", completion("m", "hi", 5, true),
		map[string]string{"x-request-id": "victim"}).WithContext(ctx)
	resp, err := d.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	live := planetest.Recv(t, d.got, "the request at the worker")
	cancel()
	h := planetest.Recv(t, d.killed, "the request to be killed")
	require.Equal(t, ctxtree.ReasonClientDisconnected, h.reason)
	d.waitMetric(key(mCancellations, "m"), 1)

	instance := d.w.EP.InstanceID()
	forged := []plane.AbortConfirmation{
		{ID: "victim", Path: "dynamo.backend.generate", Instance: instance, Reason: "kill"},
		{ID: "victim", Key: plane.NewKey(), Path: "dynamo.backend.generate", Instance: instance},
		{ID: "victim", Key: live.Key, Path: "dynamo.backend.generate", Instance: instance + 1},
		{ID: "victim", Key: live.Key, Path: "dynamo.backend.generate"},
	}
	for _, a := range forged {
		b, _ := json.Marshal(a)
		require.NoError(t, nc.Publish(plane.AbortedSubject, b))
	}
	for _, junk := range []string{"", "null", "{", `{"key": 5}`, strings.Repeat("[", 10000)} {
		require.NoError(t, nc.Publish(plane.AbortedSubject, []byte(junk)))
	}
	require.NoError(t, nc.Flush())
	// Give the frontend's subscription time to see them.
	time.Sleep(200 * time.Millisecond)
	assert.Zero(t, d.metrics()[key(mConfirmed, "m")], "a forged confirmation was counted")

	close(d.release) // the real handler returns: the real confirmation
	d.waitMetric(key(mConfirmed, "m"), 1)
	// A replay of the real one after it was counted counts nothing more.
	b, _ := json.Marshal(plane.AbortConfirmation{ID: "victim", Key: live.Key, Path: "dynamo.backend.generate", Instance: instance})
	require.NoError(t, nc.Publish(plane.AbortedSubject, b))
	require.NoError(t, nc.Flush())
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, 1.0, d.metrics()[key(mConfirmed, "m")])
}

// TestLongPromptPastBusLimit: a prompt whose token ids are larger than the
// NATS server's maximum payload reaches the worker (it fetches the request
// from the frontend): with the body limit raised to fit it, the body limit
// is the one a client meets (here with a context length raised past it).
func TestLongPromptPastBusLimit(t *testing.T) {
	e := newEnv(t)
	e.slow = true
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxModelLen: 1 << 30}, planetest.Tokens)
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxBodyBytes: 32 << 20})
	e.waitModels("m")
	max := int(e.host.Bus().Conn().MaxPayload())
	prompt := strings.Repeat("z", max/3) // ~4 JSON bytes per token id
	r := e.post("/v1/completions", completion("m", prompt, 1, false), nil)
	require.Equal(t, http.StatusOK, r.status, "body %.300s", r.body)
	req := planetest.Recv(t, w.Reqs, "the long prompt")
	assert.Greater(t, len(req.Payload), max, "the worker's request is larger than the bus carries")
	var tr tokenRequest
	require.NoError(t, json.Unmarshal(req.Payload, &tr))
	assert.Equal(t, max/3, len(tr.TokenIDs))
	// Past the body limit: 413 from it, the worker untouched.
	r = e.post("/v1/completions", completion("m", strings.Repeat("z", 32<<20), 1, false), nil)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	assert.Empty(t, w.Reqs)
}

// TestStalledWriteIsDisconnect: a streaming client that stops reading (its
// connection stays open) is treated as gone once a write has made no
// progress for the stall timeout: the request is killed with
// client_disconnected and counted.
func TestStalledWriteIsDisconnect(t *testing.T) {
	e := newEnv(t)
	killed := make(chan ctxtree.Reason, 1)
	e.worker("w", "dynamo", "m", 0, func(w *planetest.Worker, req *plane.Request) {
		// Large items, sent until killed: the client's socket buffers fill.
		item := []byte(`{"token_ids":[` + strings.Repeat("7,", 4096) + `7],"finish_reason":null}`)
		for {
			err := req.Send(item)
			if errors.Is(err, plane.ErrFull) {
				f, ch := planetest.Armed()
				req.Arm(f)
				select {
				case <-ch:
				case <-req.Ctx.Killed():
				case <-w.Quit:
					return
				}
			}
			if req.Ctx.IsKilled() {
				killed <- req.Ctx.Reason()
				return
			}
		}
	})
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, WriteStallTimeout: 1500 * time.Millisecond})
	e.waitModels("m")
	conn, err := net.DialTimeout("tcp", e.fe.Addr(), planetest.WaitLimit)
	require.NoError(t, err)
	defer conn.Close()
	body := completion("m", "hi", 1000, true)
	_, err = fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	// Read nothing more: the frontend's writes stall.
	select {
	case reason := <-killed:
		assert.Equal(t, ctxtree.ReasonClientDisconnected, reason)
	case <-time.After(3 * planetest.WaitLimit):
		t.Fatal("a client that stopped reading was never treated as gone")
	}
	e.waitMetric(key(mCancellations, "m"), 1)
}

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
