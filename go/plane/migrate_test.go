package plane_test

// Tests of migration (docs/design.md, section 5) with real in-process runtimes: the
// first runtime of a test embeds NATS on an ephemeral port and is the caller;
// every worker is a runtime of its own that joins it, so that closing a
// worker's runtime is that worker crashing. A worker's handler reads
// {"token_ids": [...], "max_tokens": N} (or stop_conditions.max_tokens) and
// answers {"token_ids": [k]} items where k is the position of the token in
// the sequence (the next token is len(token_ids)), so continuity is checkable
// on both sides: the caller's tokens are prompt, prompt+1, ... and every
// worker's token_ids are 0, 1, 2, ...
//
// Helpers are prefixed with "mig": they are about the requests of this file
// and of migrate_cancel_test.go.

import (
	"encoding/json"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

const (
	migPath   = "mig.backend.generate"
	migPrompt = 5  // prompt token_ids are 0..4
	migMax    = 10 // max_tokens: the caller expects tokens 5..14
)

// --- runtimes and workers ---------------------------------------------------

// migEnv is one test's request plane: the caller's runtime (hosting NATS)
// and the attempts that reached the workers' handlers, in arrival order.
type migEnv struct {
	t    *testing.T
	host *plane.Runtime
	// made counts the contexts the caller's runtime created: the request's
	// context plus one per attempt for GenerateMigrating, so made-1 is the
	// exact number of attempts once the stream has ended.
	made  atomic.Int64
	onNew atomic.Pointer[func(n int64)] // runs as the n-th context is made, before it is linked

	attempts chan *migAttempt
	seq      atomic.Int64
	byReq    sync.Map // *plane.Request -> its *migAttempt, from the accept loop to the handler
}

func migSetup(t *testing.T, opts ...planetest.Option) *migEnv {
	t.Helper()
	e := &migEnv{t: t, attempts: make(chan *migAttempt, 64)}
	e.host = planetest.Embedded(t, append([]planetest.Option{func(o *plane.Options) {
		o.NewContext = func(id string) *ctxtree.Context {
			c := ctxtree.New(id)
			n := e.made.Add(1)
			if f := e.onNew.Load(); f != nil {
				(*f)(n)
			}
			return c
		}
	}}, opts...)...)
	return e
}

// worker starts a worker process: its own runtime, one instance of migPath.
// Every request becomes an attempt, numbered and handed to the test in
// arrival order; its handler runs behave on it (or fails it with a
// ValueError when its payload is not a token request).
func (e *migEnv) worker(name string, behave func(a *migAttempt)) *planetest.Worker {
	t := e.t
	t.Helper()
	accept := func(w *planetest.Worker, req *plane.Request) {
		a := migParse(w, req, int(e.seq.Add(1)-1))
		e.byReq.Store(req, a)
		select {
		case e.attempts <- a:
		default:
			t.Errorf("more attempts than the test can hold")
		}
	}
	handle := func(_ *planetest.Worker, req *plane.Request) {
		v, _ := e.byReq.LoadAndDelete(req)
		a := v.(*migAttempt)
		if a.err != nil {
			req.Fail("ValueError: " + a.err.Error())
			return
		}
		behave(a)
	}
	return planetest.Serve(t, planetest.Join(t, e.host), migPath, handle, planetest.Named(name), planetest.OnAccept(accept))
}

// migAttempt is one request as a worker's handler received it.
type migAttempt struct {
	w    *planetest.Worker
	seq  int // arrival order across the test's workers
	req  *plane.Request
	ids  []int
	max  int // stop_conditions.max_tokens, else max_tokens, else -1
	err  error
	next int // the next token to send: len(ids) + sent
	sent int

	proceed chan struct{} // closed by the test to let the handler go on
	sentAll chan struct{} // closed by a handler once its tokens are queued
}

func migParse(w *planetest.Worker, req *plane.Request, seq int) *migAttempt {
	a := &migAttempt{w: w, seq: seq, req: req, max: -1,
		proceed: make(chan struct{}), sentAll: make(chan struct{})}
	p, err := planetest.ParseTokenRequest(req.Payload)
	if err != nil {
		a.err = err
		return a
	}
	a.ids, a.max, a.next = p.TokenIDs, p.MaxTokens, len(p.TokenIDs)
	return a
}

// send queues k more tokens of the sequence (see Worker.Send); false once
// the request is killed.
func (a *migAttempt) send(k int) bool {
	if !a.w.SendTokens(a.req, a.next, k, "") {
		return false
	}
	a.next += k
	a.sent += k
	return true
}

// finish sends the rest of max_tokens and completes: a healthy worker.
func (a *migAttempt) finish() {
	if a.send(a.max - a.sent) {
		a.req.Complete()
	}
}

// await waits for ch, the request's kill, or the end of the test; it
// reports whether ch fired.
func (a *migAttempt) await(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-a.req.Ctx.Killed():
		return false
	case <-a.w.Quit:
		return false
	}
}

func (a *migAttempt) waitKilled() {
	select {
	case <-a.req.Ctx.Killed():
	case <-a.w.Quit:
	}
}

// crash ends this request the way a worker going down does (Endpoint.Close
// kills every active request with ReasonShutdown): the stream ends without a
// final marker. Used where a whole runtime per attempt would make routing
// depend on discovery timing.
func (a *migAttempt) crash() { a.req.Ctx.Cancel(ctxtree.Killed, ctxtree.ReasonShutdown) }

// --- the caller's side ------------------------------------------------------

// migTwo starts a test's request plane with workers "w1" and "w2", which
// behave as b1 and b2, and the caller's client, which knows both.
func migTwo(t *testing.T, b1, b2 func(a *migAttempt)) (e *migEnv, w1, w2 *planetest.Worker, c *plane.Client) {
	t.Helper()
	e = migSetup(t)
	w1, w2 = e.worker("w1", b1), e.worker("w2", b2)
	return e, w1, w2, e.connect(w1, w2)
}

// connect makes the caller's client and waits until it knows every one of ws.
func (e *migEnv) connect(ws ...*planetest.Worker) *plane.Client {
	e.t.Helper()
	c := planetest.Client(e.t, e.host, migPath)
	planetest.WaitWorkers(e.t, c, ws...)
	return c
}

// migPin makes c's next round-robin pick w (and the one after it the other
// of two instances, whether or not w is still listed then).
func migPin(t *testing.T, c *plane.Client, w *planetest.Worker) {
	t.Helper()
	i := slices.Index(c.InstanceIDs(), w.EP.InstanceID())
	require.GreaterOrEqual(t, i, 0, "worker %s is not known", w.Name)
	plane.SetRoundRobin(c, i)
}

func (e *migEnv) generate(c *plane.Client, payload []byte, parent *ctxtree.Context, route plane.Route, instance uint64, limit int) *plane.Stream {
	e.t.Helper()
	s, err := c.GenerateMigrating(payload, parent, route, instance, limit)
	require.NoError(e.t, err)
	e.t.Cleanup(s.Kill) // releases it if the test failed half-way
	return s
}

// attempt returns the next attempt that reached a worker's handler.
func (e *migEnv) attempt() *migAttempt {
	e.t.Helper()
	return planetest.Recv(e.t, e.attempts, "an attempt to reach a worker")
}

func (e *migEnv) noMoreAttempts() {
	e.t.Helper()
	select {
	case a := <-e.attempts:
		e.t.Errorf("unexpected attempt %d at worker %s: %s", a.seq, a.w.Name, a.req.Payload)
	default:
	}
}

// callerAttempts is the number of attempts GenerateMigrating made (exact
// once its stream has ended: the stream ends after the last decision).
func (e *migEnv) callerAttempts() int { return int(e.made.Load()) - 1 }

// waitDone waits until the worker's side of a's request is over (its
// response stream closed), so that its context can no longer change.
func (e *migEnv) waitDone(a *migAttempt) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return !plane.Serving(a.w.EP, a.req) },
		planetest.WaitLimit, 5*time.Millisecond, "request %d at %s never ended", a.seq, a.w.Name)
}

func migState(t *testing.T, c *ctxtree.Context, want ctxtree.State, reason ctxtree.Reason, what string) {
	t.Helper()
	st, r := c.State()
	assert.Equal(t, want, st, "%s: state", what)
	assert.Equal(t, reason, r, "%s: reason", what)
}

// migTake takes exactly n tokens; the stream must not end before.
func migTake(t *testing.T, s *plane.Stream, n int) []int {
	t.Helper()
	items, err := planetest.Take(s, n)
	require.NoError(t, err, "the stream ended after %d of %d tokens", len(items), n)
	return planetest.TokenIDs(t, items)
}

// migPayload is the request: prompt 0..migPrompt-1, migMax new tokens, with
// max_tokens at the top level or under stop_conditions (Dynamo's shape).
func migPayload(nested bool) []byte {
	p := map[string]any{"token_ids": planetest.Seq(0, migPrompt), "max_tokens": migMax}
	if nested {
		delete(p, "max_tokens")
		p["stop_conditions"] = map[string]any{"max_tokens": migMax}
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	return b
}

// --- behaviours -------------------------------------------------------------

// migSendThenHang sends k tokens and then waits to be killed: the worker
// the test is about to crash, or a request the caller cancels.
func migSendThenHang(k int) func(a *migAttempt) {
	return func(a *migAttempt) {
		if a.send(k) {
			close(a.sentAll)
		}
		a.waitKilled()
	}
}

// migHonourStop is a healthy worker that honours a stop: it completes with
// no more tokens once its context is stopped.
func migHonourStop(a *migAttempt) {
	if a.req.Ctx.IsStopped() {
		a.req.Complete()
		return
	}
	a.finish()
}

// --- tests ------------------------------------------------------------------

// Limit 0: the first attempt is the only one; the broken stream's error is
// what the caller sees, after the tokens that arrived, although another
// worker is up.
func TestMigrationLimitZeroSurfacesBrokenStream(t *testing.T) {
	for _, tc := range []struct {
		name      string
		migrating bool // GenerateMigrating(limit 0), else Generate with no client limit
	}{{"GenerateMigrating limit 0", true}, {"Generate without a limit", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _, c := migTwo(t, migSendThenHang(2), migSendThenHang(2))

			var s *plane.Stream
			if tc.migrating {
				s = e.generate(c, migPayload(false), nil, plane.RoundRobin, 0, 0)
			} else {
				var err error
				s, err = c.Generate(migPayload(false), nil, plane.RoundRobin, 0)
				require.NoError(t, err)
				t.Cleanup(s.Kill)
			}
			a := e.attempt()
			assert.Equal(t, planetest.Seq(migPrompt, 2), migTake(t, s, 2))

			a.w.RT.Close() // the worker crashes mid-stream
			toks, err := planetest.DrainTokens(t, s)
			assert.Empty(t, toks)
			require.ErrorIs(t, err, plane.ErrIncomplete)
			assert.NotErrorIs(t, err, transport.ErrStoppedByHandler)
			assert.Equal(t, "Stream ended before generation completed", err.Error())

			migState(t, a.req.Ctx, ctxtree.Killed, ctxtree.ReasonShutdown, "crashed worker's request")
			if tc.migrating {
				assert.Equal(t, 1, e.callerAttempts(), "limit 0: one attempt")
			} else {
				assert.EqualValues(t, 1, e.made.Load(), "Generate without a limit: a single request")
			}
			e.noMoreAttempts()
		})
	}
}

// A new request that reaches no worker (the chosen instance is still listed
// but gone: no responders) is retried, unchanged, on another worker; the
// client's migration limit applies to Generate.
func TestMigrationNoRespondersRetriedOnAnotherWorker(t *testing.T) {
	e, dead, live, c := migTwo(t, (*migAttempt).finish, (*migAttempt).finish)

	// The dead worker stops receiving while its lease still lists it: a
	// worker that died before its lease expired.
	require.NoError(t, plane.StopReceiving(dead.EP))
	require.NoError(t, dead.RT.Bus().Conn().Flush())

	c.SetMigrationLimit(1)
	migPin(t, c, dead)
	payload := migPayload(false)
	s, err := c.Generate(payload, nil, plane.RoundRobin, 0)
	require.NoError(t, err)
	t.Cleanup(s.Kill)

	toks, err := planetest.DrainTokens(t, s)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, planetest.Seq(migPrompt, migMax), toks)

	a := e.attempt()
	assert.Equal(t, live.Name, a.w.Name)
	assert.JSONEq(t, string(payload), string(a.req.Payload), "no token was received: the request is resent as is")
	assert.Equal(t, 2, e.callerAttempts(), "the attempt to the dead worker, then the retry")
	e.noMoreAttempts()
}

// No responders on every attempt: the error surfaces after limit+1 attempts.
func TestMigrationNoRespondersLimitExhausted(t *testing.T) {
	e := migSetup(t)
	c := e.connect()
	const limit = 2
	s := e.generate(c, migPayload(false), nil, plane.Direct, 0x5eadbeef, limit)

	toks, err := planetest.DrainTokens(t, s)
	assert.Empty(t, toks)
	require.ErrorIs(t, err, plane.ErrNoResponders)
	assert.ErrorIs(t, s.Started(), plane.ErrNoResponders, "the request never started")
	assert.Equal(t, limit+1, e.callerAttempts())
}

// A worker crashes (its runtime closes) after some tokens while a second
// worker is up: the caller's stream is one continuous sequence, and the
// second worker received token_ids extended by exactly the tokens received
// and max_tokens (where the request had it) reduced by their number.
func TestMigrationOngoingContinuesOnSecondWorker(t *testing.T) {
	for _, nested := range []bool{false, true} {
		name := "max_tokens"
		if nested {
			name = "stop_conditions.max_tokens"
		}
		t.Run(name, func(t *testing.T) {
			e, w1, _, c := migTwo(t, migSendThenHang(3), (*migAttempt).finish)
			migPin(t, c, w1)

			s := e.generate(c, migPayload(nested), nil, plane.RoundRobin, 0, 1)
			a1 := e.attempt()
			require.Equal(t, "w1", a1.w.Name)
			got := migTake(t, s, 3)

			w1.RT.Close() // crash after the caller received 3 tokens
			rest, err := planetest.DrainTokens(t, s)
			require.ErrorIs(t, err, io.EOF, "the migrated stream ends normally")
			assert.Equal(t, planetest.Seq(migPrompt, migMax), append(got, rest...), "one stream: no token lost or repeated")

			a2 := e.attempt()
			require.Equal(t, "w2", a2.w.Name)
			assert.Equal(t, planetest.Seq(0, migPrompt+3), a2.ids, "token_ids extended by the 3 tokens received")
			assert.Equal(t, migMax-3, a2.max, "max_tokens reduced by 3")
			want := `{"token_ids":[0,1,2,3,4,5,6,7],"max_tokens":7}`
			if nested {
				want = `{"token_ids":[0,1,2,3,4,5,6,7],"stop_conditions":{"max_tokens":7}}`
			}
			assert.JSONEq(t, want, string(a2.req.Payload))

			migState(t, a1.req.Ctx, ctxtree.Killed, ctxtree.ReasonShutdown, "crashed worker's request")
			for _, a := range []*migAttempt{a1, a2} {
				assert.Equal(t, s.Context().ID(), a.req.ID, "request id of attempt %d", a.seq)
				assert.Equal(t, s.Context().ID(), a.req.Ctx.ID(), "context id of attempt %d", a.seq)
			}
			assert.Equal(t, 2, e.callerAttempts())
			e.noMoreAttempts()
		})
	}
}

// The plane knows no schema: without a continuation hook (the library
// installs the token schema's), a retry resends the request as it was.
func TestMigrationWithoutHookResendsUnchanged(t *testing.T) {
	e := migSetup(t, func(o *plane.Options) { o.Continuation = nil })
	w1, w2 := e.worker("w1", migSendThenHang(3)), e.worker("w2", (*migAttempt).finish)
	c := e.connect(w1, w2)
	migPin(t, c, w1)
	s := e.generate(c, migPayload(false), nil, plane.RoundRobin, 0, 1)
	require.Equal(t, "w1", e.attempt().w.Name)
	migTake(t, s, 3)
	w1.RT.Close()
	_, err := planetest.DrainTokens(t, s)
	require.ErrorIs(t, err, io.EOF)
	a2 := e.attempt()
	require.Equal(t, "w2", a2.w.Name)
	assert.JSONEq(t, string(migPayload(false)), string(a2.req.Payload))
}

// A stream that breaks after its last item (a finish reason, or every
// token max_tokens allows), as when a worker shuts down as the request
// finishes and its end frame is lost, is not migrated: there is nothing
// left to generate. The caller's stream ends as finished.
func TestMigrationEndsRequestWhoseLastItemArrived(t *testing.T) {
	for _, tc := range []struct {
		name, finish string
		n            int
	}{
		{"finish reason", "stop", 2},
		{"max_tokens reached without a finish reason", "", migMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w1, _, c := migTwo(t, func(a *migAttempt) {
				if a.w.SendTokens(a.req, a.next, tc.n, tc.finish) {
					close(a.sentAll)
				}
				a.waitKilled()
			}, (*migAttempt).finish)
			migPin(t, c, w1)
			s := e.generate(c, migPayload(true), nil, plane.RoundRobin, 0, 1)
			a1 := e.attempt()
			require.Equal(t, "w1", a1.w.Name)
			got := migTake(t, s, tc.n)
			w1.RT.Close()
			rest, err := planetest.DrainTokens(t, s)
			require.ErrorIs(t, err, io.EOF, "finished, not failed")
			assert.Empty(t, rest)
			assert.Equal(t, planetest.Seq(migPrompt, tc.n), got)
			assert.Equal(t, 1, e.callerAttempts(), "no second attempt")
			e.noMoreAttempts()
		})
	}
}

// The crash comes while the caller is not reading: whatever part of the
// first worker's tokens made it to the caller, the second worker continues
// from there and the caller still sees one continuous stream.
func TestMigrationOngoingContinuityWithoutReading(t *testing.T) {
	e, w1, _, c := migTwo(t, migSendThenHang(4), (*migAttempt).finish)
	migPin(t, c, w1)

	s := e.generate(c, migPayload(true), nil, plane.RoundRobin, 0, 1)
	a1 := e.attempt()
	require.Equal(t, "w1", a1.w.Name)
	planetest.Recv(t, a1.sentAll, "the first worker to queue its tokens")
	w1.RT.Close()

	toks, err := planetest.DrainTokens(t, s)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, planetest.Seq(migPrompt, migMax), toks, "one stream: no token lost or repeated")

	a2 := e.attempt()
	require.Equal(t, "w2", a2.w.Name)
	k := len(a2.ids) - migPrompt
	require.True(t, k >= 0 && k <= 4, "the second worker got %d extra token_ids", k)
	assert.Equal(t, planetest.Seq(0, migPrompt+k), a2.ids)
	assert.Equal(t, migMax-k, a2.max)
	e.noMoreAttempts()
}

// migCrashing serves one worker whose first crashes attempts each send one
// token, wait until the caller took it, then crash (later attempts finish),
// and runs a request to it (plane.Direct, so every attempt reaches that worker).
// It checks every attempt's payload, request id and context id.
func migCrashing(t *testing.T, parent *ctxtree.Context, limit, crashes int) (e *migEnv, s *plane.Stream, toks []int, err error) {
	t.Helper()
	e = migSetup(t)
	w := e.worker("w", func(a *migAttempt) {
		if a.seq >= crashes {
			a.finish()
			return
		}
		if a.send(1) && a.await(a.proceed) {
			a.crash()
		}
	})
	c := e.connect(w)
	s = e.generate(c, migPayload(false), parent, plane.Direct, w.EP.InstanceID(), limit)
	id := s.Context().ID()
	if parent != nil {
		assert.Equal(t, parent.ID(), id, "the request's context has the parent's id")
	}
	check := func(a *migAttempt, i int) {
		t.Helper()
		assert.Equal(t, i, a.seq)
		assert.Equal(t, planetest.Seq(0, migPrompt+i), a.ids, "attempt %d: token_ids", i)
		assert.Equal(t, migMax-i, a.max, "attempt %d: max_tokens", i)
		assert.Equal(t, id, a.req.ID, "attempt %d: request id", i)
		assert.Equal(t, id, a.req.Ctx.ID(), "attempt %d: context id", i)
	}
	for i := 0; i < crashes && i <= limit; i++ {
		a := e.attempt()
		check(a, i)
		toks = append(toks, migTake(t, s, 1)...)
		close(a.proceed)
	}
	if crashes <= limit {
		check(e.attempt(), crashes)
	}
	rest, err := planetest.DrainTokens(t, s)
	return e, s, append(toks, rest...), err
}

// Every attempt breaks: the error surfaces after limit+1 attempts, each of
// which reached the worker; the tokens received along the way form one
// continuous stream.
func TestMigrationLimitExhausted(t *testing.T) {
	const limit = 2
	e, _, toks, err := migCrashing(t, nil, limit, limit+1)
	require.ErrorIs(t, err, plane.ErrIncomplete)
	assert.NotErrorIs(t, err, transport.ErrStoppedByHandler)
	assert.Equal(t, planetest.Seq(migPrompt, limit+1), toks)
	assert.Equal(t, limit+1, e.callerAttempts())
	e.noMoreAttempts()
}

// Every attempt carries the request's id: the parent's when there is one,
// else the fresh id of the request's context. The last allowed attempt may
// succeed.
func TestMigrationRequestIDSameOnEveryAttempt(t *testing.T) {
	for _, withParent := range []bool{true, false} {
		name := "no parent"
		if withParent {
			name = "parent"
		}
		t.Run(name, func(t *testing.T) {
			var parent *ctxtree.Context
			if withParent {
				parent = ctxtree.New("mig-req-42")
			}
			e, s, toks, err := migCrashing(t, parent, 2, 2)
			require.ErrorIs(t, err, io.EOF)
			assert.Equal(t, planetest.Seq(migPrompt, migMax), toks)
			assert.NotEmpty(t, s.Context().ID())
			assert.Equal(t, 3, e.callerAttempts())
			e.noMoreAttempts()
		})
	}
}

// A request refused by an endpoint that is shutting down (Endpoint.Close
// marks it closed, then drops the lease, and only then unsubscribes, so a
// client still routes to it) reached no handler: like no responders, it is
// retried on another worker.
func TestMigrationRetriesRefusalByClosingEndpoint(t *testing.T) {
	e, closing, live, c := migTwo(t, (*migAttempt).finish, (*migAttempt).finish)

	// The window inside Endpoint.Close: closed, still subscribed and listed.
	plane.SetClosing(closing.EP, true)
	t.Cleanup(func() { plane.SetClosing(closing.EP, false) }) // before the worker's cleanup, so that Close runs fully

	migPin(t, c, closing)
	s := e.generate(c, migPayload(false), nil, plane.RoundRobin, 0, 1)
	toks, err := planetest.DrainTokens(t, s)
	require.ErrorIs(t, err, io.EOF)
	assert.Equal(t, planetest.Seq(migPrompt, migMax), toks)
	assert.Equal(t, live.Name, e.attempt().w.Name)
}
