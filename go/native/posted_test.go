package main

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// postFd calls dc_post_fd (f) with a Go int for its fd.
func postFd[F ~int32, R ~int32](f func(*F) R) (int, R) {
	var fd F
	rc := f(&fd)
	return int(fd), rc
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func le64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

// A message of any shape is run or dropped (logged), never a panic: only the
// library's own module writes them, but a bug there must not take the
// process down.
func TestPostedMessagesOfAnyShapeAreSafe(t *testing.T) {
	posted.mu.Lock()
	defer posted.mu.Unlock()
	items := func(h uint64, count uint32, rest ...byte) []byte {
		b := le64(le32(postItems), h)
		return append(binary.LittleEndian.AppendUint32(b, count), rest...)
	}
	nan := le64(le64(le64(le32(postEngineLoad), 7), 3), math.Float64bits(math.NaN()))
	for _, m := range [][]byte{
		nil, {1}, le32(9), le32(postItems), append(le32(postItems), 1, 2, 3),
		items(1, 1), items(1, 1, 200, 0, 0, 0, '1'), items(1, maxSendMany+1), items(0, 2, 1, 0, 0, 0, '1'),
		le32(postHostTick), le64(le32(postHostTick), 0), append(le64(le32(postHostTick), 1), 0),
		le64(le32(postEngineLoad), 1), nan,
	} {
		assert.NotPanics(t, func() { runMessage(m) }, "%x", m)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		m := le32(uint32(rng.IntN(5)))
		for k := rng.IntN(40); k > 0; k-- {
			m = append(m, byte(rng.IntN(4)))
		}
		require.NotPanics(t, func() { runMessage(m) }, "%x", m)
	}
	assert.Empty(t, posted.over, "no request took any item")
}

// dc_post_fd answers one socket for the process; what is written to it runs
// in the library, and drainPosted runs what was written before it.
func TestPostFd(t *testing.T) {
	assert.EqualValues(t, 22, dc_post_fd(nil))
	fd, rc := postFd(dc_post_fd)
	require.EqualValues(t, 0, rc)
	again, _ := postFd(dc_post_fd)
	assert.Equal(t, fd, again)
	for _, m := range [][]byte{
		le64(le32(postHostTick), 12345),                                         // a handle no longer valid: dropped
		le64(le64(le64(le32(postEngineLoad), 12345), 1), math.Float64bits(0.5)), // the same
		le64(le32(postItems), 12345),                                            // malformed: dropped, logged
	} {
		postedSent.Add(1) // as the host counts before it writes
		n, err := syscall.Write(fd, m)
		require.NoError(t, err)
		require.Equal(t, len(m), n)
		drainPosted()
		assert.Equal(t, postedSent.Load(), postedDone.Load(), "run before drainPosted returns")
	}
	assert.Zero(t, postedOver.Load())
}

// A full request is listed for the host, up to DC_POSTED_FULL_SLOTS of them;
// with more, the host calls in for every request; once none is full the
// list empties and the host posts again.
func TestFullRequestsAreListedForTheHost(t *testing.T) {
	posted.mu.Lock()
	defer posted.mu.Unlock()
	listed := func(h uint64) bool {
		for i := range postedFull {
			if postedFull[i].Load() == h {
				return true
			}
		}
		return false
	}
	reqs := make([]*plane.Request, len(postedFull)+6)
	for i := range reqs {
		reqs[i] = &plane.Request{} // a request's zero value: Over is false
		markFull(uint64(1000+i), reqs[i])
		if i == 0 {
			assert.True(t, listed(1000))
			assert.EqualValues(t, postedSome, postedOver.Load())
		}
	}
	assert.True(t, listed(uint64(1000+len(postedFull)-1)))
	assert.False(t, listed(uint64(1000+len(postedFull))), "no slot left")
	assert.EqualValues(t, postedAllCall, postedOver.Load())
	// Six of the listed ones no longer full: their slots go to the six that
	// had none, and the host posts again for every request but those.
	still := map[*plane.Request]bool{}
	for i, r := range reqs {
		still[r] = i >= 6
	}
	isOver = func(r *plane.Request) bool { return still[r] }
	defer func() { isOver = (*plane.Request).Over }()
	recheckOver()
	assert.EqualValues(t, postedSome, postedOver.Load())
	for i := range reqs {
		assert.Equal(t, i >= 6, listed(uint64(1000+i)), "request %d", i)
	}
	isOver = (*plane.Request).Over
	recheckOver()
	assert.EqualValues(t, postedAllPost, postedOver.Load())
	assert.Empty(t, posted.over)
	for i := range postedFull {
		assert.Zero(t, postedFull[i].Load())
	}
}
