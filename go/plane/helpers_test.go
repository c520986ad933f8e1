package plane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// waitLimit bounds every wait of the tests, so that a bug shows up as a
// failure rather than a hung test binary. Nothing is expected to take more
// than a fraction of it.
const waitLimit = 10 * time.Second

var errTimeout = errors.New("timed out waiting for an Arm to fire")

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// armed returns a one-shot, non-blocking function to hand to an Arm, and the
// channel it signals: the way a host that cannot block (the Python
// dispatcher's event loop) waits for progress.
func armed() (func(), <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

// waitArm arms with arm and waits until the function fires.
func waitArm(arm func(func())) error {
	f, ch := armed()
	arm(f)
	select {
	case <-ch:
		return nil
	case <-time.After(waitLimit):
		return errTimeout
	}
}

// --- runtimes ---------------------------------------------------------------

type rtOption func(*plane.Options)

// shortLeases makes instance leases expire quickly, for the tests about expiry.
func shortLeases(o *plane.Options) {
	o.Heartbeat = 50 * time.Millisecond
	o.TTL = 300 * time.Millisecond
}

// startEmbedded creates the first runtime of a test: it hosts an embedded
// NATS server on an ephemeral port. For a *testing.T it also registers,
// first (so it runs last), a check that no goroutine outlives the test.
func startEmbedded(tb testing.TB, opts ...rtOption) *plane.Runtime {
	tb.Helper()
	if t, ok := tb.(*testing.T); ok {
		t.Cleanup(func() { goleak.VerifyNone(t) })
	}
	return start(tb, "nats://127.0.0.1:0", opts...)
}

// join creates another runtime on the NATS server of host. Runtimes are
// closed in reverse order of creation, so the host closes last.
func join(tb testing.TB, host *plane.Runtime, opts ...rtOption) *plane.Runtime {
	tb.Helper()
	return start(tb, host.Bus().URL(), opts...)
}

func start(tb testing.TB, url string, opts ...rtOption) *plane.Runtime {
	tb.Helper()
	o := plane.Options{NATS: natsbus.Options{URL: url, Logger: quiet}}
	for _, f := range opts {
		f(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	rt, err := plane.New(ctx, o)
	require.NoError(tb, err)
	tb.Cleanup(rt.Close)
	return rt
}

// --- the worker's handler loop ----------------------------------------------

// handler serves one request; it runs on its own goroutine, like one
// handler task of the Python dispatcher.
type handler func(req *plane.Request)

// worker is a small version of the Python dispatcher: a loop that Accepts
// requests (waiting with Endpoint.Arm, never sleeping) and runs a handler per
// request.
type worker struct {
	ep *plane.Endpoint
	wg sync.WaitGroup
}

// serve serves path on rt with h. At cleanup the endpoint is closed (which
// kills the requests still served) and every handler must have returned.
func serve(tb testing.TB, rt *plane.Runtime, path string, h handler) *worker {
	tb.Helper()
	ep, err := rt.Serve(path, nil)
	require.NoError(tb, err)
	w := &worker{ep: ep}
	w.wg.Add(1)
	go w.loop(h)
	tb.Cleanup(func() {
		ep.Close()
		done := make(chan struct{})
		go func() { w.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitLimit):
			tb.Errorf("handlers of %s did not return after the endpoint closed", path)
		}
	})
	return w
}

func (w *worker) loop(h handler) {
	defer w.wg.Done()
	for {
		req, err := w.ep.Next(context.Background())
		if err != nil { // ErrClosed
			return
		}
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			// Like the dispatcher, end every request when its handler
			// returns (a no-op after Complete or Fail): that is also
			// what confirms the abort of a killed request.
			defer req.Complete()
			h(req)
		}()
	}
}

// send queues item, waiting with Request.Arm while the buffer is full. It
// reports false once the request is killed: the handler must return then
// (the dispatcher closes a killed handler's generator).
func send(req *plane.Request, item []byte) bool {
	for {
		err := req.Send(item)
		switch {
		case err == nil:
			return !req.Ctx.IsKilled()
		case errors.Is(err, plane.ErrFull):
			f, ch := armed()
			req.Arm(f)
			select {
			case <-ch:
			case <-req.Ctx.Killed():
				return false
			}
		default:
			return false
		}
	}
}

// --- the caller's side ------------------------------------------------------

func newClient(tb testing.TB, rt *plane.Runtime, path string) *plane.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := rt.Client(ctx, path)
	require.NoError(tb, err)
	tb.Cleanup(c.Close)
	return c
}

// waitInstances waits until c knows at least n instances.
func waitInstances(tb testing.TB, c *plane.Client, n int) []uint64 {
	tb.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		require.NoError(tb, waitArm(c.ArmInstances))
		if ids := c.InstanceIDs(); len(ids) >= n {
			return ids
		}
		if time.Now().After(deadline) {
			tb.Fatalf("client of %s knows %d instances, want %d", c.Path(), len(c.InstanceIDs()), n)
		}
		time.Sleep(5 * time.Millisecond) // ArmInstances fires at once while one is known
	}
}

func generate(tb testing.TB, c *plane.Client, payload string, parent *ctxtree.Context) *plane.Stream {
	tb.Helper()
	return generateRoute(tb, c, payload, parent, plane.RoundRobin, 0)
}

func generateRoute(tb testing.TB, c *plane.Client, payload string, parent *ctxtree.Context, route plane.Route, instance uint64) *plane.Stream {
	tb.Helper()
	s, err := c.Generate([]byte(payload), parent, route, instance)
	require.NoError(tb, err)
	return s
}

// waitStarted waits until the request reached a worker or failed.
func waitStarted(s *plane.Stream) error {
	for {
		err := s.Started()
		if !errors.Is(err, plane.ErrAgain) {
			return err
		}
		if err := waitArm(s.Arm); err != nil {
			return err
		}
	}
}

// take takes until it has n items (or the stream ends).
func take(s *plane.Stream, n int) ([][]byte, error) {
	if err := waitStarted(s); errors.Is(err, errTimeout) {
		return nil, err
	}
	var items [][]byte
	for len(items) < n {
		b, err := s.Take(n - len(items))
		switch {
		case err == nil:
			items = append(items, b...)
		case errors.Is(err, plane.ErrAgain):
			if err := waitArm(s.Arm); err != nil {
				return items, err
			}
		default:
			return items, err
		}
	}
	return items, nil
}

// drain takes items, at most max per Take, until the stream's terminal error
// (io.EOF for a normal end), the way the Python stream iterates.
func drain(s *plane.Stream, max int) (items [][]byte, batches []int, err error) {
	if err := waitStarted(s); errors.Is(err, errTimeout) {
		return nil, nil, err
	}
	for {
		b, err := s.Take(max)
		switch {
		case err == nil:
			items = append(items, b...)
			batches = append(batches, len(b))
		case errors.Is(err, plane.ErrAgain):
			if err := waitArm(s.Arm); err != nil {
				return items, batches, err
			}
		default:
			return items, batches, err
		}
	}
}

// --- items ------------------------------------------------------------------

func num(i int) []byte { return strconv.AppendInt(nil, int64(i), 10) }

// requireSeq checks that items are the JSON numbers from, from+1, ... in order.
func requireSeq(tb testing.TB, items [][]byte, from, n int) {
	tb.Helper()
	require.Len(tb, items, n)
	for k, it := range items {
		v, err := strconv.Atoi(string(it))
		require.NoError(tb, err, "item %d: %q", k, it)
		if v != from+k {
			tb.Fatalf("item %d is %d, want %d (order or loss)", k, v, from+k)
		}
	}
}

// recv receives from ch or fails the test after waitLimit.
func recv[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		tb.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func closedWithin(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(waitLimit):
		return false
	}
}

// goroutineGone reports whether no goroutine has fn in its stack within d.
func goroutineGone(fn string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte(fn)) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// flood is a handler that produces total items as fast as the request's
// buffer lets it, counting what it managed to queue.
type flood struct {
	total int
	sent  atomic.Int64 // items Send accepted
	full  atomic.Int64 // times Send reported ErrFull
	reqs  chan *plane.Request
}

func newFlood(total int) *flood {
	return &flood{total: total, reqs: make(chan *plane.Request, 1)}
}

func (f *flood) handle(req *plane.Request) {
	f.reqs <- req
	for i := 0; i < f.total; {
		if req.Ctx.IsKilled() {
			return
		}
		err := req.Send(num(i))
		switch {
		case err == nil:
			f.sent.Add(1)
			i++
		case errors.Is(err, plane.ErrFull):
			f.full.Add(1)
			g, ch := armed()
			req.Arm(g)
			select {
			case <-ch:
			case <-req.Ctx.Killed():
				return
			}
		default:
			return
		}
	}
	req.Complete()
}

// waitBlocked waits until the producer hit a full buffer and has made no
// progress for a while (its Arm is pending because nobody reads).
func (f *flood) waitBlocked(tb testing.TB) int64 {
	tb.Helper()
	deadline := time.Now().Add(waitLimit)
	last, still := int64(-1), 0
	for still < 4 {
		if time.Now().After(deadline) {
			tb.Fatalf("producer never blocked: sent %d, ErrFull %d", f.sent.Load(), f.full.Load())
		}
		time.Sleep(50 * time.Millisecond)
		n := f.sent.Load()
		if n == last && f.full.Load() > 0 {
			still++
		} else {
			still, last = 0, n
		}
	}
	return last
}
