package plane_test

// Flow control (credits): the items in flight stay bounded while the caller
// takes nothing, and a stream held by a full buffer, on either side, ends
// on a kill or a runtime's shutdown without another Take.

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// A handler that produces far more than the buffers hold while the caller
// takes nothing: Send reports ErrFull, the number of items in flight stays
// bounded, and once the caller takes, everything arrives in order.
func TestFlowControlBoundsMemory(t *testing.T) {
	const path, total = "test.flow.generate", 20000
	// Send buffer, the batch the worker is writing, the caller's stream
	// window and the client stream's buffer: 256 items each.
	const bound = 4 * 256
	f := newFlood(total)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	s, _, queued := f.start(t, c, nil)
	assert.Positive(t, f.full.Load(), "Send never reported ErrFull")
	assert.LessOrEqual(t, queued, int64(bound), "items queued while the caller does not read")
	assert.GreaterOrEqual(t, queued, int64(256), "the pipeline should hold at least one buffer")

	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, total)
	assert.Equal(t, int64(total), f.sent.Load())
}

// Killing a stream whose buffer is full (the consumer stopped taking, as
// when Python drops an unfinished stream) releases everything: the worker's
// request is killed and the stream's goroutine ends without another Take.
func TestKillWithFullBufferReleasesStream(t *testing.T) {
	const path, tries = "test.killfull.generate", 3
	f := newFlood(100000)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	for range tries {
		f.sent.Store(0)
		f.full.Store(0)
		s, _, _ := f.start(t, c, nil)
		s.Kill()
		// Whether the worker's context is killed here is racy (see
		// TestKillDuringSendReachesHandler); this test is about the
		// caller's side.
		assert.True(t, planetest.GoroutineGone("plane.(*Stream).run", 2*time.Second),
			"the stream's goroutine outlived its Kill")
		_, _, err := planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}
}

// A caller that shuts its runtime down while its stream's buffer is full
// (the consumer stopped taking) ends the stream's goroutine: Stream.run
// does not wait for a Take that never comes.
func TestCallerCloseWithFullBufferEndsStream(t *testing.T) {
	const path = "test.closefull.generate"
	host := planetest.Embedded(t)
	f := newFlood(100000)
	planetest.Serve(t, host, path, f.handle)
	crt := planetest.Join(t, host)
	c := planetest.Client(t, crt, path)
	planetest.WaitInstances(t, c, 1)

	s, req, _ := f.start(t, c, nil)

	crt.Close()
	killedOrKill(req)
	assert.True(t, planetest.GoroutineGone(streamRun, 2*time.Second),
		"Stream.run still running after its runtime was closed")
	assert.Error(t, drainAll(s))
}

// Same, through a kill of the caller's parent context: the worker is
// killed, and the stream's goroutine ends without a Take.
func TestParentKillWithFullBufferEndsStream(t *testing.T) {
	const path = "test.parentkillfull.generate"
	f := newFlood(100000)
	_, _, c := planetest.ServeAndConnect(t, path, f.handle)

	parent := ctxtree.New("frontend")
	s, req, _ := f.start(t, c, parent)

	parent.Kill()
	killedOrKill(req)
	assert.True(t, planetest.GoroutineGone(streamRun, 2*time.Second),
		"Stream.run still running after its request was killed")
	assert.Equal(t, io.EOF, drainAll(s))
}

// A worker runtime shut down while its handler's stream is blocked on the
// caller's flow control (the caller does not read) kills the request's
// context with reason shutdown and ends its stream: Request.run gives up
// the send (Outgoing.SendBatch) on a kill from the worker's side too, so no
// goroutine of the request outlives Runtime.Close, and the caller sees an
// incomplete stream.
func TestWorkerCloseWithSlowCallerEndsRequest(t *testing.T) {
	const path = "test.closeslowcaller.generate"
	f := newFlood(100000)
	_, w, c := planetest.ServeAndConnect(t, path, f.handle)

	s, req, sent := f.start(t, c, nil)

	w.RT.Close()
	require.True(t, planetest.ClosedWithin(req.Ctx.Killed()))
	assert.Equal(t, ctxtree.ReasonShutdown, req.Ctx.Reason())
	assert.True(t, planetest.GoroutineGone(requestRun, 2*time.Second),
		"Request.run still running after the worker's runtime was closed")

	items, _, err := planetest.Drain(s, 0)
	assert.ErrorIs(t, err, plane.ErrIncomplete)
	assert.LessOrEqual(t, int64(len(items)), sent)
	assert.False(t, errors.Is(err, io.EOF))
}
