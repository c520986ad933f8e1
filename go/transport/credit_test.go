package transport

// Flow control: a worker sends only what the caller's credits allow.

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSendBlocksWithoutCredit(t *testing.T) {
	_, in, o := connect(t, WithWindow(1))
	require.NoError(t, o.Send(context.Background(), item(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, o.Send(ctx, item(1)), context.DeadlineExceeded)
	// A blocked Send is released by Close.
	errc := make(chan error, 1)
	go func() { errc <- o.Send(context.Background(), item(1)) }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, o.Close())
	assert.ErrorIs(t, <-errc, ErrClosed)
	got, err := recvAll(t, in)
	assert.Equal(t, ErrIncomplete, err)
	assert.Equal(t, items(0, 1), got)
	waitClosed(t, o.Done(), "Done")
}

func TestFlowControl(t *testing.T) {
	const window, total = 8, 200
	_, in, o := connect(t, WithWindow(window))

	var sent atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < total; i++ {
			if err := o.Send(context.Background(), item(i)); err != nil {
				errc <- err
				return
			}
			sent.Add(1)
		}
		errc <- o.Finish()
	}()

	// The consumer does not read: the producer stalls at the window.
	require.Eventually(t, func() bool { return sent.Load() == window }, waitFor, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(window), sent.Load(), "producer must block when the consumer does not read")
	in.mu.Lock()
	assert.LessOrEqual(t, in.q.len(), window)
	in.mu.Unlock()

	// Reading slowly: sent never runs ahead of received by more than the window.
	ctx := context.Background()
	for i := 0; i < total; i++ {
		b, err := in.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, string(item(i)), string(b))
		assert.LessOrEqual(t, sent.Load(), int64(i+1+window))
		in.mu.Lock()
		assert.LessOrEqual(t, in.q.len(), window)
		in.mu.Unlock()
	}
	_, err := in.Recv(ctx)
	assert.Equal(t, io.EOF, err)
	require.NoError(t, <-errc)
	waitClosed(t, o.Done(), "Done")
}
