package frontend_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

const (
	mQueued   = "dynamo_ctx_frontend_queued_requests"
	mInflight = "dynamo_ctx_frontend_inflight_requests"
)

// full starts a frontend that queues up to queued requests and one worker
// of model "m" with capacity places that holds every request until it is
// killed; the requests arrive on the returned channel.
func full(t *testing.T, capacity, queued int) (*env, chan *plane.Request) {
	t.Helper()
	e := newEnv(t)
	got := make(chan *plane.Request, 64)
	e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: capacity}, planetest.Hold(got))
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: queued})
	e.waitModels("m")
	return e, got
}

// send posts a held completion with request id id; cancel makes its client
// go away.
func (e *env) send(id string) (done <-chan response, cancel func()) {
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	out := make(chan response, 1)
	req := e.request(http.MethodPost, "/v1/completions", completion("m", "hi", 5, false), map[string]string{"x-request-id": id}).WithContext(ctx)
	go func() {
		resp, err := e.hc.Do(req)
		if err != nil {
			out <- response{status: -1, body: []byte(err.Error())}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, rerr := resp.Body.Read(buf)
			b.WriteString(string(buf[:n]))
			if rerr != nil {
				break
			}
		}
		out <- response{status: resp.StatusCode, header: resp.Header, body: []byte(b.String())}
	}()
	return out, cancel
}

// Full workers: requests wait in the queue (first come first served) up to
// its bound, then are answered 503 overloaded with Retry-After at once; a
// place that frees goes to the first in line.
func TestOverloadQueuesThenRejects(t *testing.T) {
	e, got := full(t, 2, 2)
	_, cancelA := e.send("a")
	_, cancelB := e.send("b")
	first := []string{planetest.Recv(t, got, "a or b").ID, planetest.Recv(t, got, "a or b").ID}
	assert.ElementsMatch(t, []string{"a", "b"}, first)
	e.waitMetric(key(mInflight, "m"), 2)

	doneC, _ := e.send("c")
	e.waitMetric(key(mQueued, "m"), 1)
	doneD, _ := e.send("d")
	e.waitMetric(key(mQueued, "m"), 2)

	start := time.Now()
	r := e.post("/v1/completions", completion("m", "hi", 5, false), map[string]string{"x-request-id": "e"})
	assert.Less(t, time.Since(start), 5*time.Second, "at once")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"overloaded"`)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	select {
	case req := <-got:
		t.Fatalf("request %q reached the worker while every place was taken", req.ID)
	case <-time.After(100 * time.Millisecond):
	}

	cancelA() // its place goes to c, the first in line
	assert.Equal(t, "c", planetest.Recv(t, got, "the first queued request").ID)
	cancelB()
	assert.Equal(t, "d", planetest.Recv(t, got, "the second queued request").ID)
	e.waitMetric(key(mQueued, "m"), 0)
	for _, d := range []<-chan response{doneC, doneD} {
		select {
		case r := <-d:
			t.Fatalf("a held request answered: %d %s", r.status, r.body)
		default:
		}
	}
	e.waitMetric(outcomeKey("m", "rejected"), 1)
}

// A queued request whose client leaves, or whose deadline passes, leaves
// the queue and never reaches a worker.
func TestQueuedRequestLeavesOnDisconnectAndDeadline(t *testing.T) {
	e, got := full(t, 1, 8)
	_, cancelA := e.send("a")
	planetest.Recv(t, got, "a")

	_, cancelGone := e.send("gone")
	e.waitMetric(key(mQueued, "m"), 1)
	cancelGone()
	e.waitMetric(key(mQueued, "m"), 0)
	e.waitMetric(outcomeKey("m", "cancelled"), 1)

	start := time.Now()
	r := e.post("/v1/completions", completion("m", "hi", 5, false), map[string]string{"x-request-id": "late", "x-request-timeout": "0.3"})
	assert.Equal(t, http.StatusGatewayTimeout, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"deadline_exceeded"`)
	assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	e.waitMetric(outcomeKey("m", "deadline"), 1)

	doneNext, _ := e.send("next")
	e.waitMetric(key(mQueued, "m"), 1)
	cancelA()
	assert.Equal(t, "next", planetest.Recv(t, got, "the request queued after them").ID, "gone and late never reached the worker")
	select {
	case r := <-doneNext:
		t.Fatalf("answered: %d %s", r.status, r.body)
	default:
	}
}

// Without a queue, a request that finds every place taken is refused at
// once.
func TestNoQueueRejectsAtOnce(t *testing.T) {
	e, got := full(t, 1, -1)
	e.send("a")
	planetest.Recv(t, got, "a")
	r := e.post("/v1/completions", completion("m", "hi", 5, false), nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"overloaded"`)
}

// Requests go to the instance with the most free places: with 1 and 3,
// four requests fill both.
func TestRoutesToTheMostFreeCapacity(t *testing.T) {
	e := newEnv(t)
	gotSmall, gotBig := make(chan *plane.Request, 8), make(chan *plane.Request, 8)
	e.workerMeta("small", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 1}, planetest.Hold(gotSmall))
	e.workerMeta("big", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 3}, planetest.Hold(gotBig))
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: 4})
	require.Eventually(t, func() bool {
		r := e.do(http.MethodGet, "/health", "", nil)
		return strings.Contains(string(r.body), `"instances":2`)
	}, planetest.WaitLimit, 10*time.Millisecond)
	e.waitModels("m")
	for i := 0; i < 4; i++ {
		e.send("r" + string(rune('0'+i)))
		e.waitMetric(key(mInflight, "m"), float64(i+1))
	}
	require.Eventually(t, func() bool { return len(gotSmall) == 1 && len(gotBig) == 3 }, planetest.WaitLimit, 5*time.Millisecond,
		"small %d, big %d", len(gotSmall), len(gotBig))
	e.send("queued")
	e.waitMetric(key(mQueued, "m"), 1)
}

// A drain that gives up answers the queued requests 503 shutdown.
func TestDrainEndsTheQueue(t *testing.T) {
	e, got := full(t, 1, 8)
	e.send("a")
	planetest.Recv(t, got, "a")
	done, _ := e.send("queued")
	e.waitMetric(key(mQueued, "m"), 1)
	require.NoError(t, e.fe.Drain(100*time.Millisecond))
	r := planetest.Recv(t, done, "the queued request's answer")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"shutdown"`)
}

// hiccup registers an instance of model m with capacity places that does
// not acknowledge its first request (a hiccup: a GC pause, a slow
// network) and serves every later one as a healthy engine (two tokens).
func (e *env) hiccup(capacity int) (id uint64, served *atomic.Int64) {
	t := e.t
	served = new(atomic.Int64)
	var first atomic.Bool
	hand := planetest.NewHandConns(t)
	meta := cardJSON(e.t, modelcard.Card{Model: "m", MaxNumSeqs: capacity})
	id = planetest.HandInstance(t, e.host, "dynamo.backend.generate", meta, func(m *nats.Msg) {
		if first.CompareAndSwap(false, true) {
			return // not acknowledged
		}
		_ = m.Respond([]byte(`{}`))
		_, w, ok := hand.DialBack(m)
		if !ok {
			return
		}
		_ = w.WriteData(planetest.TokenItem(0, ""))
		_ = w.WriteData(planetest.TokenItem(1, "length"))
		_ = w.WriteFinal()
		_ = w.Flush()
		served.Add(1)
	})
	return id, served
}

// A (2 places) did not acknowledge one request, so it is avoided for a few
// seconds; B (1 place) holds a long request. A new request goes to A rather
// than waiting or being refused: a suspicion is no reason to refuse.
func TestAdmissionUsesASuspectWithRoom(t *testing.T) {
	e := newEnv(t)
	gotB := make(chan *plane.Request, 8)
	e.workerMeta("b", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 1}, planetest.Hold(gotB))
	_, served := e.hiccup(2)
	e.startWith(queueOf(1))
	e.waitModels("m")
	require.Eventually(t, func() bool {
		r := e.do(http.MethodGet, "/health", "", nil)
		return r.json(t)["instances"] == float64(2)
	}, 5*time.Second, 10*time.Millisecond)

	// r1 goes to A (most free), is not acknowledged, is resent to B and held.
	e.send("r1")
	planetest.Recv(t, gotB, "r1 at B")
	for _, id := range []string{"r2", "r3"} {
		r := e.post("/v1/completions", completion("m", "hi", 5, false), map[string]string{"x-request-id": id})
		assert.Equal(t, http.StatusOK, r.status, "%s: %s", id, r.body)
	}
	// The hand-played worker counts after its Final is flushed: the
	// client may have its answer first.
	assert.Eventually(t, func() bool { return served.Load() == 2 }, 5*time.Second, time.Millisecond, "A served both")
}

func queueOf(queued int) frontend.Options {
	return frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: queued}
}

// Once a drain has given up (in-flight requests killed with reason
// shutdown, the queue answered 503 shutdown), a request that reaches
// admission afterwards (its body was still arriving) starts nothing, though
// the kill freed a place.
func TestRequestAfterTheDrainGaveUpStartsNothing(t *testing.T) {
	e, got := full(t, 1, 8)
	_, _ = e.send("a")
	a := planetest.Recv(t, got, "a")
	doneQ, _ := e.send("queued")
	e.waitMetric(key(mQueued, "m"), 1)

	// A request whose body is still arriving when the drain starts.
	body := completion("m", "hi", 5, false)
	c, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	require.NoError(t, err)
	defer c.Close()
	raw := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-request-id: late\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:5])
	_, err = io.WriteString(c, raw)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)

	drained := make(chan error, 1)
	go func() { drained <- e.fe.Drain(200 * time.Millisecond) }()
	require.True(t, planetest.ClosedWithin(a.Ctx.Killed()), "the drain gave up and killed a")
	r := planetest.Recv(t, doneQ, "the queued request's answer")
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)

	_, err = io.WriteString(c, body[5:]) // the rest of the late request
	require.NoError(t, err)
	select {
	case req := <-got:
		t.Errorf("request %q reached a worker after the drain gave up (killed everything, emptied the queue)", req.ID)
	case <-time.After(500 * time.Millisecond):
	}
	<-drained
}

// Many requests at once on few places, with migration, resends (an
// instance that never acknowledges), n > 1, clients leaving and deadlines
// passing at random moments: nothing stays counted or queued, and the
// outcomes add up to the requests taken.
func TestAdmissionChurnWithMigrationAndResends(t *testing.T) {
	e := newEnv(t)
	e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 3, MigrationLimit: 2}, func(w *planetest.Worker, req *plane.Request) {
		select {
		case <-time.After(time.Duration(1+len(req.ID)%5) * time.Millisecond):
			planetest.Tokens(w, req)
		case <-req.Ctx.Killed():
		}
	})
	planetest.BlackHole(t, e.host, "dynamo.backend.generate", cardJSON(t, modelcard.Card{Model: "m", MigrationLimit: 2, MaxNumSeqs: 2})) // never acknowledges
	e.startWith(queueOf(20))
	e.waitModels("m")
	var wg sync.WaitGroup
	for i := 0; i < 120; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			hdr := map[string]string{"x-request-id": fmt.Sprintf("churn-%d", i)}
			switch i % 3 {
			case 1:
				time.AfterFunc(time.Duration(i%50)*time.Millisecond, cancel)
			case 2:
				hdr["x-request-timeout"] = fmt.Sprintf("0.%02d", 1+i%60)
			}
			body := fmt.Sprintf(`{"model":"m","prompt":"hi","max_tokens":3,"n":%d,"stream":%v}`, 1+i%3, i%2 == 0)
			req := e.request(http.MethodPost, "/v1/completions", body, hdr).WithContext(ctx)
			if resp, err := e.hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	e.waitMetric(key(mQueued, "m"), 0)
	e.waitMetric(key(mInflight, "m"), 0)
	require.Eventually(t, func() bool {
		m := e.metrics()
		sum := 0.0
		for _, o := range []string{"completed", "stopped", "cancelled", "deadline", "failed", "rejected"} {
			sum += m[outcomeKey("m", o)]
		}
		// Requests whose client left before its body was read were never taken.
		return sum == m[key(mRequests, "m")] && sum >= 60
	}, planetest.WaitLimit, 10*time.Millisecond, "outcomes add up: %v", e.metrics())
}

// The model's last worker drains (scale-down, a deploy without a
// replacement): a queued request is answered as a new one is (404), not
// left waiting with no end.
func TestQueuedRequestEndsWhenTheModelHasNoInstanceLeft(t *testing.T) {
	e := newEnv(t)
	got := make(chan *plane.Request, 8)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 1}, planetest.Hold(got))
	e.startWith(queueOf(8))
	e.waitModels("m")
	_, cancelA := e.send("a")
	planetest.Recv(t, got, "a")
	doneQ, _ := e.send("queued")
	e.waitMetric(key(mQueued, "m"), 1)

	w.EP.Drain() // out of discovery; a runs on
	require.Eventually(t, func() bool {
		return e.post("/v1/completions", completion("m", "hi", 5, false), nil).status == http.StatusNotFound
	}, planetest.WaitLimit, 20*time.Millisecond, "the model is gone for new requests")
	cancelA() // a ends: its place is free, but on no instance
	r := planetest.Recv(t, doneQ, "the queued request's answer")
	assert.Equal(t, http.StatusNotFound, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"model_not_found"`)
}

// Two frontends in front of one worker share its capacity: the worker's
// own count is the authority. With 2 places, one request through each fills
// it; a third through either is never run past the capacity: it waits in
// its frontend's queue (learnt from the worker's load report or its busy
// refusal), or is answered 503 overloaded where that queue is full, and it
// runs once a place frees.
func TestFrontendsShareTheWorkersCapacity(t *testing.T) {
	e, got := full(t, 2, -1) // a: no queue
	b := &env{t: t, host: planetest.Join(t, e.host)}
	b.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: 4})
	b.waitModels("m")

	_, cancelA1 := e.send("a1")
	planetest.Recv(t, got, "a1")
	_, cancelB1 := b.send("b1")
	planetest.Recv(t, got, "b1")

	doneB2, _ := b.send("b2")
	b.waitMetric(key(mQueued, "m"), 1)
	r := e.post("/v1/completions", completion("m", "hi", 5, false), map[string]string{"x-request-id": "a2"})
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), `"code":"overloaded"`)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	select {
	case req := <-got:
		t.Fatalf("request %q reached the worker past its capacity", req.ID)
	case <-time.After(100 * time.Millisecond):
	}

	cancelA1() // a place frees on the worker: b's queue hears of it
	assert.Equal(t, "b2", planetest.Recv(t, got, "the request queued at the other frontend").ID)
	b.waitMetric(key(mQueued, "m"), 0)
	select {
	case r := <-doneB2:
		t.Fatalf("answered: %d %s", r.status, r.body)
	default:
	}
	cancelB1()
	e.waitMetric(outcomeKey("m", "rejected"), 1)
}

// A frontend that believes a place free (it came after the worker's last
// load report) sends there; the worker refuses it as busy; the request goes
// back to the frontend's queue, or, streaming or not, is answered 503
// overloaded before anything else is written when the queue is full.
func TestBusyRefusalQueuesOrOverloads(t *testing.T) {
	e := newEnv(t)
	got := make(chan *plane.Request, 8)
	w := e.workerMeta("w", "dynamo", modelcard.Card{Model: "m", MaxNumSeqs: 1}, planetest.Hold(got))
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: 4})
	e.waitModels("m")
	_, cancelA := e.send("a")
	planetest.Recv(t, got, "a") // its one load report is out before: the next frontend hears none

	b := &env{t: t, host: planetest.Join(t, e.host)}
	b.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1, MaxQueuedRequests: 1})
	b.waitModels("m")
	doneB, _ := b.send("b")
	b.waitMetric(key(mQueued, "m"), 1)
	_, refused, _ := w.EP.Load()
	assert.Equal(t, uint64(1), refused, "b was sent, and refused as busy")
	assert.Equal(t, 1.0, b.metrics()[key("dynamo_ctx_frontend_busy_requeues_total", "m")], "and queued again")

	resp := b.open("/v1/completions", completion("m", "hi", 5, true), map[string]string{"x-request-id": "c"})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `"code":"overloaded"`)

	cancelA()
	assert.Equal(t, "b", planetest.Recv(t, got, "the refused request, once a place freed").ID)
	select {
	case r := <-doneB:
		t.Fatalf("answered: %d %s", r.status, r.body)
	default:
	}
	b.waitMetric(outcomeKey("m", "rejected"), 1)
	b.waitMetric(key(mQueued, "m"), 0)
}
