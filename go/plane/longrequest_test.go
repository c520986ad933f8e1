package plane_test

// Requests larger than their envelope may carry (plane.InlineRequestBytes):
// the worker fetches them from the caller over TCP, so a NATS server with
// its default 1 MB max_payload (what an operator's cluster runs) carries a
// million-token prompt's envelope, not the prompt.

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// natsDefaults runs a nats-server with a 1 MB max_payload, nats-server's
// default, and returns it (stopped at cleanup).
func natsDefaults(t *testing.T) *server.Server {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs last
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, MaxPayload: 1 << 20, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(planetest.WaitLimit), "nats-server did not start")
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// longTokens is a request of n token ids (5 to 7 bytes of JSON each, as a
// real prompt's).
func longTokens(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"token_ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, 10000+i*7%140000)
	}
	b.WriteString(`],"max_tokens":1}`)
	return b.Bytes()
}

// TestLongRequestPastBusLimit: with the bus at 1 MB, requests of 1k, 100k
// and 1M token ids (7 MB) reach the worker byte for byte, and the large
// ones' envelopes stay small on the bus (what NATS received per request).
func TestLongRequestPastBusLimit(t *testing.T) {
	ns := natsDefaults(t)
	const path = "test.long.generate"
	got := make(chan *plane.Request, 1)
	caller := planetest.On(t, ns.ClientURL())
	w := planetest.Serve(t, planetest.On(t, ns.ClientURL()), path, func(w *planetest.Worker, req *plane.Request) {
		got <- req
		req.Complete()
	})
	c := planetest.Client(t, caller, path)
	planetest.WaitWorkers(t, c, w)
	for _, n := range []int{1000, 100_000, 1_000_000} {
		payload := longTokens(n)
		before, err := ns.Varz(nil)
		require.NoError(t, err)
		t0 := time.Now()
		s, err := c.Generate(payload, nil, plane.RoundRobin, 0)
		require.NoError(t, err)
		req := planetest.Recv(t, got, fmt.Sprintf("the request of %d tokens", n))
		took := time.Since(t0)
		_, _, err = planetest.Drain(s, 0)
		require.Equal(t, io.EOF, err)
		assert.True(t, bytes.Equal(payload, req.Payload), "%d tokens: the worker's request differs (%d bytes, sent %d)", n, len(req.Payload), len(payload))
		after, err := ns.Varz(nil)
		require.NoError(t, err)
		onBus := after.InBytes - before.InBytes
		t.Logf("%d tokens: %d bytes of request, %d bytes published on NATS, at the worker after %v", n, len(payload), onBus, took)
		if len(payload) > plane.InlineRequestBytes {
			assert.Less(t, onBus, int64(4<<10), "%d tokens: the request went through NATS", n)
		}
	}
}

// TestLongRequestKilled: a request killed while its bytes are on their way
// (before the worker has them, or as they arrive) never reaches the
// handler, or reaches it killed; either way the worker's place is free and
// the abort is confirmed whenever the caller counts it as aborted. Run it
// with -count=20: where the kill lands varies.
func TestLongRequestKilled(t *testing.T) {
	const path = "test.longkill.generate"
	got := make(chan *plane.Request, 4)
	host, w, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		got <- req
		<-req.Ctx.Killed()
	})
	confirmed := make(chan plane.AbortConfirmation, 4)
	unsub, err := host.OnAbortConfirmed(func(a plane.AbortConfirmation) { confirmed <- a })
	require.NoError(t, err)
	defer unsub()
	payload := longTokens(1_000_000)
	for _, delay := range []time.Duration{0, 200 * time.Microsecond, time.Millisecond, 3 * time.Millisecond} {
		parent := ctxtree.New("long-kill")
		s, err := c.Generate(payload, parent, plane.RoundRobin, 0)
		require.NoError(t, err)
		time.Sleep(delay)
		aborted := make(chan bool, 1)
		parent.Cancel(ctxtree.Killed, ctxtree.ReasonKill)
		s.KillOutcome(func(a bool) { aborted <- a })
		if planetest.Recv(t, aborted, "the kill's outcome") {
			a := planetest.Recv(t, confirmed, "the abort confirmation")
			assert.Equal(t, s.Key(), a.Key)
		}
		select {
		case req := <-got:
			<-req.Ctx.Killed() // it reached the handler before the kill
		default:
		}
		require.Eventually(t, func() bool { return w.EP.Active() == 0 }, planetest.WaitLimit, time.Millisecond,
			"delay %v: the killed request still holds its place", delay)
	}
}

// TestLongRequestMigrates: a long request whose worker dies mid-stream
// continues on another worker, which fetches the continued request (the
// prompt plus the tokens received) from the caller.
func TestLongRequestMigrates(t *testing.T) {
	e, w1, _, c := migTwo(t, migSendThenHang(3), (*migAttempt).finish)
	migPin(t, c, w1)
	const prompt = 30_000 // ~170 kB of token ids: fetched
	p := fmt.Sprintf(`{"token_ids":%s,"max_tokens":%d}`, strings.ReplaceAll(fmt.Sprint(planetest.Seq(0, prompt)), " ", ","), migMax)
	require.Greater(t, len(p), plane.InlineRequestBytes)
	s := e.generate(c, []byte(p), nil, plane.RoundRobin, 0, 1)
	a1 := e.attempt()
	require.Equal(t, "w1", a1.w.Name)
	require.Equal(t, prompt, len(a1.ids))
	got := migTake(t, s, 3)
	w1.RT.Close()
	rest, err := planetest.DrainTokens(t, s)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, planetest.Seq(prompt, migMax), append(got, rest...))
	a2 := e.attempt()
	require.Equal(t, "w2", a2.w.Name)
	assert.Equal(t, planetest.Seq(0, prompt+3), a2.ids, "the continued request")
	assert.Equal(t, migMax-3, a2.max)
}
