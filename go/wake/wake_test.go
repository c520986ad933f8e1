//go:build linux

package wake

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pollFd mirrors struct pollfd from <poll.h>.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1 // POLLIN; not exported by package syscall.

// readable reports whether fd is readable within timeout, the way an event
// loop would see it. ppoll rather than poll because SYS_POLL does not exist
// on every Linux architecture (arm64 has only ppoll).
func readable(t testing.TB, fd int, timeout time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		remaining := max(time.Until(deadline), 0)
		ts := syscall.NsecToTimespec(remaining.Nanoseconds())
		pfd := pollFd{fd: int32(fd), events: pollIn}
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL,
			uintptr(unsafe.Pointer(&pfd)), 1, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if errno == syscall.EINTR {
			continue
		}
		if errno != 0 {
			// Errorf, not FailNow: this also runs on the reader goroutine.
			t.Errorf("ppoll: %v", errno)
			return false
		}
		return n == 1 && pfd.revents&pollIn != 0
	}
}

const (
	short = 20 * time.Millisecond // long enough to catch a late byte; used where the answer should be "no"
	long  = 2 * time.Second       // generous for slow -race CI machines; returns early on "yes"
)

func newQueue[T any](t testing.TB) *Queue[T] {
	t.Helper()
	q, err := New[T]()
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func TestFdReadableIffNonEmpty(t *testing.T) {
	q := newQueue[int](t)
	assert.False(t, readable(t, q.Fd(), short), "empty queue must not be readable")

	require.NoError(t, q.Push(1))
	assert.True(t, readable(t, q.Fd(), long), "non-empty queue must be readable")
	// Level-triggered: still readable until drained.
	assert.True(t, readable(t, q.Fd(), long))

	dst := make([]int, 4)
	n, more := q.Drain(dst)
	assert.Equal(t, 1, n)
	assert.False(t, more)
	assert.False(t, readable(t, q.Fd(), short), "drained queue must not be readable")
}

func TestFdIsNonBlockingCloexec(t *testing.T) {
	q := newQueue[int](t)
	for _, fd := range []int{q.rfd, q.wfd} {
		fl, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFL, 0)
		require.Zero(t, errno)
		assert.NotZero(t, fl&syscall.O_NONBLOCK, "fd %d must be non-blocking", fd)
		fdfl, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		require.Zero(t, errno)
		assert.NotZero(t, fdfl&syscall.FD_CLOEXEC, "fd %d must be close-on-exec", fd)
	}
}

func TestDrainFIFO(t *testing.T) {
	q := newQueue[string](t)
	in := []string{"a", "b", "c", "d", "e"}
	for _, s := range in {
		require.NoError(t, q.Push(s))
	}
	assert.Equal(t, len(in), q.Len())

	dst := make([]string, 10)
	n, more := q.Drain(dst)
	assert.Equal(t, in, dst[:n])
	assert.False(t, more)
	assert.Zero(t, q.Len())
}

func TestPartialDrainKeepsFdReadable(t *testing.T) {
	q := newQueue[int](t)
	for i := range 10 {
		require.NoError(t, q.Push(i))
	}
	dst := make([]int, 3)
	var got []int
	for {
		n, more := q.Drain(dst)
		got = append(got, dst[:n]...)
		if !more {
			break
		}
		assert.True(t, readable(t, q.Fd(), long), "fd must stay readable while values remain")
		assert.Equal(t, 10-len(got), q.Len())
	}
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, got)
	assert.False(t, readable(t, q.Fd(), short), "full drain must make fd unreadable")

	// The queue is reusable after a full drain: the next Push re-signals.
	require.NoError(t, q.Push(42))
	assert.True(t, readable(t, q.Fd(), long))
}

func TestDrainEmptyAndZeroLenDst(t *testing.T) {
	q := newQueue[int](t)
	n, more := q.Drain(make([]int, 4))
	assert.Zero(t, n)
	assert.False(t, more)

	require.NoError(t, q.Push(7))
	n, more = q.Drain(nil)
	assert.Zero(t, n)
	assert.True(t, more)
	assert.True(t, readable(t, q.Fd(), long))
}

func TestPipeHoldsAtMostOneByte(t *testing.T) {
	q, err := New[int]()
	require.NoError(t, err)
	defer q.Close()
	// Far more pushes than a pipe buffer (64 KiB) could absorb, were each one
	// to write a byte.
	for i := range 200_000 {
		require.NoError(t, q.Push(i))
	}
	// Read the pipe behind the queue's back; the queue is closed afterwards.
	buf := make([]byte, 128)
	n, err := syscall.Read(q.Fd(), buf)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

func TestBufferDoesNotGrowWhenNeverEmpty(t *testing.T) {
	q := newQueue[int](t)
	require.NoError(t, q.Push(-1)) // keep one value in flight so Drain never empties
	dst := make([]int, 1)
	for i := range 10_000 {
		if err := q.Push(i); err != nil {
			t.Fatal(err)
		}
		// Plain checks: testify per iteration dominates the run time.
		if n, more := q.Drain(dst); n != 1 || !more || dst[0] != i-1 {
			t.Fatalf("step %d: n=%d more=%v got=%d", i, n, more, dst[0])
		}
	}
	q.mu.Lock()
	c := cap(q.buf)
	q.mu.Unlock()
	assert.LessOrEqual(t, c, 16, "backing array must be compacted, not grown")
}

func TestConcurrentPushersExactlyOnce(t *testing.T) {
	const (
		pushers = 8
		per     = 10_000
		total   = pushers * per
	)
	q := newQueue[uint64](t)

	start := make(chan struct{})
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range per {
				if err := q.Push(uint64(p)<<32 | uint64(i)); err != nil {
					t.Errorf("push: %v", err)
					return
				}
			}
		}()
	}

	type result struct {
		seen    []uint32 // seen[p] = next expected sequence number from pusher p
		got     int
		wakeups int
		err     string
	}
	done := make(chan result)
	go func() {
		r := result{seen: make([]uint32, pushers)}
		dst := make([]uint64, 256)
		deadline := time.Now().Add(30 * time.Second)
		for r.got < total {
			if time.Now().After(deadline) {
				r.err = "timed out waiting for values"
				break
			}
			// Sleep in poll like an event loop; never Drain without a wake-up,
			// so a lost wake-up shows up as a timeout.
			if !readable(t, q.Fd(), 100*time.Millisecond) {
				continue
			}
			r.wakeups++
			for {
				n, more := q.Drain(dst)
				for _, v := range dst[:n] {
					p, i := v>>32, uint32(v)
					if p >= pushers || i != r.seen[p] {
						r.err = "value out of order or duplicated"
						done <- r
						return
					}
					r.seen[p]++
				}
				r.got += n
				if !more {
					break
				}
			}
		}
		done <- r
	}()

	close(start)
	wg.Wait()
	r := <-done
	require.Empty(t, r.err)
	assert.Equal(t, total, r.got)
	for p, s := range r.seen {
		assert.EqualValues(t, per, s, "pusher %d", p)
	}
	assert.Zero(t, q.Len())
	assert.False(t, readable(t, q.Fd(), short), "fd must be unreadable once everything is drained")
	t.Logf("%d values in %d wake-ups", r.got, r.wakeups)
}

func TestClose(t *testing.T) {
	q, err := New[int]()
	require.NoError(t, err)
	require.NoError(t, q.Push(1))

	require.NoError(t, q.Close())
	require.NoError(t, q.Close(), "Close must be idempotent")

	assert.ErrorIs(t, q.Push(2), ErrClosed)
	n, more := q.Drain(make([]int, 4))
	assert.Zero(t, n)
	assert.False(t, more)
	assert.Zero(t, q.Len())
}

func TestConcurrentCloseAndPush(t *testing.T) {
	q, err := New[int]()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				if err := q.Push(i); err != nil {
					assert.ErrorIs(t, err, ErrClosed)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		dst := make([]int, 16)
		for range 100 {
			q.Drain(dst)
		}
	}()
	require.NoError(t, q.Close())
	wg.Wait()
	assert.ErrorIs(t, q.Push(0), ErrClosed)
}

func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func TestNoFdLeak(t *testing.T) {
	before := openFds(t)
	for i := range 1000 {
		q, err := New[int]()
		require.NoError(t, err)
		if i%2 == 0 {
			require.NoError(t, q.Push(i)) // close with a byte in the pipe, too
		}
		require.NoError(t, q.Close())
	}
	assert.Equal(t, before, openFds(t))
}

// BenchmarkPush drains every 1024 pushes, so memory stays flat; the next
// Push after each full drain pays the one write syscall, as in real use.
func BenchmarkPush(b *testing.B) { benchPush(b, 1024) }

func BenchmarkPushParallel(b *testing.B) {
	q := newQueue[int](b)
	var mu sync.Mutex
	dst := make([]int, 1024)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if err := q.Push(i); err != nil {
				b.Error(err)
				return
			}
			i++
			if i%len(dst) == 0 {
				mu.Lock()
				q.Drain(dst)
				mu.Unlock()
			}
		}
	})
}

// BenchmarkPushDrainRoundTrip is the worst case: every Push is an
// empty-to-non-empty transition (one write) and every Drain empties the
// queue (one read).
func BenchmarkPushDrainRoundTrip(b *testing.B) { benchPush(b, 1) }

// benchPush pushes 0, 1, 2... and drains every drainEvery pushes, checking
// that the drain returns all of them.
func benchPush(b *testing.B, drainEvery int) {
	q := newQueue[int](b)
	dst := make([]int, drainEvery)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := q.Push(i); err != nil {
			b.Fatal(err)
		}
		i++
		if i%drainEvery == 0 {
			if n, _ := q.Drain(dst); n != drainEvery || dst[0] != i-drainEvery || dst[n-1] != i-1 {
				b.Fatalf("got %d values, %v", n, dst[:n])
			}
		}
	}
}

func TestPeekKeepsValueAndReadiness(t *testing.T) {
	q, err := New[int]()
	require.NoError(t, err)
	defer q.Close()
	_, ok := q.Peek()
	assert.False(t, ok)
	require.NoError(t, q.Push(5))
	v, ok := q.Peek()
	assert.True(t, ok)
	assert.Equal(t, 5, v)
	assert.Equal(t, 1, q.Len())
	dst := make([]int, 1)
	n, _ := q.Drain(dst)
	assert.Equal(t, 1, n)
	assert.Equal(t, 5, dst[0])
}
