package plane_test

import (
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// A kill ends the stream (docs/design.md, section 3): once the caller's context is
// killed, Take returns no item, whatever the producer did meanwhile. The
// producer here never waits (countHandler sends as fast as the buffer
// takes), so every interleaving of kill, items and the stream's end is
// exercised: the kill lands while items are in flight, while they are
// buffered, and after the stream ended, when the request's context is no
// longer linked to the caller's (Stream.end -> Finish).

// streamEnded waits until s has ended: its context was unlinked from parent.
func streamEnded(tb testing.TB, parent *ctxtree.Context) {
	tb.Helper()
	deadline := time.Now().Add(planetest.WaitLimit)
	for parent.NumChildren() > 0 {
		if time.Now().After(deadline) {
			tb.Fatal("the stream never ended")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestKillRaceNoItemAfterKill(t *testing.T) {
	const n, iterations = 48, 300
	for _, migrating := range []bool{false, true} {
		t.Run(fmt.Sprintf("migrating=%v", migrating), func(t *testing.T) {
			path := fmt.Sprintf("test.killrace%v.generate", migrating)
			_, _, c := planetest.ServeAndConnect(t, path, countHandler)
			if migrating {
				c.SetMigrationLimit(2)
			}
			for i := range iterations {
				k := i % 16 // the item at which the caller kills
				parent := ctxtree.New(fmt.Sprintf("race-%d", i))
				s := planetest.Generate(t, c, fmt.Sprintf(`{"n":%d}`, n), parent)
				takeSeq(t, s, k+1)
				if i%3 == 2 {
					// Deterministically: the stream ended with items
					// still buffered, then the caller kills.
					streamEnded(t, parent)
				}
				parent.Kill()
				rest, _, err := planetest.Drain(s, 0)
				require.Empty(t, rest, "iteration %d: items after a kill at item %d", i, k)
				require.Equal(t, io.EOF, err)
				require.True(t, s.Finished())
			}
		})
	}
}

// A kill during a migrated stream: the first worker sends a few items and
// crashes, the second continues; the caller kills while the second worker's
// items flow, or after they all arrived, and takes nothing more.
func TestKillDuringMigratedStream(t *testing.T) {
	const path, first = "test.killmig.generate", 3
	host := planetest.Embedded(t)
	w2rt := planetest.Join(t, host)
	planetest.Serve(t, w2rt, path, countHandler)
	c := planetest.Client(t, host, path)
	c.SetMigrationLimit(2)
	for i := range 6 {
		w1rt := planetest.Join(t, host)
		w1 := planetest.Serve(t, w1rt, path, func(w *planetest.Worker, req *plane.Request) {
			for j := 0; j < first; j++ {
				if !w.Send(req, num(j)) {
					return
				}
			}
			<-req.Ctx.Killed() // hangs until its runtime closes (the crash)
		})
		planetest.WaitInstances(t, c, 2)
		parent := ctxtree.New(fmt.Sprintf("mig-%d", i))
		s := planetest.GenerateRoute(t, c, `{"n":40}`, parent, plane.Direct, w1.EP.InstanceID())
		takeSeq(t, s, first)
		w1rt.Close()     // the crash: the stream migrates to the second worker
		takeSeq(t, s, 2) // the second worker's (not a token stream: it restarts)
		if i%2 == 1 {
			streamEnded(t, parent)
		}
		parent.Kill()
		rest, _, err := planetest.Drain(s, 0)
		require.Empty(t, rest, "items after a kill of a migrated stream")
		require.Equal(t, io.EOF, err)
	}
}

// A kill of the request's own context (Stream.Kill, what closing the stream
// does) after the stream ended drops what is buffered too.
func TestStreamKillAfterEndDropsBufferedItems(t *testing.T) {
	const path = "test.killend.generate"
	_, _, c := planetest.ServeOnHost(t, path, countHandler)
	parent := ctxtree.New("kill-end")
	s := planetest.Generate(t, c, `{"n":20}`, parent)
	streamEnded(t, parent)
	require.False(t, s.Finished(), "20 items are buffered")
	s.Kill()
	rest, _, err := planetest.Drain(s, 0)
	require.Empty(t, rest)
	require.Equal(t, io.EOF, err)
	require.True(t, s.Finished())
}

// An in-process caller's kill reaches the handler's context as a kill: the
// context never shows Stopped with stop_generating on the way (a handler
// polling its state word could take it for a clean stop).
func TestLocalKillDoesNotPassThroughStop(t *testing.T) {
	reqs := make(chan *plane.Request, 1)
	_, _, c := planetest.ServeOnHost(t, "test.localkill.generate", planetest.Hold(reqs))
	for range 20 {
		s, err := c.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
		require.NoError(t, err)
		require.NoError(t, planetest.WaitStarted(s))
		req := planetest.Recv(t, reqs, "the request")
		var mu sync.Mutex
		var seen []ctxtree.Reason
		req.Ctx.Notify(ctxtree.Stopped, func() {
			mu.Lock()
			defer mu.Unlock()
			_, r := req.Ctx.State()
			seen = append(seen, r)
		})
		s.Kill()
		<-req.Ctx.Killed()
		mu.Lock()
		assert.Equal(t, []ctxtree.Reason{ctxtree.ReasonKill}, seen)
		mu.Unlock()
		_, _, _ = planetest.Drain(s, 0)
	}
}

// Once a handler has ended and its caller has seen the end, nothing cancels
// the handler's context any more: not a kill of the in-process caller's
// context, not the endpoint's shutdown (the request left the endpoint
// before its end frame was written).
func TestEndedRequestIsNotCancelledAfterward(t *testing.T) {
	reqs := make(chan *plane.Request, 1)
	_, w, c := planetest.ServeOnHost(t, "test.endedlocal.generate", planetest.Hold(reqs))
	var ended []*plane.Request
	for i := range 100 {
		parent := ctxtree.New(fmt.Sprintf("ended-%d", i))
		s := planetest.Generate(t, c, `{}`, parent)
		require.NoError(t, planetest.WaitStarted(s))
		req := planetest.Recv(t, reqs, "the request")
		if i%2 == 0 {
			req.Complete()
		} else {
			req.Fail("boom")
		}
		_, _, _ = planetest.Drain(s, 0) // the caller has seen the end
		parent.Kill()
		st, r := req.Ctx.State()
		require.Equal(t, ctxtree.Live, st, "request %d: %s after its caller saw the end", i, r)
		ended = append(ended, req)
	}
	w.EP.Close()
	for i, req := range ended {
		st, r := req.Ctx.State()
		require.Equal(t, ctxtree.Live, st, "request %d: %s by the endpoint's shutdown", i, r)
	}
}

// A caller's kill (or loss) that arrives while Request.run is in
// Outgoing.SendBatch, which it makes fail, reaches the handler's context
// with reason kill (or connection_lost), every time: whichever of the
// failed send and the control event the worker sees first, the handler
// does not keep generating, its Sends dropped, after the client left.
func TestKillDuringSendReachesHandler(t *testing.T) {
	for _, how := range []string{"kill", "caller lost"} {
		t.Run(how, func(t *testing.T) {
			const path, tries = "test.killsend.generate", 100
			host := planetest.Embedded(t)
			f := newFlood(1 << 30)
			planetest.Serve(t, host, path, f.handle)
			missed := 0
			for range tries {
				crt := planetest.Join(t, host)
				c := planetest.Client(t, crt, path)
				planetest.WaitInstances(t, c, 1)
				s := planetest.Generate(t, c, `{}`, nil)
				req := planetest.Recv(t, f.reqs, "the request")
				// The caller consumes as fast as it can: the handler streams
				// at full speed and Request.run is in SendBatch most of the time.
				drained := make(chan struct{})
				go func() { defer close(drained); _ = drainAll(s) }()
				for base := f.sent.Load(); f.sent.Load() < base+2000; {
					time.Sleep(time.Millisecond)
				}
				want := ctxtree.ReasonKill
				if how == "kill" {
					s.Kill()
				} else {
					want = ctxtree.ReasonConnectionLost
					crt.Close()
				}
				select {
				case <-req.Ctx.Killed():
					assert.Equal(t, want, req.Ctx.Reason())
				case <-time.After(time.Second):
					missed++
					// The handler runs on with Sends that drop everything.
					req.Ctx.Kill()
				}
				<-drained
				crt.Close()
			}
			assert.Zero(t, missed, "the worker's context was not killed in %d of %d tries", missed, tries)
		})
	}
}
