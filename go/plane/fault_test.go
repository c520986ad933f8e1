package plane_test

import (
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// Faults a worker process can have, played by hand on the wire: an instance
// that is registered but never answers (a stopped process, or a dead one
// whose subscription the server still holds), and a worker that acknowledges,
// connects, sends a few tokens and then goes silent (stopped mid-stream).

func tokenRequest(n int) []byte { return fmt.Appendf(nil, `{"token_ids":[],"max_tokens":%d}`, n) }

// A request sent to an instance that never acknowledges is detected within
// the acknowledgement timeout and migrates; every stream completes, and new
// requests avoid the instance afterwards.
func TestStalledInstanceMigrates(t *testing.T) {
	const path = "test.stalled.generate"
	host, _, c := planetest.ServeAndConnect(t, path, planetest.Tokens)
	bad := planetest.BlackHole(t, host, path, nil)
	planetest.WaitInstances(t, c, 2)
	c.SetMigrationLimit(2)

	const streams, n = 24, 20
	var wg sync.WaitGroup
	results := make([][]int, streams)
	errs := make([]error, streams)
	start := time.Now()
	for i := range streams {
		wg.Go(func() {
			s := planetest.Generate(t, c, string(tokenRequest(n)), nil)
			results[i], errs[i] = planetest.DrainTokens(t, s)
		})
	}
	wg.Wait()
	for i := range streams {
		require.Equal(t, "EOF", fmt.Sprint(errs[i]), "stream %d", i)
		assert.Equal(t, planetest.Seq(0, n), results[i], "stream %d", i)
	}
	t.Logf("%d streams, one instance of two stalled: all completed in %s", streams, time.Since(start))
	assert.Less(t, time.Since(start), 3*plane.DefaultAckTimeout+2*time.Second)

	// Without migration, a new request does not go to the suspect instance.
	c.SetMigrationLimit(0)
	for range 4 {
		got, err := planetest.DrainTokens(t, planetest.Generate(t, c, string(tokenRequest(3)), nil))
		require.Equal(t, "EOF", fmt.Sprint(err))
		assert.Equal(t, planetest.Seq(0, 3), got)
	}
	// Sent to it directly, a request fails with ErrNotAcknowledged.
	_, err := planetest.DrainTokens(t, planetest.GenerateRoute(t, c, string(tokenRequest(1)), nil, plane.Direct, bad))
	assert.ErrorIs(t, err, plane.ErrNotAcknowledged)
}

// silentWorker registers an instance that acknowledges, connects back,
// sends the first k tokens of the request and then holds the connection
// without a word (no heartbeat): a worker stopped mid-stream. It is the only
// instance of path on a new request plane, whose host runtime is made with
// opts and has a client of path that knows the instance.
func silentWorker(t *testing.T, path string, k int, opts ...planetest.Option) (*plane.Runtime, *plane.Client) {
	t.Helper()
	host := planetest.Embedded(t, opts...)
	hand := planetest.NewHandConns(t)
	planetest.HandInstance(t, host, path, nil, func(m *nats.Msg) {
		_ = m.Respond([]byte(`{}`))
		_, w, ok := hand.DialBack(m)
		if !ok {
			return
		}
		for i := range k {
			_ = w.WriteData(fmt.Appendf(nil, `{"token_ids":[%d]}`, i))
		}
		_ = w.Flush()
	})
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)
	return host, c
}

func shortIdle(o *plane.Options) { o.StreamIdleTimeout = 300 * time.Millisecond }

// A worker that goes silent mid-stream is found out by the stream's
// liveness check; the stream migrates and the caller sees every token once.
func TestSilentWorkerStreamMigrates(t *testing.T) {
	const path = "test.silent.generate"
	host, c := silentWorker(t, path, 5, shortIdle)
	wrt := planetest.Join(t, host, shortIdle)
	planetest.Serve(t, wrt, path, planetest.Tokens)
	planetest.WaitInstances(t, c, 2)
	c.SetMigrationLimit(1)

	for i := range 6 { // round robin: half of them start on the silent worker
		start := time.Now()
		got, err := planetest.DrainTokens(t, planetest.Generate(t, c, string(tokenRequest(12)), nil))
		require.Equal(t, "EOF", fmt.Sprint(err), "request %d", i)
		assert.Equal(t, planetest.Seq(0, 12), got, "request %d", i)
		assert.Less(t, time.Since(start), 5*time.Second)
	}
}

// Without migration, the silent worker's stream ends with ErrIncomplete
// (transport.ErrPeerSilent) instead of hanging.
func TestSilentWorkerStreamIncomplete(t *testing.T) {
	const path = "test.silent1.generate"
	_, c := silentWorker(t, path, 2, shortIdle)
	got, err := planetest.DrainTokens(t, planetest.Generate(t, c, string(tokenRequest(5)), nil))
	assert.Equal(t, planetest.Seq(0, 2), got)
	assert.ErrorIs(t, err, plane.ErrIncomplete)
}

// A worker whose handler is slow but alive (a long prefill) is not taken
// for a dead one: heartbeats keep its stream.
func TestSlowHandlerNotMistakenForDead(t *testing.T) {
	const path = "test.slow.generate"
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		time.Sleep(time.Second) // > 3 idle timeouts before the first item
		w.Send(req, []byte(`{"token_ids":[0]}`))
	}, shortIdle)
	got, err := planetest.DrainTokens(t, planetest.Generate(t, c, `{}`, nil))
	assert.Equal(t, "EOF", fmt.Sprint(err))
	assert.Equal(t, []int{0}, got)
}

// The NATS host dies (its runtime closes) while streams flow from a worker
// in another runtime: in-flight streams keep flowing, the survivors take
// the server over, and new requests succeed again.
func TestNATSHostDeathRiddenOut(t *testing.T) {
	const path = "test.hostdeath.generate"
	release := make(chan struct{})
	host := planetest.Embedded(t)
	wrt := planetest.Join(t, host)
	planetest.Serve(t, wrt, path, func(w *planetest.Worker, req *plane.Request) {
		w.Send(req, []byte(`{"token_ids":[0]}`))
		<-release
		w.Send(req, []byte(`{"token_ids":[1]}`))
	})
	caller := planetest.Join(t, host)
	c := planetest.Client(t, caller, path)
	planetest.WaitInstances(t, c, 1)
	inflight := planetest.Generate(t, c, `{}`, nil)
	first, err := planetest.Take(inflight, 1)
	require.NoError(t, err)
	require.Len(t, first, 1)

	died := time.Now()
	host.Close()
	close(release)
	got, err := planetest.DrainTokens(t, inflight)
	assert.Equal(t, "EOF", fmt.Sprint(err), "the in-flight stream does not depend on the bus")
	assert.Equal(t, []int{1}, got)

	// A request sent right away waits for the takeover instead of failing.
	var recovered time.Duration
	for {
		got, err := planetest.DrainTokens(t, planetest.Generate(t, c, `{}`, nil))
		if err == nil || fmt.Sprint(err) == "EOF" {
			assert.Equal(t, []int{0, 1}, got)
			recovered = time.Since(died)
			break
		}
		require.Less(t, time.Since(died), planetest.WaitLimit, "no request succeeded after the host died: %v", err)
	}
	t.Logf("host died -> next request succeeded: %s", recovered)
}

// lateAcker registers an instance of path that connects back at once,
// streams the request's k tokens and ends the stream, but acknowledges only
// after delay (or never, for a negative delay): a worker whose
// acknowledgement the bus delivers late (its NATS host starved of CPU).
func lateAcker(t *testing.T, host *plane.Runtime, path string, k int, delay time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	hand := planetest.NewHandConns(t)
	planetest.HandInstance(t, host, path, nil, func(m *nats.Msg) {
		wg.Go(func() {
			c, w, ok := hand.DialBack(m)
			if !ok {
				return
			}
			for i := range k {
				_ = w.WriteData(fmt.Appendf(nil, `{"token_ids":[%d]}`, i))
			}
			_ = w.WriteFinal()
			_ = w.Flush()
			if delay >= 0 {
				time.Sleep(delay)
				_ = m.Respond([]byte(`{}`))
			}
			_, _ = io.Copy(io.Discard, c) // until the caller closes
		})
	})
}

// A worker that connected back has the request, whether or not its
// acknowledgement has come: the acknowledgement timeout does not fail the
// request (which migration would then kill and send elsewhere).
func TestConnectedWorkerNeedsNoTimelyAck(t *testing.T) {
	const path = "test.lateack.generate"
	ackWithin := func(o *plane.Options) { o.AckTimeout = 200 * time.Millisecond }
	host := planetest.Embedded(t, ackWithin)
	for _, delay := range []time.Duration{time.Second, -1} {
		p := fmt.Sprintf("%s%d", path, delay)
		lateAcker(t, host, p, 4, delay)
		c := planetest.Client(t, host, p)
		planetest.WaitInstances(t, c, 1)
		c.SetMigrationLimit(0)
		for i := range 3 {
			got, err := planetest.DrainTokens(t, planetest.Generate(t, c, string(tokenRequest(4)), nil))
			require.Equal(t, "EOF", fmt.Sprint(err), "ack after %s, request %d", delay, i)
			assert.Equal(t, planetest.Seq(0, 4), got)
		}
	}
}
