package main

// Posted calls: the calls a host makes at every engine step or on a timer,
// and whose answer it does not wait for, handed over without a call into Go.
//
// Why: a call from the host's thread into an export takes a P, and back in
// C the thread keeps that P in the system-call state until Go's monitor
// thread (sysmon) takes it away, up to 10 ms later; while it waits, sysmon
// polls every 20 us. A worker that called in at every step of its engine
// (dc_request_send_multi), every 100 ms (dc_runtime_host_tick) and at each
// change of its engine's load paid that polling, plus the scheduler yields
// of hostyield.go, all the time. With these calls posted, an idle served
// endpoint's process uses a third less CPU and switches threads a third as
// often, and on the real engine the worker's thread switches per token fell
// by a sixth at 16 streams and by half at 64 (docs/benchmarks.md, "Posted
// calls").
//
// How: the host writes each call as one message to a Unix SOCK_SEQPACKET
// socket (dc_post_fd), a non-blocking write of its own thread; a goroutine
// of the library waits on the other end in Go's network poller and runs the
// messages in the order written. Every export that acts on a request runs
// what is posted first (drainPosted), so a call sees every message its
// thread posted before it: a request's items are sent before its end, in
// order. A message the socket refuses (full, too large) the host makes as a
// call instead, after the posted ones: the call runs them first (the
// exports of requests, dc_runtime_host_tick, dc_endpoint_set_engine_load).
//
// The messages, little-endian, each a u32 kind and its record:
//
//   - postItems (1): then, per request, its handle (u64), its items' count
//     (u32) and each item as its length (u32) and bytes. The items are sent
//     as dc_request_send_multi sends them, all taken: beyond the send
//     buffer's bound if need be (plane.Request.SendManyPosted), since the
//     host counts them as sent. A request at or over the bound is listed
//     in dc_posted_full (posted.h), and the host sends its items by the
//     call instead, whose answers refuse them while it is full. With more
//     full requests than the list holds, the host calls in for all of them
//     (dc_posted_over). The host posts at most DC_POSTED_MAX_AHEAD messages
//     ahead of this side (else it calls in, which runs them), so what goes
//     over the bound is a few turns' items: those of the messages ahead
//     when the request is listed, and of one the host built before it saw
//     the list. An item that is not JSON fails its request (the caller
//     sees the error, the host's later sends to it are dropped).
//   - postHostTick (2): a runtime's handle (u64): dc_runtime_host_tick.
//   - postEngineLoad (3): an endpoint's handle (u64), the waiting requests
//     (i64) and the KV usage (f64): dc_endpoint_set_engine_load.
//   - postEngineReserve (4), postEngineActivate (5), postEngineDrop (6): an
//     engine-output reader's handle (u64), a request's (u64; 0 but for
//     postEngineActivate), the length of a request id (u32) and the id:
//     dc_engine_outputs_reserve, _activate (whose answer the host does not
//     need: the outputs' flags tell it) and _drop (engineout_exports.go).
//     The reader runs what is posted before each engine message, so a route
//     posted before its request reached the engine is in place for its
//     first output. postEngineActivate's id is the engine's (the reserved
//     id and the suffix), as dc_engine_outputs_activate's.
//   - postEngineInput (7): an engine-output reader's handle (u64), then a
//     message for the engine, as dc_engine_inputs_send takes it
//     (engineinput_exports.go): in order with the routes posted around it,
//     so a request's route is armed after its request went to the engine.
//
// A handle that is no longer valid drops its record (the host freed it
// meanwhile); so does a malformed message, logged: only the library's own
// module writes them.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
#include "posted.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
)

// The record kinds (see above).
const (
	postItems          = 1
	postHostTick       = 2
	postEngineLoad     = 3
	postEngineReserve  = 4
	postEngineActivate = 5
	postEngineDrop     = 6
	postEngineInput    = 7
)

// The values of dc_posted_over (posted.h).
const (
	postedAllPost = C.DC_POSTED_ALL_POST
	postedSome    = C.DC_POSTED_SOME
	postedBroken  = C.DC_POSTED_BROKEN
	postedAllCall = C.DC_POSTED_ALL_CALL
)

// postMaxMessage is the largest message the library reads; the host posts
// nothing larger (dynamo_ctx.h: DC_POST_MAX_MESSAGE).
const postMaxMessage = C.DC_POST_MAX_MESSAGE

var posted struct {
	once sync.Once
	err  error
	w    int // the host's end

	mu   sync.Mutex                // held while messages are read and run
	open bool                      // r is set (mu held, or after dc_post_fd)
	r    int                       // the library's end
	buf  []byte                    // one message
	over map[uint64]*plane.Request // requests posted to at or over their bound
	slot map[uint64]int            // their slots in dc_posted_full, those that have one
}

// The flags and counters shared with the host (posted.c).
var (
	postedOver = (*atomic.Uint64)(unsafe.Pointer(&C.dc_posted_over))
	postedFull = (*[C.DC_POSTED_FULL_SLOTS]atomic.Uint64)(unsafe.Pointer(&C.dc_posted_full))
	postedSent = (*atomic.Uint64)(unsafe.Pointer(&C.dc_posted_sent))
	postedDone = (*atomic.Uint64)(unsafe.Pointer(&C.dc_posted_done))
)

// dc_post_fd: see dynamo_ctx.h, the reference.
//
//export dc_post_fd
func dc_post_fd(fd *C.int) (rc C.int) {
	defer guard("dc_post_fd", &rc)
	if fd == nil {
		return fail(C.DC_EINVAL, "dc_post_fd: fd must not be NULL")
	}
	posted.once.Do(openPosted)
	if posted.err != nil {
		return fail(C.DC_EIO, "dc_post_fd: %v", posted.err)
	}
	*fd = C.int(posted.w)
	return C.DC_OK
}

// openPosted makes the socket pair and starts the goroutine that runs what
// is posted (once per process).
func openPosted() {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		posted.err = err
		return
	}
	// Room for several steps' messages: the kernel caps it (net.core.
	// wmem_max, some 400 KiB by default); a message that does not fit is
	// made as a call.
	_ = syscall.SetsockoptInt(fds[1], syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<20)
	f := os.NewFile(uintptr(fds[0]), "dynamo_ctx posted calls")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		_ = syscall.Close(fds[1])
		posted.err = err
		return
	}
	posted.mu.Lock()
	posted.r, posted.w, posted.open = fds[0], fds[1], true
	posted.buf = make([]byte, postMaxMessage)
	posted.mu.Unlock()
	go runPosted(f, rc)
}

// runPosted runs the posted messages as they arrive, for the life of the
// process (the host's end is never closed); f is posted.r's file.
func runPosted(f *os.File, rc syscall.RawConn) {
	for {
		var failed syscall.Errno
		err := rc.Read(func(uintptr) bool {
			posted.mu.Lock()
			defer posted.mu.Unlock()
			failed = drainPostedLocked()
			return failed != syscall.EAGAIN // else wait until readable
		})
		if err != nil || failed != syscall.EAGAIN {
			slog.Error("posted calls: the socket failed; the host's posts are made as calls from now on", "error", err, "errno", failed)
			stopPosting()
			return
		}
	}
}

// stopPosting turns posting off for good after the socket failed (it never
// does while the process lives): the host makes calls from now on
// (postedBroken), and the calls no longer look at the socket. What the
// socket still held is lost.
func stopPosting() {
	posted.mu.Lock()
	defer posted.mu.Unlock()
	postedOver.Store(postedBroken)
	posted.open = false
	postedDone.Store(postedSent.Load())
}

// drainPosted runs what the host posted and the library has not run yet:
// every export that acts on a request calls it first, so that it comes
// after the items posted before it.
func drainPosted() {
	over := postedOver.Load()
	if over == postedBroken || (over == postedAllPost && postedDone.Load() == postedSent.Load()) {
		return
	}
	posted.mu.Lock()
	defer posted.mu.Unlock()
	drainPostedLocked()
}

// drainPostedLocked reads and runs messages until the socket is empty (mu
// held) and returns what stopped it: EAGAIN when it was emptied.
func drainPostedLocked() syscall.Errno {
	if !posted.open {
		return syscall.EAGAIN // never opened: nothing was posted
	}
	defer recheckOver()
	for {
		n, e := rawio.TryRead(uintptr(posted.r), posted.buf)
		switch {
		case e == syscall.EINTR:
			continue
		case e != 0:
			return e
		}
		runMessageSafely(posted.buf[:n])
		postedDone.Add(1)
	}
}

// runMessageSafely is runMessage with a panic recovered and logged, as
// every export's guard does: the message counts as run, and the export or
// goroutine that ran it goes on.
func runMessageSafely(m []byte) {
	defer func() {
		if r := recover(); r != nil {
			slog.Error("posted calls: recovered panic", "panic", fmt.Sprint(r), "bytes", len(m))
		}
	}()
	runMessage(m)
}

var errMalformed = errors.New("malformed message")

// runMessage runs one message (mu held).
func runMessage(m []byte) {
	if len(m) < 4 {
		slog.Error("posted calls: a message without its kind", "bytes", len(m))
		return
	}
	var err error
	switch kind, rest := binary.LittleEndian.Uint32(m), m[4:]; kind {
	case postItems:
		err = runItems(rest)
	case postHostTick:
		if len(rest) != 8 {
			err = errMalformed
		} else if rt, e := runtimes.Get(binary.LittleEndian.Uint64(rest)); e == nil {
			rt.HostTick()
			flushEngineReaders()
		}
	case postEngineReserve, postEngineActivate, postEngineDrop:
		err = runEngineRoute(kind, rest)
	case postEngineInput:
		err = runEngineInput(rest)
	case postEngineLoad:
		if len(rest) != 24 {
			err = errMalformed
		} else if ep, e := endpoints.Get(binary.LittleEndian.Uint64(rest)); e == nil {
			waiting := int64(binary.LittleEndian.Uint64(rest[8:]))
			kv := math.Float64frombits(binary.LittleEndian.Uint64(rest[16:]))
			if !math.IsNaN(kv) && !math.IsInf(kv, 0) {
				ep.SetEngineLoad(int(min(max(waiting, -1), math.MaxInt32)), min(kv, 1))
			}
		}
	default:
		err = errMalformed
	}
	if err != nil {
		slog.Error("posted calls: a message was dropped", "kind", binary.LittleEndian.Uint32(m), "bytes", len(m), "error", err)
	}
}

// runItems sends a postItems message's items (mu held).
func runItems(m []byte) error {
	var b transport.Batch
	defer b.Flush()
	for len(m) > 0 {
		if len(m) < 12 {
			return errMalformed
		}
		h, count := binary.LittleEndian.Uint64(m), binary.LittleEndian.Uint32(m[8:])
		m = m[12:]
		if count > maxSendMany {
			return errMalformed
		}
		items := make([][]byte, count)
		for i := range items {
			if len(m) < 4 || uint64(len(m)-4) < uint64(binary.LittleEndian.Uint32(m)) {
				return errMalformed
			}
			n := binary.LittleEndian.Uint32(m)
			items[i] = append([]byte(nil), m[4:4+n]...)
			m = m[4+n:]
		}
		req, err := requests.Get(h)
		if err != nil {
			continue // freed meanwhile: as a call would have been refused
		}
		over, err := req.SendManyPosted(items, &b)
		if err != nil {
			// Only ErrNotJSON: the library's module encodes every item it
			// posts, so this is a bug; the caller sees it, as the handler's
			// error it would have been.
			slog.Error("posted calls: a request's item is not JSON; the request fails", "request", h)
			req.Fail("ValueError: the handler's item is not JSON")
			continue
		}
		if over {
			markFull(h, req)
		}
	}
	return nil
}

// markFull records that request h is at or over its bound, so that the host
// sends its items by the call (mu held): in a free slot of dc_posted_full,
// else by having the host call in for every request.
func markFull(h uint64, req *plane.Request) {
	if posted.over == nil {
		posted.over, posted.slot = map[uint64]*plane.Request{}, map[uint64]int{}
	}
	if _, ok := posted.over[h]; ok {
		return
	}
	posted.over[h] = req
	giveSlot(h)
	setOver()
}

// giveSlot lists request h in a free slot of dc_posted_full, if there is
// one (mu held).
func giveSlot(h uint64) {
	for i := range postedFull {
		if postedFull[i].Load() == 0 {
			postedFull[i].Store(h)
			posted.slot[h] = i
			return
		}
	}
}

// isOver is plane.Request.Over (a test's seam).
var isOver = (*plane.Request).Over

// recheckOver forgets the requests that are no longer at their bound (mu
// held).
func recheckOver() {
	if len(posted.over) == 0 {
		return
	}
	for h, req := range posted.over {
		if !isOver(req) {
			delete(posted.over, h)
			if i, ok := posted.slot[h]; ok {
				postedFull[i].Store(0)
				delete(posted.slot, h)
			}
		}
	}
	// Those that found no slot take the slots freed, so that the host goes
	// back to posting for the others once few enough are full.
	for h := range posted.over {
		if _, ok := posted.slot[h]; !ok && len(posted.slot) < len(postedFull) {
			giveSlot(h)
		}
	}
	setOver()
}

// setOver sets dc_posted_over from the requests that are full (mu held):
// none, all of them in dc_posted_full, or more than it holds. Once broken
// it stays so.
func setOver() {
	want := uint64(postedAllPost)
	switch {
	case len(posted.slot) < len(posted.over):
		want = postedAllCall
	case len(posted.over) > 0:
		want = postedSome
	}
	for {
		cur := postedOver.Load()
		if cur == postedBroken || cur == want || postedOver.CompareAndSwap(cur, want) {
			return
		}
	}
}
