package plane_test

// What the tests of this package share beyond planetest: the numbered items
// most handlers send, and a producer that floods its request.

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// --- items ------------------------------------------------------------------

func num(i int) []byte { return strconv.AppendInt(nil, int64(i), 10) }

// nums is the items num(0) ... num(n-1).
func nums(n int) [][]byte {
	items := make([][]byte, n)
	for i := range items {
		items[i] = num(i)
	}
	return items
}

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

// takeSeq takes n items from s, which must be 0, 1, ..., n-1.
func takeSeq(tb testing.TB, s *plane.Stream, n int) {
	tb.Helper()
	items, err := planetest.Take(s, n)
	require.NoError(tb, err)
	requireSeq(tb, items, 0, n)
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

func (f *flood) handle(_ *planetest.Worker, req *plane.Request) {
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
			g, ch := planetest.Armed()
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

// start sends a request to the flood through c, as a child of parent, and
// waits until the producer is blocked on its full buffer (see waitBlocked).
// It returns the caller's stream, the worker's request and what was queued.
func (f *flood) start(tb testing.TB, c *plane.Client, parent *ctxtree.Context) (*plane.Stream, *plane.Request, int64) {
	tb.Helper()
	s := planetest.Generate(tb, c, `{}`, parent)
	require.NoError(tb, planetest.WaitStarted(s))
	req := planetest.Recv(tb, f.reqs, "the request")
	return s, req, f.waitBlocked(tb)
}

// waitBlocked waits until the producer hit a full buffer and has made no
// progress for a while (its Arm is pending because nobody reads).
func (f *flood) waitBlocked(tb testing.TB) int64 {
	tb.Helper()
	deadline := time.Now().Add(planetest.WaitLimit)
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

// The goroutines of a stream on each side, as their stacks name them
// (planetest.GoroutineGone).
const (
	streamRun  = "plane.(*Stream).run"
	requestRun = "plane.(*Request).run"
)

// drainAll takes whatever is left, so that a failed test releases what the
// stream holds, and returns the terminal error.
func drainAll(s *plane.Stream) error {
	_, _, err := planetest.Drain(s, 0)
	return err
}

// killedOrKill waits a moment for req's context to be killed, and kills it
// when it is not (TestKillDuringSendReachesHandler), so that a flood
// handler returns either way.
func killedOrKill(req *plane.Request) {
	select {
	case <-req.Ctx.Killed():
	case <-time.After(time.Second):
		req.Ctx.Kill()
	}
}
