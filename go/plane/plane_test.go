package plane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ctxState is a snapshot of a request context, taken by a handler.
type ctxState struct {
	stopped, killed bool
	reason          ctxtree.Reason
}

func snapshot(c *ctxtree.Context) ctxState {
	return ctxState{stopped: c.IsStopped(), killed: c.IsKilled(), reason: c.Reason()}
}

// countHandler sends the number of items asked for in {"n": N}, 0..N-1,
// then completes.
func countHandler(w *planetest.Worker, req *plane.Request) {
	var p struct {
		N int `json:"n"`
	}
	if err := json.Unmarshal(req.Payload, &p); err != nil {
		req.Fail(fmt.Sprintf("ValueError: %v", err))
		return
	}
	for i := 0; i < p.N; i++ {
		if !w.Send(req, num(i)) {
			return
		}
	}
	req.Complete()
}

func TestRoundTripManyItemsInOrder(t *testing.T) {
	const path, n, maxTake = "test.roundtrip.generate", 12000, 100
	_, _, c := planetest.ServeAndConnect(t, path, countHandler)

	s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
	items, batches, err := planetest.Drain(s, maxTake)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, n)

	largest := 0
	for _, b := range batches {
		require.LessOrEqual(t, b, maxTake, "Take returned more than asked for")
		require.Positive(t, b)
		largest = max(largest, b)
	}
	assert.Greater(t, largest, 1, "Take never batched (%d Takes for %d items)", len(batches), n)
	assert.Less(t, len(batches), n, "one Take per item: no batching")

	// The end is sticky and the stream reports itself finished.
	assert.True(t, s.Finished())
	_, err = s.Take(10)
	assert.Equal(t, io.EOF, err)
	assert.NoError(t, s.Started())
	// The request's context was neither stopped nor killed by a normal end.
	assert.False(t, s.Context().IsStopped())
}

func TestTakeHonoursMax(t *testing.T) {
	const path, n = "test.take.generate", 300
	_, _, c := planetest.ServeOnHost(t, path, countHandler)

	for _, max := range []int{1, 7} {
		s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
		items, batches, err := planetest.Drain(s, max)
		require.Equal(t, io.EOF, err)
		requireSeq(t, items, 0, n)
		for _, b := range batches {
			require.LessOrEqual(t, b, max)
		}
	}
	// max <= 0 means "as many as allowed".
	s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), nil)
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, n)
}

// idHandler hands its request to the test and completes.
func idHandler(got chan<- *plane.Request) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		got <- req
		req.Complete()
	}
}

func TestRequestIDRelayedFromParent(t *testing.T) {
	const path = "test.id.generate"
	got := make(chan *plane.Request, 1)
	release := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		got <- req
		<-release // the request stays in flight until the link is checked
		req.Complete()
	})

	parent := ctxtree.New("req-42")
	s := planetest.Generate(t, c, `{"prompt":"hi"}`, parent)
	// The request's context is a new child of the parent, with its id,
	// linked before Generate returned.
	assert.NotSame(t, parent, s.Context())
	assert.Equal(t, "req-42", s.Context().ID())
	assert.Equal(t, 1, parent.NumChildren())

	req := planetest.Recv(t, got, "the request")
	assert.Equal(t, "req-42", req.ID)
	assert.Equal(t, "req-42", req.Ctx.ID())
	assert.JSONEq(t, `{"prompt":"hi"}`, string(req.Payload))

	close(release)
	_, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	// A finished request is unlinked, so a long-lived parent does not grow.
	assert.Equal(t, 0, parent.NumChildren())
	assert.False(t, parent.IsStopped())
}

func TestFreshIDWithoutParent(t *testing.T) {
	const path = "test.freshid.generate"
	got := make(chan *plane.Request, 2)
	_, _, c := planetest.ServeOnHost(t, path, idHandler(got))

	var ids []string
	for range 2 {
		s := planetest.Generate(t, c, `{}`, nil)
		id := s.Context().ID()
		assert.Regexp(t, planetest.UUID, id)
		req := planetest.Recv(t, got, "the request")
		assert.Equal(t, id, req.ID)
		assert.Equal(t, id, req.Ctx.ID())
		_, _, err := planetest.Drain(s, 0)
		require.Equal(t, io.EOF, err)
		ids = append(ids, id)
	}
	assert.NotEqual(t, ids[0], ids[1])
}

// Fifty streams at once on one client: every handler waits until all fifty
// requests are being served before it produces anything.
func TestConcurrentStreams(t *testing.T) {
	const path, streams, n = "test.concurrent.generate", 50, 300
	var arrived atomic.Int32
	all := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		if arrived.Add(1) == streams {
			close(all)
		}
		select {
		case <-all:
		case <-req.Ctx.Killed():
			return
		}
		for i := 0; i < n; i++ {
			if !w.Send(req, []byte(fmt.Sprintf(`{"id":%q,"i":%d}`, req.ID, i))) {
				return
			}
		}
		req.Complete()
	})

	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for k := range streams {
		id := fmt.Sprintf("req-%d", k)
		s := planetest.Generate(t, c, `{}`, ctxtree.New(id))
		wg.Add(1)
		go func() {
			defer wg.Done()
			items, _, err := planetest.Drain(s, 64)
			if err != io.EOF {
				errs <- fmt.Errorf("%s: ended with %v", id, err)
				return
			}
			if len(items) != n {
				errs <- fmt.Errorf("%s: %d items, want %d", id, len(items), n)
				return
			}
			for i, it := range items {
				var v struct {
					ID string `json:"id"`
					I  int    `json:"i"`
				}
				if err := json.Unmarshal(it, &v); err != nil || v.ID != id || v.I != i {
					errs <- fmt.Errorf("%s: item %d is %s", id, i, it)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, int32(streams), arrived.Load())
}

func TestValidation(t *testing.T) {
	const path = "test.valid.generate"
	for _, p := range []string{"a.b", "a.b.c.d", "a..c", "a.b.c d", "a.*.c", "a.b.>", ""} {
		assert.Error(t, plane.ValidatePath(p), p)
	}
	assert.NoError(t, plane.ValidatePath("ns.comp.ep"))

	host := planetest.Embedded(t)
	_, err := host.Serve("not-a-path", nil)
	assert.Error(t, err)
	_, err = host.Client(context.Background(), "not.a-path")
	assert.Error(t, err)

	sendErr := make(chan error, 1)
	w := planetest.Serve(t, host, path, func(w *planetest.Worker, req *plane.Request) {
		sendErr <- req.Send([]byte("{not json"))
		req.Complete()
	})
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)
	_, err = c.Generate([]byte("{not json"), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrNotJSON)

	s := planetest.Generate(t, c, `"a JSON string is a request too"`, nil)
	assert.ErrorIs(t, planetest.Recv(t, sendErr, "the handler's Send"), plane.ErrNotJSON)
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	assert.Empty(t, items)

	// A malformed envelope is refused, not crashed on.
	msg, err := host.Bus().Conn().Request(discovery.RequestSubject(path, w.EP.InstanceID()), []byte("garbage"), planetest.WaitLimit)
	require.NoError(t, err)
	assert.Contains(t, string(msg.Data), "malformed request envelope")
	assert.Equal(t, path, w.EP.Path())
}

func TestClosedRuntime(t *testing.T) {
	const path = "test.closed.generate"
	host := planetest.Embedded(t)
	rt := planetest.Join(t, host)
	c := planetest.Client(t, rt, path)
	rt.Close()
	rt.Close() // idempotent
	assert.True(t, planetest.ClosedWithin(rt.Done()))

	_, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrClosed)
	_, err = rt.Serve(path, nil)
	assert.Error(t, err)
	_, err = rt.Client(context.Background(), path)
	assert.Error(t, err)
}

// Serve and Client on a shut-down runtime return ErrClosed, as documented.
func TestClosedRuntimeReturnsErrClosed(t *testing.T) {
	const path = "test.closederr.generate"
	host := planetest.Embedded(t)
	rt := planetest.Join(t, host)
	rt.Close()
	_, err := rt.Serve(path, nil)
	assert.ErrorIs(t, err, plane.ErrClosed)
	_, err = rt.Client(context.Background(), path)
	assert.ErrorIs(t, err, plane.ErrClosed)
}

func TestNextForGoConsumers(t *testing.T) {
	const path = "test.next.generate"
	host, _, c := planetest.ServeOnHost(t, path, countHandler)

	s := planetest.Generate(t, c, `{"n":500}`, nil)
	var items [][]byte
	for {
		it, err := s.Next(context.Background())
		if err != nil {
			require.Equal(t, io.EOF, err)
			break
		}
		items = append(items, it)
	}
	requireSeq(t, items, 0, 500)

	// A done ctx returns its error and leaves the stream alone.
	hold := make(chan struct{})
	planetest.Serve(t, host, "test.next.hold", func(w *planetest.Worker, req *plane.Request) {
		select {
		case <-hold:
		case <-req.Ctx.Killed():
		}
	})
	c2 := planetest.Client(t, host, "test.next.hold")
	planetest.WaitInstances(t, c2, 1)
	s = planetest.Generate(t, c2, `{}`, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.Next(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	close(hold)
	_, err = s.Next(context.Background())
	assert.Equal(t, io.EOF, err)
}

// Endpoint.Next is the blocking Accept for Go consumers: it returns ctx's
// error when ctx ends first, and ErrClosed once the endpoint is closed.
func TestEndpointNext(t *testing.T) {
	host := planetest.Embedded(t)
	ep, err := host.Serve("test.next.generate", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ep.Next(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	ep.Close()
	_, err = ep.Next(context.Background())
	assert.ErrorIs(t, err, plane.ErrClosed)
}

// Streams come back whichever way the worker's runtime sends them: on its
// session to the caller (the default) or on a connection each
// (Options.ConnectionPerStream), many in a row and a kill among them.
func TestStreamConnectionsEitherWay(t *testing.T) {
	for _, perStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-stream=%v", perStream), func(t *testing.T) {
			_, _, c := planetest.ServeAndConnect(t, "test.connections.generate", countHandler,
				func(o *plane.Options) { o.ConnectionPerStream = perStream })
			for i := 0; i < 20; i++ {
				s := planetest.Generate(t, c, `{"n":50}`, nil)
				items, _, err := planetest.Drain(s, 0)
				require.Equal(t, io.EOF, err)
				requireSeq(t, items, 0, 50)
			}
			s := planetest.Generate(t, c, `{"n":1000000}`, nil)
			require.NoError(t, planetest.WaitStarted(s))
			s.Context().Cancel(ctxtree.Killed, ctxtree.ReasonKill)
			_, _, err := planetest.Drain(s, 0)
			require.Error(t, err)
		})
	}
}

// DYNAMO_CTX_STREAM_CONNECTIONS takes "shared" or "per-stream", nothing else.
func TestStreamConnectionsEnv(t *testing.T) {
	t.Setenv(plane.EnvStreamConnections, "sometimes")
	_, err := plane.New(context.Background(), plane.Options{NATS: plane.NATSOptions{URL: "nats://127.0.0.1:1"}})
	require.ErrorContains(t, err, plane.EnvStreamConnections)
}
