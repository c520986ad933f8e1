package transport

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A consumer that does not block: TryRecv answers ErrNoItem while nothing
// is queued, the hook wakes it for each item and for the end, and WaitEnd
// returns at the end without taking the items still queued.
func TestTryRecvWithHookAndWaitEnd(t *testing.T) {
	_, in, o := connect(t)
	_, err := in.TryRecv()
	assert.ErrorIs(t, err, ErrNoItem)

	wake := wakeOn(in)
	ended := make(chan error, 1)
	go func() { ended <- in.WaitEnd() }()

	ctx := context.Background()
	var got []string
	for i := 0; i < 50; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
		for len(got) <= i {
			b, err := in.TryRecv()
			if err == ErrNoItem {
				select {
				case <-wake:
				case <-time.After(10 * time.Second):
					t.Fatalf("no wake-up for item %d", i)
				}
				continue
			}
			require.NoError(t, err)
			got = append(got, string(b))
		}
	}
	assert.Equal(t, items(0, 50), got)
	select {
	case err := <-ended:
		t.Fatalf("WaitEnd returned %v before the end", err)
	default:
	}

	for i := 50; i < 60; i++ {
		require.NoError(t, o.Send(ctx, item(i)))
	}
	require.NoError(t, o.Finish())
	select {
	case err := <-ended:
		assert.Equal(t, io.EOF, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitEnd did not return at the end")
	}
	// The end's items are still there, in order, then the end.
	for {
		b, err := in.TryRecv()
		require.NotErrorIs(t, err, ErrNoItem, "after the end, TryRecv never waits")
		if err != nil {
			assert.Equal(t, io.EOF, err)
			break
		}
		got = append(got, string(b))
	}
	assert.Equal(t, items(0, 60), got)
	assert.False(t, in.Queued())
	in.Close()
}

// A kill ends WaitEnd (ErrKilled), drops what is queued and wakes the hook.
func TestWaitEndAfterKill(t *testing.T) {
	_, in, o := connect(t)
	var wakes atomic.Int64
	in.OnSignal(func() { wakes.Add(1) })
	require.NoError(t, o.Send(context.Background(), item(1)))
	require.Eventually(t, in.Queued, 10*time.Second, time.Millisecond)
	before := wakes.Load()
	ended := make(chan error, 1)
	go func() { ended <- in.WaitEnd() }()
	in.Kill()
	select {
	case err := <-ended:
		assert.ErrorIs(t, err, ErrKilled)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitEnd did not return after the kill")
	}
	assert.Greater(t, wakes.Load(), before, "the kill woke the hook")
	assert.False(t, in.Queued(), "a kill drops what is queued")
	_, err := in.TryRecv()
	assert.ErrorIs(t, err, ErrKilled)
	in.Close()
}

// Many streams consumed the non-blocking way while their workers send and
// finish: every item arrives, in order, and every credit is granted.
func TestTryRecvManyStreams(t *testing.T) {
	const perStream = 300
	manyStreams(t, 40, perStream, func(in *Incoming, tok string) error {
		wake := wakeOn(in)
		for i := 0; ; {
			b, err := in.TryRecv()
			switch {
			case err == ErrNoItem:
				select {
				case <-wake:
				case <-time.After(10 * time.Second):
					return fmt.Errorf("%s: no wake-up after %d items", tok, i)
				}
			case err == io.EOF && i == perStream:
				return nil
			case err != nil:
				return fmt.Errorf("stream %s item %d: %w", tok, i, err)
			default:
				if want := fmt.Sprintf("%s/%d", tok, i); string(b) != want {
					return fmt.Errorf("got %q, want %q", b, want)
				}
				i++
			}
		}
	})
}

// A worker's heartbeats wake no consumer: only the item after them does.
func TestHeartbeatsWakeNoConsumer(t *testing.T) {
	s := listen(t)
	in := expect(t, s, "tok")
	var wakes atomic.Int64
	in.OnSignal(func() { wakes.Add(1) })
	_, w, _ := rawWorker(t, s, "tok")
	for range 5 {
		require.NoError(t, w.WriteHeartbeat())
	}
	require.NoError(t, w.WriteData(item(1)))
	require.NoError(t, w.Flush())
	// The item is queued before its hook runs: wait for both.
	require.Eventually(t, func() bool { return in.Queued() && wakes.Load() > 0 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(1), wakes.Load(), "the item woke the consumer, the heartbeats before it did not")
	in.Close()
}

// wakeOn sets in's hook to poke the channel it returns (cap 1: one pending
// wake-up is as good as several).
func wakeOn(in *Incoming) <-chan struct{} {
	wake := make(chan struct{}, 1)
	in.OnSignal(func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	return wake
}
