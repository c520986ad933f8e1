package planetest_test

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestArmedFiresOnceWithoutBlocking(t *testing.T) {
	f, ch := planetest.Armed()
	f()
	f() // the channel is full: does not block
	planetest.Recv(t, ch, "the first call")
	select {
	case <-ch:
		t.Fatal("two signals for two calls before a receive")
	default:
	}
	assert.NoError(t, planetest.WaitArm(func(f func()) { f() }))
}

func TestParseTokenRequest(t *testing.T) {
	for _, tc := range []struct {
		payload string
		want    planetest.TokenRequest
	}{
		{`{"token_ids":[1,2],"max_tokens":3}`, planetest.TokenRequest{TokenIDs: []int{1, 2}, MaxTokens: 3}},
		{`{"token_ids":[1],"stop_conditions":{"max_tokens":4}}`, planetest.TokenRequest{TokenIDs: []int{1}, MaxTokens: 4}},
		{`{"max_tokens":9,"stop_conditions":{"max_tokens":4}}`, planetest.TokenRequest{MaxTokens: 4}},
		{`{"token_ids":[7],"stop_conditions":{}}`, planetest.TokenRequest{TokenIDs: []int{7}, MaxTokens: -1}},
		{`{}`, planetest.TokenRequest{MaxTokens: -1}},
	} {
		got, err := planetest.ParseTokenRequest([]byte(tc.payload))
		require.NoError(t, err, tc.payload)
		assert.Equal(t, tc.want, got, tc.payload)
	}
	for _, bad := range []string{``, `[1]`, `{"token_ids":"x"}`} {
		_, err := planetest.ParseTokenRequest([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestTokenItemsAndSeq(t *testing.T) {
	assert.JSONEq(t, `{"token_ids":[3],"finish_reason":null}`, string(planetest.TokenItem(3, "")))
	assert.JSONEq(t, `{"token_ids":[4],"finish_reason":"length"}`, string(planetest.TokenItem(4, "length")))
	items := [][]byte{planetest.TokenItem(5, ""), []byte(`{"token_ids":[6,7]}`)}
	assert.Equal(t, []int{5, 6, 7}, planetest.TokenIDs(t, items))
	assert.Equal(t, []int{}, planetest.TokenIDs(t, nil))
	assert.Equal(t, []int{2, 3, 4}, planetest.Seq(2, 3))
	assert.Empty(t, planetest.Seq(2, 0))
}

// A request plane as the tests use it: a worker runtime joining the host
// serves the token engine; the caller's tokens continue the prompt.
func TestServeTokens(t *testing.T) {
	const path = "planetest.tokens.generate"
	host := planetest.Embedded(t)
	var accepted atomic.Int32
	w := planetest.Serve(t, planetest.Join(t, host), path, planetest.Tokens,
		planetest.Named("tok"), planetest.WithMetadata([]byte(`{"model":"m"}`)),
		planetest.OnAccept(func(*planetest.Worker, *plane.Request) { accepted.Add(1) }))
	assert.Equal(t, "tok", w.Name)
	c := planetest.Client(t, host, path)
	assert.Equal(t, []uint64{w.EP.InstanceID()}, planetest.WaitInstances(t, c, 1))
	planetest.WaitWorkers(t, c, w)
	assert.JSONEq(t, `{"model":"m"}`, string(c.Instances()[0].Meta))

	s := planetest.Generate(t, c, `{"token_ids":[0,1],"stop_conditions":{"max_tokens":4}}`, ctxtree.New("tok-1"))
	got, err := planetest.DrainTokens(t, s)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, planetest.Seq(2, 4), got)
	req := w.NextReq(t)
	assert.Equal(t, "tok-1", req.ID)
	assert.EqualValues(t, 1, accepted.Load())

	// Take stops at n; the last token carries the finish reason.
	s = planetest.GenerateRoute(t, c, `{"max_tokens":3}`, nil, plane.Direct, w.EP.InstanceID())
	items, err := planetest.Take(s, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, planetest.TokenIDs(t, items))
	items, batches, err := planetest.Drain(s, 1)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, []int{1}, batches)
	assert.JSONEq(t, `{"token_ids":[2],"finish_reason":"length"}`, string(items[0]))

	// A payload that is not a token request fails.
	_, err = planetest.DrainTokens(t, planetest.Generate(t, c, `[1]`, nil))
	assert.ErrorContains(t, err, "ValueError")
}

// Send reports a kill; a handler that waits on the test gives up when the
// worker quits at cleanup; the worker completes what its handler leaves.
func TestWorkerSendKillAndQuit(t *testing.T) {
	const path = "planetest.kill.generate"
	host := planetest.Embedded(t)
	killed := make(chan bool, 1)
	var quitReturned atomic.Bool
	planetest.Serve(t, host, path, func(w *planetest.Worker, req *plane.Request) {
		switch string(req.Payload) {
		case `"flood"`:
			for w.Send(req, []byte(`1`)) {
			}
			killed <- req.Ctx.IsKilled()
		}
		// "done": returns at once, the loop completes the request.
	})
	c := planetest.Client(t, host, path)
	planetest.WaitInstances(t, c, 1)

	s := planetest.Generate(t, c, `"done"`, nil)
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	assert.Empty(t, items)

	s = planetest.Generate(t, c, `"flood"`, nil)
	_, err = planetest.Take(s, 1)
	require.NoError(t, err)
	s.Kill()
	assert.True(t, planetest.Recv(t, killed, "Send to report the kill"))

	t.Run("quit at cleanup", func(t *testing.T) {
		w := planetest.Serve(t, planetest.Join(t, host), path, func(w *planetest.Worker, req *plane.Request) {
			<-w.Quit
			quitReturned.Store(true)
		})
		planetest.WaitWorkers(t, c, w)
		s := planetest.GenerateRoute(t, c, `"wait"`, nil, plane.Direct, w.EP.InstanceID())
		require.NoError(t, planetest.WaitStarted(s))
		w.NextReq(t)
		t.Cleanup(s.Kill)
	})
	assert.True(t, quitReturned.Load(), "the handler waiting on Quit returned at the worker's cleanup")
}

// Two request planes in one test: the leak check is registered once, by the
// first, so that it runs after both closed.
func TestTwoEmbeddedInOneTest(t *testing.T) {
	a, b := planetest.Embedded(t), planetest.Embedded(t)
	assert.NotEqual(t, a.Bus().URL(), b.Bus().URL())
}

func TestWaits(t *testing.T) {
	ch := make(chan struct{})
	close(ch)
	planetest.Recv(t, ch, "a closed channel")
	assert.True(t, planetest.ClosedWithin(ch))
	assert.True(t, planetest.GoroutineGone("planetest_test.neverRunning", time.Second))
	started, done := make(chan struct{}), make(chan struct{})
	go neverReturns(started, done)
	<-started
	assert.False(t, planetest.GoroutineGone("planetest_test.neverReturns", 50*time.Millisecond))
	close(done)
	assert.True(t, planetest.GoroutineGone("planetest_test.neverReturns", planetest.WaitLimit))
	assert.Regexp(t, planetest.UUID, ctxtree.NewID())
}

//go:noinline
func neverReturns(started chan<- struct{}, done <-chan struct{}) {
	close(started)
	<-done
}
