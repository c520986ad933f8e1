package plane_test

// Request identity and forged messages, as an attacker would try them: the
// keys the plane makes, the payload bound, and what a stranger on the bus
// can send a worker.

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		k := plane.NewKey()
		require.True(t, plane.ValidKey(k), "key %q", k)
		require.False(t, seen[k], "a key repeated")
		seen[k] = true
	}
	for _, k := range []string{"", "abc", strings.Repeat("A", 32), strings.Repeat("g", 32), strings.Repeat("0", 33)} {
		assert.False(t, plane.ValidKey(k), "key %q", k)
	}
}

func TestValidateID(t *testing.T) {
	for _, id := range []string{"a", "req-1", strings.Repeat("x", plane.MaxIDLen), "réq-日本-🙂", "with space"} {
		assert.NoError(t, plane.ValidateID(id), "id %q", id)
	}
	for _, id := range []string{"", strings.Repeat("x", plane.MaxIDLen+1), "a\x00b", "a\nb", "a\tb", "\x7f", "\xff", "\xc0\xaf", "\xed\xa0\x80", "\u200b"} {
		assert.ErrorIs(t, plane.ValidateID(id), plane.ErrInvalidID, "id %q", id)
	}
}

// TestKeyPerRequest: two requests with the same id have different keys; the
// worker's request carries the caller's key, and every migration attempt of
// one request carries the same key.
func TestKeyPerRequest(t *testing.T) {
	const path = "test.keys.generate"
	got := make(chan *plane.Request, 4)
	_, w, c := planetest.ServeAndConnect(t, path, planetest.Hold(got))

	a := planetest.Generate(t, c, `"a"`, ctxtree.New("same"))
	b := planetest.Generate(t, c, `"b"`, ctxtree.New("same"))
	ra, rb := planetest.Recv(t, got, "a"), planetest.Recv(t, got, "b")
	if string(ra.Payload) != `"a"` {
		ra, rb = rb, ra
	}
	assert.Equal(t, "same", ra.ID)
	assert.Equal(t, "same", rb.ID)
	assert.NotEqual(t, a.Key(), b.Key())
	assert.Equal(t, a.Key(), ra.Key)
	assert.Equal(t, b.Key(), rb.Key)
	assert.Equal(t, w.EP.InstanceID(), a.Instance())
	a.Kill()
	require.True(t, planetest.ClosedWithin(ra.Ctx.Killed()))
	assert.False(t, rb.Ctx.IsKilled(), "killing one request killed the other with the same id")
	b.Kill()
	require.True(t, planetest.ClosedWithin(rb.Ctx.Killed()))

	// Migration: the first attempt goes to an instance that does not exist
	// (no responders), the retry to the worker, with the same key.
	m, err := c.GenerateMigrating([]byte(`"m"`), ctxtree.New("mig"), plane.Direct, 12345, 2)
	require.NoError(t, err)
	rm := planetest.Recv(t, got, "the migrated request")
	assert.Equal(t, m.Key(), rm.Key)
	assert.Equal(t, "mig", rm.ID)
	assert.Equal(t, w.EP.InstanceID(), m.Instance(), "Instance is the current attempt's")
	m.Kill()
	require.True(t, planetest.ClosedWithin(rm.Ctx.Killed()))
}

// TestErrTooLarge: a request over plane.MaxRequestBytes is refused
// before anything is sent, with and without migration; one just under the
// bus's limit, and one over it, go through.
func TestErrTooLarge(t *testing.T) {
	const path = "test.large.generate"
	got := make(chan *plane.Request, 1)
	host, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) { got <- req })
	big := make([]byte, plane.MaxRequestBytes+1) // untouched: refused on its size
	_, err := c.Generate(big, nil, plane.RoundRobin, 0)
	require.ErrorIs(t, err, plane.ErrTooLarge)
	assert.Contains(t, err.Error(), fmt.Sprint(plane.MaxRequestBytes))
	_, err = c.GenerateMigrating(big, nil, plane.RoundRobin, 0, 3)
	require.ErrorIs(t, err, plane.ErrTooLarge)
	// An id that is not valid is refused too.
	_, err = c.Generate([]byte(`1`), ctxtree.New("bad\x00id"), plane.RoundRobin, 0)
	require.ErrorIs(t, err, plane.ErrInvalidID)
	select {
	case req := <-got:
		t.Fatalf("a refused request reached the worker: %s", req.ID)
	case <-time.After(50 * time.Millisecond):
	}
	max := int(host.Bus().Conn().MaxPayload())
	for _, n := range []int{max / 2, max + 1} {
		payload := `"` + strings.Repeat("y", n) + `"`
		s := planetest.Generate(t, c, payload, nil)
		req := planetest.Recv(t, got, "the request")
		assert.Equal(t, payload, string(req.Payload))
		req.Complete()
		_, _, err = planetest.Drain(s, 0)
		assert.Equal(t, io.EOF, err)
	}
}

// TestForgedEnvelopes: a process on the bus (with the embedded server's
// token) sends a worker malformed or forged envelopes. Each is refused with
// an acknowledgement naming it malformed (or ignored, without a reply
// subject); no handler runs, nothing panics, no goroutine is left behind
// (planetest.Embedded checks).
func TestForgedEnvelopes(t *testing.T) {
	const path = "test.forged.generate"
	got := make(chan *plane.Request, 4)
	host, w, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) { got <- req })
	nc, subject := strangerOnBus(t, host, path, w)

	key, token := plane.NewKey(), plane.NewKey()
	env := func(mut func(m map[string]any)) []byte {
		m := map[string]any{"id": "forged", "key": key, "addr": "127.0.0.1:1", "token": token, "request": 1}
		mut(m)
		b, _ := json.Marshal(m)
		return b
	}
	cases := map[string][]byte{
		"empty":          nil,
		"not JSON":       []byte("{"),
		"deep JSON":      []byte(strings.Repeat("[", 100000)),
		"array":          []byte("[1,2]"),
		"no key":         env(func(m map[string]any) { delete(m, "key") }),
		"short key":      env(func(m map[string]any) { m["key"] = "abc" }),
		"key not hex":    env(func(m map[string]any) { m["key"] = strings.Repeat("z", 32) }),
		"key a number":   env(func(m map[string]any) { m["key"] = 5 }),
		"no token":       env(func(m map[string]any) { delete(m, "token") }),
		"long token":     env(func(m map[string]any) { m["token"] = strings.Repeat("a", 1<<16) }),
		"no id":          env(func(m map[string]any) { delete(m, "id") }),
		"long id":        env(func(m map[string]any) { m["id"] = strings.Repeat("i", plane.MaxIDLen+1) }),
		"id control":     env(func(m map[string]any) { m["id"] = "a\x00" }),
		"no addr":        env(func(m map[string]any) { delete(m, "addr") }),
		"addr no port":   env(func(m map[string]any) { m["addr"] = "127.0.0.1" }),
		"state 9":        env(func(m map[string]any) { m["state"] = 9 }),
		"state negative": env(func(m map[string]any) { m["state"] = -1 }),
		"no request":     env(func(m map[string]any) { delete(m, "request") }),
	}
	for name, data := range cases {
		msg, err := nc.Request(subject, data, planetest.WaitLimit)
		require.NoError(t, err, name)
		assert.Contains(t, string(msg.Data), "malformed request envelope", name)
	}
	// Without a reply subject (a plane always waits for its acknowledgement):
	// ignored, even when well formed.
	require.NoError(t, nc.Publish(subject, env(func(map[string]any) {})))
	require.NoError(t, nc.Flush())
	// Well formed, pointing at an address where no caller listens: the
	// worker acknowledges, fails to connect and drops it; no handler runs.
	msg, err := nc.Request(subject, env(func(map[string]any) {}), planetest.WaitLimit)
	require.NoError(t, err)
	assert.NotContains(t, string(msg.Data), "malformed")
	select {
	case req := <-got:
		t.Fatalf("a forged request reached the handler: %+v", req.ID)
	case <-time.After(200 * time.Millisecond):
	}
	// The worker still serves.
	s := planetest.Generate(t, c, `1`, nil)
	planetest.Recv(t, got, "a real request")
	_, _, err = planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
}

// TestCompletedBeforeTaken: a stream whose final frame arrived is Completed
// although its items are not taken yet (a client leaving then cancelled
// nothing: the frontend does not count it); a killed one is not.
func TestCompletedBeforeTaken(t *testing.T) {
	const path = "test.completed.generate"
	_, _, c := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {
		if string(req.Payload) == "2" { // until killed
			<-req.Ctx.Killed()
			return
		}
		for i := range 3 {
			if !w.Send(req, num(i)) {
				return
			}
		}
	})

	s := planetest.Generate(t, c, `1`, nil)
	require.Eventually(t, s.Completed, planetest.WaitLimit, time.Millisecond, "the final frame arrives")
	items, _, err := planetest.Drain(s, 0)
	assert.Equal(t, io.EOF, err)
	requireSeq(t, items, 0, 3)
	assert.True(t, s.Completed())

	parent := ctxtree.New("completed-killed")
	s = planetest.Generate(t, c, `2`, parent)
	require.NoError(t, planetest.WaitStarted(s))
	parent.Cancel(ctxtree.Killed, ctxtree.ReasonKill)
	_, _, _ = planetest.Drain(s, 0)
	assert.False(t, s.Completed(), "a killed stream did not complete")
}

// strangerOnBus connects a plain NATS client to host's bus (with the
// embedded server's token) and returns it with the subject of w's requests.
func strangerOnBus(t *testing.T, host *plane.Runtime, path string, w *planetest.Worker) (*nats.Conn, string) {
	t.Helper()
	opts, err := natsbus.ClientAuth(host.Bus().URL())
	require.NoError(t, err)
	nc, err := nats.Connect(host.Bus().URL(), opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, discovery.RequestSubject(path, w.EP.InstanceID())
}

// No goroutine reading an envelope outlives Endpoint.Close (envelopes are
// read on several goroutines, not on the subscription's).
func TestEndpointCloseWaitsForEnvelopeReaders(t *testing.T) {
	const path = "test.closereaders.generate"
	host, w, _ := planetest.ServeAndConnect(t, path, func(w *planetest.Worker, req *plane.Request) {})
	nc, subject := strangerOnBus(t, host, path, w)
	big := strings.Repeat("x", 1<<20)
	env, _ := json.Marshal(map[string]any{"id": "r", "key": plane.NewKey(), "addr": "127.0.0.1:1", "token": plane.NewKey(), "request": big})
	for range 32 {
		require.NoError(t, nc.PublishRequest(subject, nats.NewInbox(), env))
	}
	require.NoError(t, nc.Flush())
	w.EP.Close()
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	// A frame of receive, not a "created by" line: the handlers of the
	// envelopes read before Close (Request.run) may still be ending.
	require.NotContains(t, stacks, "(*Endpoint).receive(")
}
