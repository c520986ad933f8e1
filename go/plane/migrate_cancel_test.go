package plane_test

// Migration and the ends that are never retried: a cancelled request, a
// handler's own error or stop; and a stop or kill of the caller reaching
// the current attempt, or landing between attempts (the harness:
// migrate_test.go).

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// A cancelled request is never retried: the kill reaches the worker, the
// stream just ends, and no new attempt starts although the limit allows it.
func TestMigrationCancelledNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		kill func(parent *ctxtree.Context, s *plane.Stream)
	}{
		{"parent killed", func(p *ctxtree.Context, _ *plane.Stream) { p.Kill() }},
		{"stream killed", func(_ *ctxtree.Context, s *plane.Stream) { s.Kill() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _, c := migTwo(t, migSendThenHang(2), migSendThenHang(2))

			parent := ctxtree.New("mig-cancel")
			s := e.generate(c, migPayload(false), parent, plane.RoundRobin, 0, 3)
			a := e.attempt()
			assert.Equal(t, planetest.Seq(migPrompt, 2), migTake(t, s, 2))

			tc.kill(parent, s)
			toks, err := planetest.DrainTokens(t, s)
			assert.Empty(t, toks)
			require.ErrorIs(t, err, io.EOF, "a cancelled stream just ends")

			planetest.Recv(t, a.req.Ctx.Killed(), "the worker's request to be killed")
			assert.Equal(t, ctxtree.ReasonKill, a.req.Ctx.Reason())
			assert.Equal(t, 1, e.callerAttempts(), "no retry after a cancel")
			e.noMoreAttempts()
		})
	}
}

// migEndedByHandler runs a request (migration limit 3) on two workers whose
// handler sends two tokens and, once the caller took them, ends its request
// with end; so the tests are about not retrying (an attempt that ends before
// migration relays it is TestMigrationKeepsItemsOfAttemptEndedBeforeRelay).
// It returns the attempt, the tokens the caller received and the stream's end.
func migEndedByHandler(t *testing.T, end func(a *migAttempt)) (e *migEnv, a *migAttempt, toks []int, err error) {
	t.Helper()
	behave := func(a *migAttempt) {
		if a.send(2) && a.await(a.proceed) {
			end(a)
		}
	}
	e, _, _, c := migTwo(t, behave, behave)
	s := e.generate(c, migPayload(false), nil, plane.RoundRobin, 0, 3)
	a = e.attempt()
	got := migTake(t, s, 2)
	close(a.proceed)
	rest, err := planetest.DrainTokens(t, s)
	return e, a, append(got, rest...), err
}

// A handler error is not retried: the caller gets the tokens, then the
// handler's error; the handler's context is neither stopped nor killed.
func TestMigrationHandlerErrorNotRetried(t *testing.T) {
	e, a, toks, err := migEndedByHandler(t, func(a *migAttempt) { a.req.Fail("ValueError: boom") })
	assert.Equal(t, planetest.Seq(migPrompt, 2), toks)
	var he *transport.HandlerError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, plane.HandlerErrorPrefix+"ValueError: boom", he.Message)
	assert.NotErrorIs(t, err, plane.ErrIncomplete)
	assert.Equal(t, 1, e.callerAttempts(), "a handler error is not retried")

	e.waitDone(a)
	migState(t, a.req.Ctx, ctxtree.Live, ctxtree.ReasonNone, "failed handler's context")
	e.noMoreAttempts()
}

// A handler that stops its own request and returns ends the stream with
// ErrStoppedByHandler ("Stream ended before generation completed"), which
// migration does not retry.
func TestMigrationHandlerStopNotRetried(t *testing.T) {
	e, a, toks, err := migEndedByHandler(t, func(a *migAttempt) {
		a.req.Ctx.StopGenerating()
		a.req.Complete()
	})
	assert.Equal(t, planetest.Seq(migPrompt, 2), toks)
	require.ErrorIs(t, err, transport.ErrStoppedByHandler)
	assert.ErrorIs(t, err, plane.ErrIncomplete, "it is reported as an incomplete stream")
	assert.True(t, strings.HasPrefix(err.Error(), "Stream ended before generation completed"), err.Error())
	assert.Equal(t, 1, e.callerAttempts(), "a deliberate stop is not retried")

	e.waitDone(a)
	migState(t, a.req.Ctx, ctxtree.Stopped, ctxtree.ReasonStopGenerating, "handler's context")
	e.noMoreAttempts()
}

// migBetweenAttempts runs a request (migration limit 3) whose first attempt,
// at w1, sends two tokens and crashes; cancel is applied to the request's
// parent between the attempts: as the second attempt's context is made
// (contexts made: 1 the request's, 2 the first attempt's, 3 the second
// attempt's), before it is linked and sent. It returns the tokens the
// caller received and the stream's end.
func migBetweenAttempts(t *testing.T, b2 func(a *migAttempt), cancel func(parent *ctxtree.Context)) (e *migEnv, w2 *planetest.Worker, toks []int, err error) {
	t.Helper()
	e, w1, w2, c := migTwo(t, migSendThenHang(2), b2)
	migPin(t, c, w1)
	parent := ctxtree.New("mig-between")
	hook := func(n int64) {
		if n == 3 {
			cancel(parent)
		}
	}
	e.onNew.Store(&hook)
	s := e.generate(c, migPayload(false), parent, plane.RoundRobin, 0, 3)
	require.Equal(t, "w1", e.attempt().w.Name)
	got := migTake(t, s, 2)
	w1.RT.Close()
	rest, err := planetest.DrainTokens(t, s)
	return e, w2, append(got, rest...), err
}

// A stop on the caller's parent reaches the worker of the current attempt,
// whether it lands during the second attempt or between the attempts; a
// kill between attempts ends the request without a further attempt.
func TestMigrationStopReachesCurrentAttempt(t *testing.T) {
	t.Run("during the second attempt", func(t *testing.T) {
		e := migSetup(t)
		w1 := e.worker("w1", migSendThenHang(2))
		w2 := e.worker("w2", func(a *migAttempt) {
			if !a.send(2) || !a.await(a.req.Ctx.Stopped()) || a.req.Ctx.IsKilled() {
				return
			}
			if a.send(1) { // what is produced after a stop still arrives
				a.req.Complete()
			}
		})
		c := e.connect(w1, w2)
		migPin(t, c, w1)

		parent := ctxtree.New("mig-stop-during")
		s := e.generate(c, migPayload(false), parent, plane.RoundRobin, 0, 3)
		a1 := e.attempt()
		require.Equal(t, "w1", a1.w.Name)
		got := migTake(t, s, 2)
		w1.RT.Close()
		a2 := e.attempt()
		require.Equal(t, "w2", a2.w.Name)
		got = append(got, migTake(t, s, 2)...)

		parent.StopGenerating()
		rest, err := planetest.DrainTokens(t, s)
		require.ErrorIs(t, err, io.EOF)
		assert.Equal(t, planetest.Seq(migPrompt, 5), append(got, rest...))

		e.waitDone(a2)
		migState(t, a2.req.Ctx, ctxtree.Stopped, ctxtree.ReasonStopGenerating, "second worker's request")
		assert.Equal(t, 2, e.callerAttempts())
		e.noMoreAttempts()
	})

	t.Run("stop between attempts", func(t *testing.T) {
		e, _, toks, err := migBetweenAttempts(t, migHonourStop, (*ctxtree.Context).StopGenerating)
		require.ErrorIs(t, err, io.EOF)
		assert.Equal(t, planetest.Seq(migPrompt, 2), toks)

		a2 := e.attempt()
		require.Equal(t, "w2", a2.w.Name)
		assert.Equal(t, planetest.Seq(0, migPrompt+2), a2.ids)
		e.waitDone(a2)
		migState(t, a2.req.Ctx, ctxtree.Stopped, ctxtree.ReasonStopGenerating, "second worker's request")
		assert.Equal(t, 2, e.callerAttempts())
		e.noMoreAttempts()
	})

	t.Run("kill between attempts", func(t *testing.T) {
		e, w2, toks, err := migBetweenAttempts(t, migSendThenHang(0), (*ctxtree.Context).Kill)
		require.ErrorIs(t, err, io.EOF)
		assert.Equal(t, planetest.Seq(migPrompt, 2), toks)
		assert.Equal(t, 2, e.callerAttempts(), "no attempt after the kill")

		// The second attempt was acknowledged by w2; once w2 is done with it,
		// if its handler saw it at all, it saw it killed.
		require.Eventually(t, func() bool { return plane.NumServing(w2.EP) == 0 }, planetest.WaitLimit, 5*time.Millisecond)
		select {
		case a2 := <-e.attempts:
			assert.Equal(t, "w2", a2.w.Name)
			assert.True(t, a2.req.Ctx.IsKilled(), "second worker's request is killed")
		default:
		}
		e.noMoreAttempts()
	})
}

// docs/design.md, section 3: a context already stopped before generate is
// called gives no items, and the handler's context is stopped, not killed;
// with a migration limit too (section 5 only forbids *new* attempts).
func TestMigrationAlreadyStoppedParentReachesWorker(t *testing.T) {
	e := migSetup(t)
	w := e.worker("w", migHonourStop)
	c := e.connect(w)

	parent := ctxtree.New("mig-already-stopped")
	parent.StopGenerating()
	s := e.generate(c, migPayload(false), parent, plane.Direct, w.EP.InstanceID(), 1)
	toks, err := planetest.DrainTokens(t, s)
	assert.Empty(t, toks)
	require.ErrorIs(t, err, io.EOF)
	a := e.attempt()
	e.waitDone(a)
	migState(t, a.req.Ctx, ctxtree.Stopped, ctxtree.ReasonStopGenerating, "handler's context")
}

// An attempt whose whole response (items, then a handler error) has arrived
// by the time migration looks at it: the caller must still get the items
// before the error, as without migration. A stand-in worker on the request
// subject sends the response before it acknowledges the request, which makes
// that ordering likely; the request is repeated to make it near certain.
func TestMigrationKeepsItemsOfAttemptEndedBeforeRelay(t *testing.T) {
	e := migSetup(t)
	wrt := planetest.Join(t, e.host)
	const id = 0xfa4e
	var (
		mu   sync.Mutex
		outs []*transport.Outgoing
	)
	sub, err := wrt.Bus().Conn().Subscribe(discovery.RequestSubject(migPath, id), func(m *nats.Msg) {
		var env struct{ Addr, Token string }
		if json.Unmarshal(m.Data, &env) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), planetest.WaitLimit)
		defer cancel()
		out, err := transport.Dial(ctx, env.Addr, env.Token)
		if err != nil {
			t.Errorf("dial: %v", err)
			return
		}
		mu.Lock()
		outs = append(outs, out)
		mu.Unlock()
		if _, err := out.SendBatch(ctx, [][]byte{[]byte(`{"token_ids":[5]}`), []byte(`{"token_ids":[6]}`)}); err != nil {
			t.Errorf("send: %v", err)
		}
		_ = out.Fail(plane.HandlerErrorPrefix + "ValueError: boom")
		_ = m.Respond([]byte(`{}`))
	})
	require.NoError(t, err)
	require.NoError(t, wrt.Bus().Conn().Flush())
	t.Cleanup(func() {
		_ = sub.Unsubscribe()
		mu.Lock()
		defer mu.Unlock()
		for _, o := range outs {
			_ = o.Close()
			planetest.Recv(t, o.Done(), "the stand-in worker's stream to be released")
		}
	})

	c := e.connect()
	// Control: without migration the same responses keep their items.
	for i := 0; i < 20; i++ {
		s, err := c.Generate(migPayload(false), nil, plane.Direct, id)
		require.NoError(t, err)
		toks, err := planetest.DrainTokens(t, s)
		var he *transport.HandlerError
		require.ErrorAs(t, err, &he)
		require.Equal(t, planetest.Seq(migPrompt, 2), toks, "without migration, request %d", i)
	}
	lost := 0
	for i := 0; i < 20; i++ {
		s, err := c.GenerateMigrating(migPayload(false), nil, plane.Direct, id, 1)
		require.NoError(t, err)
		toks, err := planetest.DrainTokens(t, s)
		var he *transport.HandlerError
		require.ErrorAs(t, err, &he)
		if len(toks) != 2 {
			lost++
		}
	}
	assert.Zero(t, lost, "requests out of 20 whose items were lost")
}
