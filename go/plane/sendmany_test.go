package plane_test

import (
	"fmt"
	"io"
	"testing"

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
		var batch [][]byte
		for i := range 300 { // more than the send buffer holds
			batch = append(batch, num(i))
		}
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
		n2, err2 := req.SendMany([][]byte{num(300), []byte("{not json"), num(301)})
		results <- [3]any{n1, err1, [2]any{n2, err2}}
	})
	s := planetest.Generate(t, c, `{}`, nil)
	items, _, err := planetest.Drain(s, 0)
	require.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, 301)
	r := planetest.Recv(t, results, "the handler's results")
	assert.Less(t, r[0].(int), 300, "the first call cannot take all 300")
	assert.ErrorIs(t, r[1].(error), plane.ErrFull)
	second := r[2].([2]any)
	assert.Equal(t, 1, second[0], "the item before the bad one was queued")
	assert.ErrorIs(t, second[1].(error), plane.ErrNotJSON, fmt.Sprint(second))
}
