package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frame"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestErrIncompleteText(t *testing.T) {
	assert.Equal(t, "Stream ended before generation completed", ErrIncomplete.Error())
	assert.ErrorIs(t, ErrNoConnection, ErrIncomplete)
	assert.NotErrorIs(t, ErrServerClosed, ErrIncomplete)
}

func TestNormalStream(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	finishAndRead(t, in, o, items(0, 100))
	_, err := in.Recv(ctx)
	assert.Equal(t, io.EOF, err, "the end is sticky")

	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Stopped()))
	assert.False(t, closed(o.Killed()))
	assert.False(t, closed(o.Lost()), "a normal end is not a loss")
	assert.ErrorIs(t, o.Send(ctx, item(0)), ErrClosed)
	assert.ErrorIs(t, o.Finish(), ErrClosed)
	assert.NoError(t, o.Close(), "Close after Finish is a no-op")
}

func TestSendBatch(t *testing.T) {
	s := listen(t, WithWindow(16)) // batches larger than the window must wait for credit
	in := expect(t, s, "tok")
	o := dial(t, s, "tok")
	var batch [][]byte
	for i := 0; i < 1000; i++ {
		batch = append(batch, item(i))
	}
	errc := make(chan error, 1)
	go func() {
		n, err := o.SendBatch(context.Background(), batch)
		if err == nil && n != len(batch) {
			err = fmt.Errorf("sent %d", n)
		}
		if err == nil {
			err = o.Finish()
		}
		errc <- err
	}()
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, items(0, 1000), got)
	require.NoError(t, <-errc)
	waitClosed(t, o.Done(), "Done")
}

// TrySendBatch sends what the credit allows and never waits: the rest is
// left to the caller, in order, and a dead stream is an error at once.
func TestTrySendBatch(t *testing.T) {
	s := listen(t, WithWindow(16))
	in := expect(t, s, "tok")
	ctx := context.Background()
	o, err := testDialer(t).Dial(ctx, s.Addr().String(), "tok") // a session's stream
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	var batch [][]byte
	for i := 0; i < 100; i++ {
		batch = append(batch, item(i))
	}
	var got []string
	for sent := 0; sent < len(batch); {
		n, err := o.TrySendBatch(batch[sent:])
		require.NoError(t, err)
		assert.LessOrEqual(t, n, 16, "more than the window at once")
		sent += n
		if n == 0 && sent == len(got) {
			time.Sleep(time.Millisecond) // the caller's first credit is on its way
		}
		if n == 0 {
			// Out of credit, and it did not wait: the credit comes back
			// as the caller reads.
			for range min(8, sent-len(got)) {
				b, err := in.Recv(ctx)
				require.NoError(t, err)
				got = append(got, string(b))
			}
		}
	}
	require.NoError(t, o.Finish())
	rest, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, items(0, 100), append(got, rest...))
}

// On a stream of its own connection, whose socket may make a write wait,
// it sends nothing; on a dead stream it fails at once.
func TestTrySendBatchOwnConnectionOrKilled(t *testing.T) {
	s := listen(t)
	in := expect(t, s, "tok")
	o, err := Dial(context.Background(), s.Addr().String(), "tok") // a connection of its own
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	require.Eventually(t, func() bool {
		select {
		case <-o.Attached():
			return true
		default:
			return false
		}
	}, 5*time.Second, time.Millisecond)
	n, err := o.TrySendBatch([][]byte{item(0)})
	assert.NoError(t, err)
	assert.Zero(t, n)
	in.Kill()
	waitClosed(t, o.Killed(), "Killed")
	_, err = o.TrySendBatch([][]byte{item(0)})
	assert.ErrorIs(t, err, ErrKilled)
}

func TestStop(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	for i := 0; i < 3; i++ {
		b, err := in.Recv(ctx)
		require.NoError(t, err)
		assert.Equal(t, string(item(i)), string(b))
	}
	in.Stop()
	in.Stop() // at most once on the wire (see TestControlFramesOnWire)
	waitClosed(t, o.Stopped(), "Stopped")
	// Data keeps flowing after Stop.
	for i := 10; i < 15; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	finishAndRead(t, in, o, items(3, 15), "items already sent still arrive")
	assert.False(t, closed(o.Killed()), "Stop is not Kill")
	assert.False(t, closed(o.Lost()))
}

func TestKill(t *testing.T) {
	_, in, o := connect(t)
	ctx := context.Background()

	// The worker produces until the stream refuses.
	sendErr := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := o.Send(ctx, item(i)); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	for i := 0; i < 5; i++ {
		_, err := in.Recv(ctx)
		require.NoError(t, err)
	}
	in.Kill()
	_, err := in.Recv(ctx)
	assert.Equal(t, ErrKilled, err)

	waitClosed(t, o.Killed(), "Killed")
	assert.ErrorIs(t, <-sendErr, ErrKilled)
	start := time.Now()
	assert.ErrorIs(t, o.Send(ctx, item(0)), ErrKilled)
	assert.Less(t, time.Since(start), 100*time.Millisecond, "Send after Kill fails at once")
	assert.ErrorIs(t, o.Finish(), ErrKilled)
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Lost()), "a Kill is not a loss")
	assert.False(t, closed(o.Stopped()))
	in.Kill() // idempotent
	_, err = in.Recv(ctx)
	assert.Equal(t, ErrKilled, err)
}

func TestCloseKillsUnfinished(t *testing.T) {
	_, in, o := connect(t)
	attach(t, in, o)
	require.NoError(t, in.Close())
	require.NoError(t, in.Close())
	waitClosed(t, o.Killed(), "Killed")
	waitClosed(t, o.Done(), "Done")
	_, err := in.Recv(context.Background())
	assert.Equal(t, ErrClosed, err)
}

func TestKillAfterEndIsNoop(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	require.NoError(t, o.Finish())
	waitClosed(t, o.Done(), "Done") // the caller has received Final
	in.Kill()
	in.Stop()
	got, err := recvAll(t, in)
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, items(0, 1), got)
}

func TestHandlerError(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	msg := "a python exception was caught while processing the async generator: ValueError: boom"
	require.NoError(t, o.Fail(msg))
	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 1), got)
	var he *HandlerError
	require.ErrorAs(t, err, &he)
	assert.Equal(t, msg, he.Message)
	assert.Equal(t, msg, err.Error())
	assert.NotErrorIs(t, err, ErrIncomplete)
	waitClosed(t, o.Done(), "Done")
	assert.False(t, closed(o.Lost()))
}

func TestIncompleteOnPurpose(t *testing.T) {
	_, in, o := connect(t)
	require.NoError(t, o.Send(context.Background(), item(0)))
	require.NoError(t, o.Incomplete("the handler stopped the request"))
	got, err := recvAll(t, in)
	assert.Equal(t, items(0, 1), got)
	assert.ErrorIs(t, err, ErrStoppedByHandler)
	assert.ErrorIs(t, err, ErrIncomplete, "callers that only know ErrIncomplete still match")
	assert.Equal(t, "Stream ended before generation completed", err.Error())
	waitClosed(t, o.Done(), "Done")
}

func TestKillCause(t *testing.T) {
	_, in, o := connect(t)
	in.KillCause(3)
	waitClosed(t, o.Killed(), "Killed")
	assert.Equal(t, byte(3), o.KillCause())
	waitClosed(t, o.Done(), "Done")
}

func TestOnControl(t *testing.T) {
	_, in, o := connect(t)
	events := make(chan Event, 4)
	in.Stop()
	waitClosed(t, o.Stopped(), "Stopped")
	o.OnControl(func(ev Event) { events <- ev }) // the Stop that already happened is replayed
	in.Kill()
	waitClosed(t, o.Killed(), "Killed")
	assert.Equal(t, EventStop, <-events)
	assert.Equal(t, EventKill, <-events)
	assert.Empty(t, events)
	waitClosed(t, o.Done(), "Done")
}

// Exactly the expected control frames reach the worker: the window, one Stop
// however many calls, one Kill.
func TestControlFramesOnWire(t *testing.T) {
	s := listen(t, WithWindow(4))
	in := s.Expect("tok")
	c, w, r := rawWorker(t, s, "tok")
	_ = c.SetReadDeadline(time.Now().Add(waitFor))
	next := func() frame.Frame {
		for {
			f, err := r.ReadFrame()
			require.NoError(t, err)
			if f.Type != frame.Heartbeat { // liveness, at any time
				return f
			}
		}
	}
	f := next()
	require.Equal(t, frame.Credit, f.Type)
	assert.Equal(t, uint32(4), f.Credit())

	in.Stop()
	in.Stop()
	assert.Equal(t, frame.Stop, next().Type)

	// Consuming half the window grants it back.
	_, err := w.WriteBatch([][]byte{item(0), item(1), item(2)})
	require.NoError(t, err)
	require.NoError(t, w.Flush())
	for i := 0; i < 3; i++ {
		_, err := in.Recv(context.Background())
		require.NoError(t, err)
	}
	f = next()
	require.Equal(t, frame.Credit, f.Type)
	assert.Equal(t, uint32(2), f.Credit())

	in.Stop()
	in.Kill()
	in.Kill()
	assert.Equal(t, frame.Kill, next().Type)
	_, err = r.ReadFrame()
	assert.Equal(t, io.EOF, err, "Kill is followed by the caller's FIN")
	require.NoError(t, c.Close())
	in.Close()
}

func TestRecvContext(t *testing.T) {
	_, in, o := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := in.Recv(ctx)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	// The stream is unaffected.
	require.NoError(t, o.Send(context.Background(), item(7)))
	finishAndRead(t, in, o, items(7, 8))
}

func TestManyConcurrentStreams(t *testing.T) {
	const perStream = 300
	manyStreams(t, 50, perStream, func(in *Incoming, tok string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := 0; ; i++ {
			b, err := in.Recv(ctx)
			if errors.Is(err, io.EOF) && i == perStream {
				return nil
			}
			if err != nil {
				return fmt.Errorf("stream %s item %d: %w", tok, i, err)
			}
			if want := fmt.Sprintf("%s/%d", tok, i); string(b) != want {
				return fmt.Errorf("got %q want %q", b, want)
			}
		}
	})
}

// manyStreams runs streams streams at once, on a window of 16 (so the
// workers wait for the consumers' grants): each worker sends perStream
// items "token/i" and finishes, and consume reads its stream (and says
// what went wrong).
func manyStreams(t *testing.T, streams, perStream int, consume func(in *Incoming, tok string) error) {
	s := listen(t, WithWindow(16))
	var wg sync.WaitGroup
	errs := make(chan error, 2*streams)
	for k := 0; k < streams; k++ {
		tok := NewToken()
		in := s.Expect(tok)
		wg.Add(2)
		go func() { // worker
			defer wg.Done()
			o, err := Dial(context.Background(), s.Addr().String(), tok)
			if err != nil {
				errs <- err
				return
			}
			for i := 0; i < perStream; i++ {
				if err := o.Send(context.Background(), []byte(fmt.Sprintf("%s/%d", tok, i))); err != nil {
					errs <- err
					return
				}
			}
			if err := o.Finish(); err != nil {
				errs <- err
			}
			<-o.Done()
		}()
		go func() { // consumer
			defer wg.Done()
			defer in.Close()
			if err := consume(in, tok); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestNewToken(t *testing.T) {
	a, b := NewToken(), NewToken()
	assert.Len(t, a, 32)
	assert.NotEqual(t, a, b)
}

func TestRing(t *testing.T) {
	var r ring
	next, want := 0, 0
	for round := 0; round < 50; round++ {
		for i := 0; i < round%7+1; i++ { // pushes outpace pops: wraps and grows
			r.push(item(next))
			next++
		}
		for i := 0; i < round%5; i++ {
			b, ok := r.pop()
			if !ok {
				break
			}
			require.Equal(t, string(item(want)), string(b))
			want++
		}
		require.Equal(t, next-want, r.len())
	}
	for {
		b, ok := r.pop()
		if !ok {
			break
		}
		require.Equal(t, string(item(want)), string(b))
		want++
	}
	assert.Equal(t, next, want)
	r.reset()
	assert.Equal(t, 0, r.len())
}
