package main

// The C ABI is exercised as a C caller sees it by python/tests/test_c_abi*.py
// (cffi). These tests cover what Go can reach without cgo in a test file:
// exports called with untyped constants and nil pointers, and the Go-side
// helpers behind them.

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/handle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The reader of posted calls lives as long as the process (posted.go).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/dynamo-ctx/dynamo-ctx/go/native.runPosted"))
}

func TestEveryExportRejectsBadHandles(t *testing.T) {
	for _, h := range []uint64{0, 1, 0xdeadbeef, 1<<63 | 5, ^uint64(0)} {
		assert.EqualValues(t, 9, call1(dc_context_free, h))
		assert.EqualValues(t, 9, call1(dc_context_kill, h))
		assert.EqualValues(t, 9, call1(dc_context_stop_generating, h))
		assert.EqualValues(t, 9, call2(dc_context_link_child, h, h))
		assert.EqualValues(t, 9, call1(dc_context_finish, h))
		assert.EqualValues(t, 9, call1(dc_queue_free, h))
		assert.EqualValues(t, 9, call2(dc_queue_unwatch, h, 1))
		assert.EqualValues(t, 9, call1(dc_status_free, h))
	}
}

func TestNilPointersAreInvalid(t *testing.T) {
	assert.EqualValues(t, 22, dc_context_new(nil, 3, nil))
	assert.EqualValues(t, 22, dc_context_new_uuid(nil))
	assert.EqualValues(t, 22, dc_id_check(nil, 0), "the empty id")
	assert.EqualValues(t, 22, dc_queue_new(nil, nil))
	assert.EqualValues(t, 22, dc_context_state(1, nil))
	assert.EqualValues(t, 22, dc_log_fd(nil))
	assert.EqualValues(t, 22, dc_log_next(nil, nil, 0, nil))
	assert.EqualValues(t, 22, dc_request_send_multi(nil, nil, 1, nil, nil, nil, nil))
	assert.EqualValues(t, 22, dc_status_start(-1, nil, 0, 0, 0, 0, nil))
	assert.EqualValues(t, 0, dc_request_send_multi(nil, nil, 0, nil, nil, nil, nil), "nothing to send")
	assert.EqualValues(t, 22, dc_frontend_start(1, nil, 0, nil))
	assert.EqualValues(t, 22, dc_frontend_check_settings(nil, 0))
}

// dc_timeout_check is ctxtree's timeout rule (DC_MAX_TIMEOUT_SECONDS is
// 31536000).
func TestTimeoutCheck(t *testing.T) {
	assert.EqualValues(t, 0, dc_timeout_check(0))
	assert.EqualValues(t, 0, dc_timeout_check(2.5))
	assert.EqualValues(t, 0, dc_timeout_check(31536000-1))
	assert.EqualValues(t, 22, dc_timeout_check(-1))
	assert.EqualValues(t, 22, dc_timeout_check(31536000))
}

func TestHandleKindsDiffer(t *testing.T) {
	seen := map[handle.Kind]int{contexts.Kind(): 0, queues.Kind(): 1}
	require.Len(t, seen, 2, "contexts and queues share a kind")
	for i, tb := range otherTables {
		k := tb.Kind()
		_, dup := seen[k]
		require.False(t, dup, "table %d of otherTables has kind %d, another table's", i, k)
		seen[k] = i + 2
	}
}

// panicGuarded panics as dc_selftest_panic does (a real runtime panic, a nil
// map write) under guard, whose C result type it takes from guard itself:
// the export is the test library's alone (selftest_exports.go, built with
// -tags dc_selftest), and the C ABI tests call it there.
func panicGuarded[R any](guard func(string, *R)) (rc R) {
	defer guard("dc_selftest_panic", &rc)
	var m map[string]int
	m["boom"]++
	return rc
}

func TestPanicIsRecovered(t *testing.T) {
	assert.EqualValues(t, 1000, panicGuarded(guard))
	assert.EqualValues(t, 1000, panicGuarded(guard), "still usable afterwards")
	assert.EqualValues(t, 0, dc_handle_counts(nil, nil, nil), "the library still works")
}

func TestInvalidCancelArguments(t *testing.T) {
	assert.EqualValues(t, 22, dc_context_cancel(1, 0, 1), "LIVE is not a cancel target")
	assert.EqualValues(t, 22, dc_context_cancel(1, 1, 0), "REASON_NONE is not a reason")
	assert.EqualValues(t, 22, dc_context_cancel(1, 2, 99))
	assert.EqualValues(t, 22, dc_state_word_next(0, 2, 2, nil), "out is NULL")
	assert.EqualValues(t, 22, dc_state_word_next(0, 0, 2, nil))
}

// The exports take cgo types, which a test file cannot name; these bind a
// uint64 to whatever integer type the export's parameter has.
func call1[H ~uint64, R any](f func(H) R, h uint64) R { return f(H(h)) }

func call2[H ~uint64, R any](f func(H, H) R, a, b uint64) R { return f(H(a), H(b)) }

func callWatch[H ~uint64, S ~uint32, R any](f func(H, H, S, H) R, h, q uint64, st uint32, tok uint64) R {
	return f(H(h), H(q), S(st), H(tok))
}

func newQueue[H ~uint64, F ~int32, R ~int32](f func(*H, *F) R) (uint64, int) {
	var h H
	var fd F
	if rc := f(&h, &fd); rc != 0 {
		panic(rc)
	}
	return uint64(h), int(fd)
}

func drainQueue[H ~uint64, Z ~uint64, R ~int32](f func(H, *H, Z, *Z) R, q uint64, buf []uint64) int {
	var n Z
	if rc := f(H(q), (*H)(unsafe.Pointer(&buf[0])), Z(len(buf)), &n); rc != 0 {
		panic(rc)
	}
	return int(n)
}

// BenchmarkWatchKill is the wake path of one cancellation as the Python side
// drives it: a context watched on an event queue, killed, its token drained.
func BenchmarkWatchKill(b *testing.B) {
	q, _ := newQueue(dc_queue_new)
	defer call1(dc_queue_free, q)
	buf := make([]uint64, 4)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		h := contexts.Insert(newContext("bench"))
		if rc := callWatch(dc_context_watch, h, q, 1, 7); rc != 0 {
			b.Fatal(rc)
		}
		call1(dc_context_kill, h)
		if n := drainQueue(dc_queue_drain, q, buf); n != 1 {
			b.Fatal(n)
		}
		call1(dc_context_free, h)
	}
}

// sendMulti calls dc_request_send_multi (f) with Go slices for its arrays.
func sendMulti[H ~uint64, Z ~uint64, Ch any, R ~int32](f func(*H, *Z, Z, **Ch, *Z, *Z, *R) R, hs, counts []uint64, items [][]byte) (R, []Z, []R) {
	n := len(hs)
	sent, rcs := make([]Z, n+1), make([]R, n+1) // one more: nothing is written past n
	for i := range rcs {
		sent[i], rcs[i] = 777, 777
	}
	var ptrs []*Ch
	var lens []Z
	for _, it := range items {
		var p *Ch
		if len(it) > 0 {
			p = (*Ch)(unsafe.Pointer(&it[0]))
		}
		ptrs, lens = append(ptrs, p), append(lens, Z(len(it)))
	}
	ptr := func(s []uint64) *H {
		if len(s) == 0 {
			return nil
		}
		return (*H)(unsafe.Pointer(&s[0]))
	}
	var pi **Ch
	var pl *Z
	if len(ptrs) > 0 {
		pi, pl = &ptrs[0], &lens[0]
	}
	rc := f(ptr(hs), (*Z)(unsafe.Pointer(ptr(counts))), Z(n), pi, pl, &sent[0], &rcs[0])
	if sent[n] != 777 || rcs[n] != 777 {
		panic("dc_request_send_multi wrote past n")
	}
	return rc, sent[:n], rcs[:n]
}

// The bounds of dc_request_send_multi (dynamo_ctx.h): a whole call is
// refused for more than 65536 requests, more than 2^24 items in all, counts
// that do not fit however large, NULL arrays with items to send; a stale
// handle, or more than 65536 items for one request, is its own entry's
// error.
func TestSendMultiBounds(t *testing.T) {
	one := [][]byte{[]byte("1")}
	rc, sent, rcs := sendMulti(dc_request_send_multi, []uint64{0, ^uint64(0)}, []uint64{1, 0}, one)
	assert.EqualValues(t, 0, rc)
	assert.EqualValues(t, []int32{9, 9}, []int32{int32(rcs[0]), int32(rcs[1])})
	assert.EqualValues(t, []uint64{0, 0}, []uint64{uint64(sent[0]), uint64(sent[1])})

	for name, counts := range map[string][]uint64{
		"a count past 2^63": {^uint64(0), 1},
		"counts that wrap":  {1 << 63, 1 << 63, 1},
	} {
		rc, _, rcs := sendMulti(dc_request_send_multi, make([]uint64, len(counts)), counts, one)
		assert.EqualValues(t, 22, rc, name)
		assert.EqualValues(t, 777, rcs[0], "%s: nothing stored", name)
	}
	many := make([]uint64, 257) // 257 x 65536 items: more than 2^24 in all
	for i := range many {
		many[i] = 1 << 16
	}
	rc, _, _ = sendMulti(dc_request_send_multi, make([]uint64, 257), many, one)
	assert.EqualValues(t, 22, rc, "more than 2^24 items in all")
	rc, _, _ = sendMulti(dc_request_send_multi, make([]uint64, 1<<16+1), make([]uint64, 1<<16+1), nil)
	assert.EqualValues(t, 22, rc, "65537 requests")
	rc, _, _ = sendMulti(dc_request_send_multi, []uint64{0}, []uint64{1}, nil)
	assert.EqualValues(t, 22, rc, "an item and no items array")
	rc, _, rcs = sendMulti(dc_request_send_multi, make([]uint64, 1<<16), make([]uint64, 1<<16), nil)
	assert.EqualValues(t, 0, rc, "65536 requests of no item")
	assert.EqualValues(t, 9, rcs[1<<16-1])
}

// A request of more items than dc_request_send_many takes is refused on its
// own, with a message, and its items are skipped: the others are sent.
func TestSendMultiRefusesARequestOfTooManyItems(t *testing.T) {
	runtime.LockOSThread() // the last error is the calling thread's
	defer runtime.UnlockOSThread()
	one := [][]byte{[]byte("1")}
	rc, sent, rcs := sendMulti(dc_request_send_multi, []uint64{0, 0}, []uint64{1, 1<<16 + 1}, one)
	assert.EqualValues(t, 0, rc)
	assert.EqualValues(t, []int32{9, 22}, []int32{int32(rcs[0]), int32(rcs[1])})
	assert.EqualValues(t, []uint64{0, 0}, []uint64{uint64(sent[0]), uint64(sent[1])})
	assert.Equal(t, "dc_request_send_multi: 65537 items for request 0x0, at most 65536", lastError(dc_last_error))

	// Alone, a request past 2^24 items: no bound of the call is passed.
	rc, _, rcs = sendMulti(dc_request_send_multi, []uint64{0}, []uint64{1<<24 + 1}, one)
	assert.EqualValues(t, 0, rc)
	assert.EqualValues(t, 22, rcs[0])
}

// lastError is the calling thread's last error message (dc_last_error, f).
func lastError[Ch any, Z ~uint64](f func(*Ch, Z) Z) string {
	buf := make([]byte, 1024)
	n := f((*Ch)(unsafe.Pointer(&buf[0])), Z(len(buf)))
	return string(buf[:min(int(n), len(buf)-1)])
}

func TestTheHostThreadYieldsAtMostEveryInterval(t *testing.T) {
	saved := lastHostYield.Load()
	defer lastHostYield.Store(saved)
	start := hostNow() + int64(time.Hour)
	assert.True(t, renewHostTick(start), "long after the last")
	assert.False(t, renewHostTick(start+int64(hostYieldEvery)-1), "too soon")
	assert.True(t, renewHostTick(start+int64(hostYieldEvery)))
	a, b := hostNow(), hostNow()
	assert.LessOrEqual(t, a, b, "monotonic")
}

func TestStateWordsComeFromSlabsAndAreReusedZeroed(t *testing.T) {
	var pool wordPool
	first := pool.get()
	second := pool.get()
	require.NotEqual(t, first, second)
	// One slab: the words of a slab are handed out in order, 4 bytes apart.
	assert.Equal(t, uintptr(4), uintptr(second)-uintptr(first))
	assert.Len(t, pool.free, wordsPerSlab-2)

	// A word comes back zeroed for the next context, whatever its last one's state.
	(*atomic.Uint32)(second).Store(0x00020302)
	pool.put(second)
	again := pool.get()
	assert.Equal(t, second, again)
	assert.Zero(t, (*atomic.Uint32)(again).Load())

	// A slab runs out: the next word comes from a new one.
	for len(pool.free) > 0 {
		pool.get()
	}
	assert.NotNil(t, pool.get())
	assert.Len(t, pool.free, wordsPerSlab-1)
}

func TestAContextsStateWordGoesBackToThePool(t *testing.T) {
	c := newContext("word-reuse")
	word := unsafe.Pointer(c.StateWord())
	c.Kill()
	require.NotZero(t, (*atomic.Uint32)(word).Load())
	c = nil
	back := func() bool {
		stateWords.mu.Lock()
		defer stateWords.mu.Unlock()
		for _, p := range stateWords.free {
			if p == word {
				return true
			}
		}
		return false
	}
	require.Eventually(t, func() bool { runtime.GC(); return back() }, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, (*atomic.Uint32)(word).Load())
}
