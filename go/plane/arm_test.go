package plane_test

// Arm: a one-shot function that the endpoint, a stream, a request or a
// client's instances call when they may have progressed (what the host's
// event loop waits on instead of polling).

import (
	"io"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func TestArmEndpoint(t *testing.T) {
	const path = "test.armep.generate"
	host := planetest.Embedded(t)
	ep, err := host.Serve(path, nil)
	require.NoError(t, err)
	t.Cleanup(ep.Close)
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)

	_, err = ep.Accept()
	require.ErrorIs(t, err, plane.ErrAgain)

	// Nothing pending: the function waits.
	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	ep.Arm(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())

	// It fires once when a request arrives...
	s1 := planetest.Generate(t, c, `{}`, nil)
	planetest.Recv(t, ch, "the endpoint's Arm")
	r1, err := ep.Accept()
	require.NoError(t, err)
	// ...and not again for the next one (it is one-shot).
	s2 := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitArm(ep.Arm))
	r2, err := ep.Accept()
	require.NoError(t, err)
	assert.Equal(t, int32(1), fired.Load())
	assert.NotEqual(t, r1.ID, r2.ID)

	// With a request pending it fires at once, on the calling goroutine.
	s3 := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitArm(ep.Arm))
	now := false
	ep.Arm(func() { now = true })
	assert.True(t, now)
	r3, err := ep.Accept()
	require.NoError(t, err)

	for _, r := range []*plane.Request{r1, r2, r3} {
		r.Complete()
	}
	for _, s := range []*plane.Stream{s1, s2, s3} {
		_, _, err := planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}

	// An Arm pending at Close fires; after Close it fires at once and
	// Accept reports ErrClosed.
	closedFired := make(chan struct{}, 1)
	ep.Arm(func() { closedFired <- struct{}{} })
	ep.Close()
	planetest.Recv(t, closedFired, "the Arm pending at Close")
	now = false
	ep.Arm(func() { now = true })
	assert.True(t, now)
	_, err = ep.Accept()
	assert.ErrorIs(t, err, plane.ErrClosed)
}

func TestArmStreamAndRequest(t *testing.T) {
	const path = "test.armstream.generate"
	reqs := make(chan *plane.Request, 1)
	goOn := make(chan int)
	finished := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		// Room in the buffer: Request.Arm fires at once.
		now := false
		req.Arm(func() { now = true })
		if !now {
			req.Fail("AssertionError: Request.Arm did not fire at once with room in the buffer")
			return
		}
		reqs <- req
		for i := range goOn {
			w.Send(req, num(i))
		}
		req.Complete()
		// After the end: at once as well.
		now = false
		req.Arm(func() { now = true })
		if now {
			close(finished)
		}
	})

	s := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitStarted(s))
	planetest.Recv(t, reqs, "the request")

	// Started was seen and nothing is buffered: Arm waits.
	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	s.Arm(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())
	_, err := s.Take(0)
	assert.ErrorIs(t, err, plane.ErrAgain)

	goOn <- 0
	planetest.Recv(t, ch, "the stream's Arm")
	items, err := s.Take(0)
	require.NoError(t, err)
	requireSeq(t, items, 0, 1)

	// One-shot: the next item does not fire it again.
	goOn <- 1
	require.NoError(t, planetest.WaitArm(s.Arm))
	// With an item buffered, Arm fires at once on the calling goroutine.
	now := false
	s.Arm(func() { now = true })
	assert.True(t, now)
	items, err = s.Take(0)
	require.NoError(t, err)
	requireSeq(t, items, 1, 1)
	assert.Equal(t, int32(1), fired.Load())

	close(goOn)
	_, _, err = planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	// After the end, Arm fires at once.
	now = false
	s.Arm(func() { now = true })
	assert.True(t, now)
	assert.True(t, planetest.ClosedWithin(finished), "Request.Arm did not fire at once after Complete")
}

func TestArmInstances(t *testing.T) {
	const path = "test.arminst.generate"
	host := planetest.Embedded(t)
	c := planetest.Client(t, host, path)

	var fired atomic.Int32
	ch := make(chan struct{}, 4)
	c.ArmInstances(func() { fired.Add(1); ch <- struct{}{} })
	assert.Zero(t, fired.Load())

	w := planetest.Serve(t, host, path, countHandler)
	planetest.Recv(t, ch, "ArmInstances")
	assert.Equal(t, []uint64{w.EP.InstanceID()}, c.InstanceIDs())

	now := false
	c.ArmInstances(func() { now = true })
	assert.True(t, now)

	// A client that closes releases its waiters.
	other := planetest.Client(t, host, "test.arminst.nobody")
	closed := make(chan struct{}, 1)
	other.ArmInstances(func() { closed <- struct{}{} })
	other.Close()
	planetest.Recv(t, closed, "ArmInstances at Close")
	_, err := other.Generate([]byte(`{}`), nil, plane.RoundRobin, 0)
	assert.ErrorIs(t, err, plane.ErrClosed)
	assert.Equal(t, int32(1), fired.Load())
}

// A consumer that polls Take never sees the end before the last items: the
// worker's last item and its end can land between the consumer's look at
// the connection's queue and its look at the end (a direct stream's items
// stay there until taken). Each request here is one item and the end.
func TestTakeNeverEndsBeforeTheLastItem(t *testing.T) {
	const path = "test.takeend.generate"
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		w.Send(req, num(0))
		req.Complete()
	})
	runs := 2000
	if testing.Short() {
		runs = 200
	}
	for i := 0; i < runs; i++ {
		s := planetest.Generate(t, c, `{}`, nil)
		var got [][]byte
		var err error
		for {
			var items [][]byte
			if items, err = s.Take(0); err == plane.ErrAgain {
				runtime.Gosched()
				continue
			}
			if err != nil {
				break
			}
			got = append(got, items...)
		}
		require.Equal(t, io.EOF, err)
		require.Len(t, got, 1, "run %d: the end came before the item", i)
	}
}
