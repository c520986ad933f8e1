//go:build linux

package wake

import (
	"encoding/binary"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readLikeALoop is what a foreign event loop does on a wake-up (dynamo_ctx's
// Python module does the same in C): read whole tokens from the pipe until it
// is empty, then call Drain only if it read more than DrainAfter bytes: tokens may wait in
// memory (DrainAfter).
func readLikeALoop(t *testing.T, q *TokenQueue) (got []uint64, drained bool) {
	t.Helper()
	buf := make([]byte, 4096)
	n := 0
	for {
		r, err := syscall.Read(q.Fd(), buf)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN || r == 0 {
			break
		}
		require.NoError(t, err)
		require.Zero(t, r%8, "a read returns whole tokens")
		for i := 0; i < r; i += 8 {
			got = append(got, binary.NativeEndian.Uint64(buf[i:]))
		}
		n += r
	}
	if n > q.DrainAfter() {
		return append(got, drainTokens(q, 256)...), true
	}
	return got, false
}

// drainTokens takes everything with Drain, cap tokens a call.
func drainTokens(q *TokenQueue, cap int) (got []uint64) {
	dst := make([]uint64, cap)
	for {
		k, more := q.Drain(dst)
		got = append(got, dst[:k]...)
		if !more {
			return got
		}
	}
}

func newTokens(t *testing.T) *TokenQueue {
	t.Helper()
	q, err := NewTokenQueue()
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func seq(from, n int) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(from + i)
	}
	return s
}

// Tokens go through the pipe, oldest first, and a reader gets them without
// Drain while they fit.
func TestTokensInThePipe(t *testing.T) {
	q := newTokens(t)
	assert.False(t, readable(t, q.Fd(), 0))
	for _, tok := range seq(1, 100) {
		require.NoError(t, q.Push(tok))
	}
	assert.True(t, readable(t, q.Fd(), 0))
	got, drained := readLikeALoop(t, q)
	assert.Equal(t, seq(1, 100), got)
	assert.False(t, drained, "100 tokens fit in the pipe")
	assert.False(t, readable(t, q.Fd(), 0))
}

// More tokens than the pipe holds wait in memory, and every later one too
// until Drain took them: a reader that keeps the rule gets all, in order,
// whether it reads them or Drain does, and Push writes to the pipe again
// afterwards.
func TestTokensBeyondThePipeKeepTheirOrder(t *testing.T) {
	for _, byDrain := range []bool{false, true} {
		q := newTokens(t)
		n := q.capacity/8 + 1000
		for _, tok := range seq(1, n) {
			require.NoError(t, q.Push(tok))
		}
		var got []uint64
		if byDrain {
			got = drainTokens(q, 333)
		} else {
			var drained bool
			got, drained = readLikeALoop(t, q)
			assert.True(t, drained)
		}
		assert.Equal(t, seq(1, n), got)
		require.NoError(t, q.Push(7))
		got, drained := readLikeALoop(t, q)
		assert.Equal(t, []uint64{7}, got)
		assert.False(t, drained)
	}
}

// A reader that takes part of a full pipe, while Pushes go on into memory,
// still gets every token once and in order.
func TestPartialReadDuringOverflow(t *testing.T) {
	q := newTokens(t)
	n := q.capacity / 8
	for _, tok := range seq(1, n+10) { // full, and 10 in memory
		require.NoError(t, q.Push(tok))
	}
	buf := make([]byte, 8*5)
	r, err := syscall.Read(q.Fd(), buf) // 5 tokens: room in the pipe again
	require.NoError(t, err)
	require.Equal(t, 40, r)
	got := []uint64{}
	for i := 0; i < r; i += 8 {
		got = append(got, binary.NativeEndian.Uint64(buf[i:]))
	}
	for _, tok := range seq(n+11, 20) {
		require.NoError(t, q.Push(tok)) // behind the 10: into memory, not the pipe
	}
	rest, drained := readLikeALoop(t, q)
	assert.True(t, drained)
	assert.Equal(t, seq(1, n+30), append(got, rest...))
}

// Many pushers and a reader that keeps the rule: every token exactly once,
// each pusher's in its order.
// startPushers starts pushers goroutines that each push each tokens onto q,
// pusher p's i-th being p<<32|i; the channel closes when all have pushed.
func startPushers(t *testing.T, q *TokenQueue, pushers, each int) <-chan struct{} {
	t.Helper()
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				assert.NoError(t, q.Push(uint64(p)<<32|uint64(i)))
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

func TestConcurrentPushersAndALoop(t *testing.T) {
	q := newTokens(t)
	const pushers, each = 8, 5000 // 40,000 tokens: five pipes' worth
	done := startPushers(t, q, pushers, each)
	next := make([]uint64, pushers)
	total := 0
	check := func(got []uint64) {
		for _, tok := range got {
			p, i := tok>>32, tok&0xffffffff
			require.Equal(t, next[p], i, "pusher %d's tokens in order, once", p)
			next[p]++
			total++
		}
	}
	for {
		select {
		case <-done:
			got, _ := readLikeALoop(t, q)
			check(got)
			got, _ = readLikeALoop(t, q) // a last look after the pushers finished
			check(got)
			assert.Equal(t, pushers*each, total)
			return
		default:
			got, _ := readLikeALoop(t, q)
			check(got)
		}
	}
}

func TestTokenQueueClose(t *testing.T) {
	q, err := NewTokenQueue()
	require.NoError(t, err)
	require.NoError(t, q.Push(1))
	require.NoError(t, q.Close())
	require.NoError(t, q.Close(), "idempotent")
	assert.ErrorIs(t, q.Push(2), ErrClosed)
	n, more := q.Drain(make([]uint64, 4))
	assert.Zero(t, n)
	assert.False(t, more)
}

func TestDrainAfter(t *testing.T) {
	q := newTokens(t)
	assert.Equal(t, 64<<10, q.capacity, "the size asked for")
	assert.Equal(t, q.capacity-os.Getpagesize(), q.DrainAfter())
}

// A Capture takes what Push gets while it is open, in order, and the pipe
// none of it; once it ends, Push writes to the pipe again. A second Capture
// while one is open catches nothing; after Close, end returns nil.
func TestCapture(t *testing.T) {
	q := newTokens(t)
	require.NoError(t, q.Push(1))
	end := q.Capture()
	inner := q.Capture()
	for _, tok := range seq(10, 3) {
		require.NoError(t, q.Push(tok))
	}
	assert.Nil(t, inner(), "the open capture gets the tokens")
	assert.Equal(t, seq(10, 3), end())
	assert.Nil(t, end(), "ended: nothing more")
	require.NoError(t, q.Push(2))
	got, _ := readLikeALoop(t, q)
	assert.Equal(t, []uint64{1, 2}, got, "the pipe has what came before and after")

	end = q.Capture()
	require.NoError(t, q.Push(3))
	require.NoError(t, q.Close())
	assert.Nil(t, end(), "closed: the capture returns nothing")
}

// Tokens that other goroutines push while a capture is open are in it or
// in the pipe: none is lost or doubled, each pusher's in order.
func TestCaptureWithConcurrentPushers(t *testing.T) {
	q := newTokens(t)
	const pushers, each = 4, 3000
	done := startPushers(t, q, pushers, each)
	seen := map[uint64]bool{}
	take := func(got []uint64) {
		for _, tok := range got {
			require.False(t, seen[tok], "token %x twice", tok)
			seen[tok] = true
		}
	}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		end := q.Capture()
		caught := end()
		last := map[uint64]uint64{}
		for _, tok := range caught {
			p, i := tok>>32, tok&0xffffffff
			if prev, ok := last[p]; ok {
				require.Greater(t, i, prev, "a capture keeps each pusher's order")
			}
			last[p] = i
		}
		take(caught)
		got, _ := readLikeALoop(t, q)
		take(got)
	}
	got, _ := readLikeALoop(t, q)
	take(got)
	assert.Len(t, seen, pushers*each)
}
