package transport

import (
	"context"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMeasureFloodAttach measures, it does not pass judgement on timing:
// FLOODERS connections each open a silent connection every FLOOD_EVERY for
// six seconds, beyond the 512 the Server holds, while workers attach one
// after another; it prints the flood's rate and the workers' attach
// latency, and fails only if a worker's stream did not connect. Skipped
// unless FLOOD_EVERY is set, e.g.
//
//	FLOOD_EVERY=200us go test -run MeasureFloodAttach -v ./go/transport
func TestMeasureFloodAttach(t *testing.T) {
	every, _ := time.ParseDuration(os.Getenv("FLOOD_EVERY"))
	if every == 0 {
		t.Skip()
	}
	floods, _ := strconv.Atoi(os.Getenv("FLOODERS"))
	s := listen(t)
	var fs []*flooder
	for i := 0; i < max(floods, 1); i++ {
		fs = append(fs, startFlood(t, s, MaxPendingConns/max(floods, 1), every, 2*MaxPendingConns))
	}
	waitFull(t, s)
	var lat []time.Duration
	fails := 0
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		tok := NewToken()
		in := s.Expect(tok)
		t0 := time.Now()
		o, err := Dial(context.Background(), s.Addr().String(), tok)
		if err != nil {
			fails++
			in.Close()
			continue
		}
		_ = o.Send(context.Background(), item(0))
		_, err = in.Recv(context.Background())
		if err != nil {
			fails++
		} else {
			lat = append(lat, time.Since(t0))
		}
		o.Close()
		in.Close()
		time.Sleep(20 * time.Millisecond)
	}
	var opened int64
	for _, f := range fs {
		opened += f.opened.Load()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(q*float64(len(lat)-1))]
	}
	t.Logf("flood every %v x %d: opened %d in %v (%.0f/s); workers ok %d failed %d; attach p50 %v p90 %v p99 %v max %v",
		every, max(floods, 1), opened, time.Since(start), float64(opened)/time.Since(start).Seconds(), len(lat), fails, p(.5), p(.9), p(.99), p(1))
	require.Zero(t, fails)
}
