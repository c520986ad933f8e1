package plane_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// SendMany queues what fits, in order, reports how many, and stops at an
// item that is not JSON; the caller receives exactly the items queued.
func TestSendMany(t *testing.T) {
	const path = "test.sendmany.generate"
	results := make(chan [3]any, 1)
	_, _, c := planetest.ServeAndConnect(t, path, func(_ *planetest.Worker, req *plane.Request) {
		batch := nums(1000) // more than the stream's credit and the send buffer hold
		n1, err1 := req.SendMany(batch)
		// The rest after the buffer drained (Arm), then a bad item in the middle.
		for n := n1; n < len(batch); {
			f, ch := planetest.Armed()
			req.Arm(f)
			<-ch
			k, err := req.SendMany(batch[n:])
			n += k
			if err != nil {
				require.ErrorIs(t, err, plane.ErrFull)
			}
		}
		n2, err2 := req.SendMany([][]byte{num(1000), []byte("{not json"), num(1001)})
		results <- [3]any{n1, err1, [2]any{n2, err2}}
	})
	s := planetest.Generate(t, c, `{}`, nil)
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, 1001)
	r := planetest.Recv(t, results, "the handler's results")
	assert.Less(t, r[0].(int), 1000, "the first call cannot take all 1000")
	assert.ErrorIs(t, r[1].(error), plane.ErrFull)
	second := r[2].([2]any)
	assert.Equal(t, 1, second[0], "the item before the bad one was queued")
	assert.ErrorIs(t, second[1].(error), plane.ErrNotJSON, fmt.Sprint(second))
}

// Items handed over while the stream has credit go straight to it (no
// goroutine); past the credit they wait in the buffer for the stream's
// goroutine, and later ones go straight again once both drained. However
// the two interleave, with a caller that takes in small bites and pauses,
// the caller receives every item once, in order.
func TestSendManyDirectAndQueuedKeepOrder(t *testing.T) {
	const path, total = "test.sendorder.generate", 20000
	_, _, c := planetest.ServeAndConnect(t, path, func(_ *planetest.Worker, req *plane.Request) {
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < total; {
			var batch [][]byte
			for k := rng.IntN(40) + 1; k > 0 && i+len(batch) < total; k-- {
				batch = append(batch, num(i+len(batch)))
			}
			n, err := req.SendMany(batch)
			i += n
			if errors.Is(err, plane.ErrFull) {
				f, ch := planetest.Armed()
				req.Arm(f)
				<-ch
			} else if err != nil {
				t.Errorf("SendMany: %v", err)
				return
			}
		}
		req.Complete()
	})
	s := planetest.Generate(t, c, `{}`, nil)
	require.NoError(t, planetest.WaitStarted(s))
	var items [][]byte
	for bite := 0; ; bite++ {
		b, err := s.Take(1 + bite%7)
		if errors.Is(err, plane.ErrAgain) {
			require.NoError(t, planetest.WaitArm(s.Arm))
			continue
		}
		if err != nil {
			require.Equal(t, io.EOF, err)
			break
		}
		items = append(items, b...)
		if bite%500 == 0 {
			time.Sleep(2 * time.Millisecond) // the credit runs out meanwhile
		}
	}
	requireSeq(t, items, 0, total)
}

// SendManyPosted takes every item, beyond the send buffer's bound, and says
// when the buffer is at or over it; a Send then reports ErrFull, Over holds
// until the stream's writer took the items, and the caller receives them
// all, in order.
//
// The writer takes the whole buffer each time it wakes, so the buffer stays
// over its bound only while the writer is held: the caller reads nothing
// until the handler's checks are done, and the handler first sends more
// than the caller can hold (the transport's window, DefaultWindow + 1), so
// that the writer is held, before the items it checks.
func TestSendManyPostedTakesAllAndReportsOver(t *testing.T) {
	const path = "test.sendposted.generate"
	const total, held = 1200, 800 // the caller holds at most 257
	results := make(chan [4]any, 1)
	checked := make(chan struct{})
	_, _, c := planetest.ServeAndConnect(t, path, func(_ *planetest.Worker, req *plane.Request) {
		batch := nums(total)
		small, err0 := req.SendManyPosted(batch[:1], nil)
		_, errHeld := req.SendManyPosted(batch[1:held], nil)
		assert.NoError(t, errHeld)
		for req.Over() { // until the writer took them: it is held from now on
			time.Sleep(time.Millisecond)
		}
		over, err1 := req.SendManyPosted(batch[held:], nil) // 400: over the bound of 256
		full := req.Send(num(total))
		wasOver := req.Over()
		close(checked) // the caller reads only now
		f, ch := planetest.Armed()
		req.Arm(f)
		<-ch // the caller read enough: under the bound again
		assert.False(t, req.Over(), "under the bound after the caller read")
		assert.NoError(t, req.Send(num(total)))
		_, err2 := req.SendManyPosted([][]byte{num(total + 1), []byte("{not json")}, nil)
		req.Complete()
		results <- [4]any{[2]any{small, err0}, [2]any{over, err1}, [2]any{full, wasOver}, err2}
	})
	s := planetest.Generate(t, c, `{}`, nil)
	planetest.Recv(t, checked, "the handler's first checks")
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, total+2)
	r := planetest.Recv(t, results, "the handler's results")
	assert.Equal(t, [2]any{false, nil}, r[0], "one item: under the bound")
	assert.Equal(t, [2]any{true, nil}, r[1], "all taken, over the bound")
	assert.Equal(t, [2]any{plane.ErrFull, true}, r[2], "then Send is refused, and Over says so")
	assert.ErrorIs(t, r[3].(error), plane.ErrNotJSON)
}
