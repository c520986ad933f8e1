package main

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// The enums of the public header; cgo declares the exports itself.
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"

// Implemented in errors.c.
void dc_set_error(const char* msg, size_t len);
size_t dc_copy_error(char* buf, size_t cap);
extern uint64_t dc_kill_epoch;
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/handle"
	"github.com/dynamo-ctx/dynamo-ctx/go/killtrace"
	"github.com/dynamo-ctx/dynamo-ctx/go/logqueue"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/wake"
)

func init() {
	// Kills are counted where C reads the count without calling into Go
	// (py_client.c's kill_epoch).
	ctxtree.CountKills((*atomic.Uint64)(unsafe.Pointer(&C.dc_kill_epoch)))
}

const (
	kindContext handle.Kind = 1
	kindQueue   handle.Kind = 2
)

// The C enums are the Go packages' values, checked here at compile time, every
// value both ways (an index out of range does not compile): the ABI passes
// them through as they are.
var (
	_ = [1]int{}[ctxtree.Live-C.DC_LIVE]
	_ = [1]int{}[C.DC_LIVE-ctxtree.Live]
	_ = [1]int{}[ctxtree.Stopped-C.DC_STOPPED]
	_ = [1]int{}[C.DC_STOPPED-ctxtree.Stopped]
	_ = [1]int{}[ctxtree.Killed-C.DC_KILLED]
	_ = [1]int{}[C.DC_KILLED-ctxtree.Killed]
	_ = [1]int{}[ctxtree.StateMask-C.DC_STATE_MASK]
	_ = [1]int{}[C.DC_STATE_MASK-ctxtree.StateMask]
	_ = [1]int{}[ctxtree.ReasonShift-C.DC_REASON_SHIFT]
	_ = [1]int{}[C.DC_REASON_SHIFT-ctxtree.ReasonShift]
	_ = [1]int{}[ctxtree.CauseShift-C.DC_CAUSE_SHIFT]
	_ = [1]int{}[C.DC_CAUSE_SHIFT-ctxtree.CauseShift]
	_ = [1]int{}[ctxtree.FieldMask-C.DC_FIELD_MASK]
	_ = [1]int{}[C.DC_FIELD_MASK-ctxtree.FieldMask]
	_ = [1]int{}[ctxtree.ReasonNone-C.DC_REASON_NONE]
	_ = [1]int{}[C.DC_REASON_NONE-ctxtree.ReasonNone]
	_ = [1]int{}[ctxtree.ReasonStopGenerating-C.DC_REASON_STOP_GENERATING]
	_ = [1]int{}[C.DC_REASON_STOP_GENERATING-ctxtree.ReasonStopGenerating]
	_ = [1]int{}[ctxtree.ReasonKill-C.DC_REASON_KILL]
	_ = [1]int{}[C.DC_REASON_KILL-ctxtree.ReasonKill]
	_ = [1]int{}[ctxtree.ReasonClientDisconnected-C.DC_REASON_CLIENT_DISCONNECTED]
	_ = [1]int{}[C.DC_REASON_CLIENT_DISCONNECTED-ctxtree.ReasonClientDisconnected]
	_ = [1]int{}[ctxtree.ReasonParent-C.DC_REASON_PARENT]
	_ = [1]int{}[C.DC_REASON_PARENT-ctxtree.ReasonParent]
	_ = [1]int{}[ctxtree.ReasonDeadline-C.DC_REASON_DEADLINE]
	_ = [1]int{}[C.DC_REASON_DEADLINE-ctxtree.ReasonDeadline]
	_ = [1]int{}[ctxtree.ReasonConnectionLost-C.DC_REASON_CONNECTION_LOST]
	_ = [1]int{}[C.DC_REASON_CONNECTION_LOST-ctxtree.ReasonConnectionLost]
	_ = [1]int{}[ctxtree.ReasonShutdown-C.DC_REASON_SHUTDOWN]
	_ = [1]int{}[C.DC_REASON_SHUTDOWN-ctxtree.ReasonShutdown]
	_ = [1]int{}[ctxtree.MaxIDLen-C.DC_MAX_ID_LEN]
	_ = [1]int{}[C.DC_MAX_ID_LEN-ctxtree.MaxIDLen]
	_ = [1]int{}[int64(ctxtree.MaxTimeout/time.Second)-C.DC_MAX_TIMEOUT_SECONDS]
	_ = [1]int{}[C.DC_MAX_TIMEOUT_SECONDS-int64(ctxtree.MaxTimeout/time.Second)]
	_ = [1]int{}[int64(plane.HostTickInterval/time.Millisecond)-C.DC_HOST_TICK_MS]
	_ = [1]int{}[C.DC_HOST_TICK_MS-int64(plane.HostTickInterval/time.Millisecond)]
)

var (
	contexts = handle.NewTable[*ctxtree.Context](kindContext)
	queues   = handle.NewTable[*wake.EventQueue](kindQueue)
	cVersion = C.CString(version) // static for the life of the process
)

// fail records msg as the calling thread's last error and returns code.
func fail(code C.int, format string, args ...any) C.int {
	msg := fmt.Sprintf(format, args...)
	if len(msg) == 0 {
		C.dc_set_error(nil, 0)
	} else {
		C.dc_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	return code
}

// guard turns a panic in an exported function into DC_EINTERNAL: nothing may
// unwind across the C boundary.
func guard(name string, rc *C.int) {
	if r := recover(); r != nil {
		slog.Error("recovered panic", "function", name, "panic", fmt.Sprint(r))
		*rc = fail(C.DC_EINTERNAL, "%s: internal error (recovered panic): %v", name, r)
	}
}

func getContext(name string, h C.uint64_t) (*ctxtree.Context, C.int) {
	c, err := contexts.Get(uint64(h))
	if err != nil {
		return nil, fail(C.DC_EBADF, "%s: %v", name, err)
	}
	return c, C.DC_OK
}

func getQueue(name string, h C.uint64_t) (*wake.EventQueue, C.int) {
	q, err := queues.Get(uint64(h))
	if err != nil {
		return nil, fail(C.DC_EBADF, "%s: %v", name, err)
	}
	return q, C.DC_OK
}

// newContext allocates the state word outside the Go heap, so C code may keep
// a pointer to it and poll it without calling into Go. The word is freed by
// the garbage collector's cleanup once the Go context is unreachable: its
// handle is gone and no parent or propagation holds it any more.
func newContext(id string) *ctxtree.Context {
	word := C.calloc(1, 4)
	if word == nil {
		panic("out of memory")
	}
	c := ctxtree.New(id, ctxtree.WithStateWord((*atomic.Uint32)(word)))
	runtime.AddCleanup(c, func(p unsafe.Pointer) { C.free(p) }, word)
	return c
}

func putContext(c *ctxtree.Context, out *C.uint64_t) {
	*out = C.uint64_t(contexts.Insert(c))
}

// writeString copies s into the caller's buffer with a terminating NUL and
// stores its length (without the NUL) in *n; DC_ERANGE if it does not fit.
func writeString(name, s string, buf *C.char, bufLen C.size_t, n *C.size_t) C.int {
	if n != nil {
		*n = C.size_t(len(s))
	}
	if buf == nil || uint64(bufLen) < uint64(len(s))+1 {
		return fail(C.DC_ERANGE, "%s: buffer of %d bytes is too small for %d bytes and a NUL", name, bufLen, len(s))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(bufLen))
	copy(dst, s)
	dst[len(s)] = 0
	return C.DC_OK
}

// dc_version: see dynamo_ctx.h, the reference.
//
//export dc_version
func dc_version() *C.char { return cVersion }

// stringConstants are the facts Python needs that Go owns (see
// dc_string_constant): each is written once, in its Go package.
var stringConstants = map[string]string{
	"handler_error_prefix": plane.HandlerErrorPrefix,
	"nats_env":             plane.NATSEnv,
	"nats_default_url":     plane.DefaultNATSURL,
	"kill_trace_env":       killtrace.Env,
}

// dc_string_constant: see dynamo_ctx.h, the reference.
//
//export dc_string_constant
func dc_string_constant(name *C.char, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_string_constant", &rc)
	if name == nil {
		return fail(C.DC_EINVAL, "dc_string_constant: name is NULL")
	}
	key := C.GoString(name)
	v, ok := stringConstants[key]
	if !ok {
		return fail(C.DC_ENOENT, "dc_string_constant: no constant %q", key)
	}
	return writeString("dc_string_constant", v, buf, bufLen, n)
}

// dc_last_error: see dynamo_ctx.h, the reference.
//
//export dc_last_error
func dc_last_error(buf *C.char, bufLen C.size_t) C.size_t {
	return C.dc_copy_error(buf, bufLen)
}

// dc_context_new: see dynamo_ctx.h, the reference.
//
//export dc_context_new
func dc_context_new(id *C.char, idLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_new", &rc)
	if id == nil || out == nil {
		return fail(C.DC_EINVAL, "dc_context_new: id and out must not be NULL")
	}
	if err := ctxtree.ValidateID(cString(id, idLen)); err != nil {
		return fail(C.DC_EINVAL, "dc_context_new: %v", err)
	}
	putContext(newContext(C.GoStringN(id, C.int(idLen))), out)
	return C.DC_OK
}

// dc_id_check: see dynamo_ctx.h, the reference.
//
//export dc_id_check
func dc_id_check(id *C.char, idLen C.size_t) (rc C.int) {
	defer guard("dc_id_check", &rc)
	if id == nil && idLen > 0 {
		return fail(C.DC_EINVAL, "dc_id_check: id must not be NULL")
	}
	if err := ctxtree.ValidateID(cString(id, idLen)); err != nil {
		return fail(C.DC_EINVAL, "dc_id_check: %v", err)
	}
	return C.DC_OK
}

// cString is the n bytes at p as a string without copying them: only for
// reading them during the call (nothing may keep it). "" for n == 0.
func cString(p *C.char, n C.size_t) string {
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), int(n))
}

// dc_context_new_uuid: see dynamo_ctx.h, the reference.
//
//export dc_context_new_uuid
func dc_context_new_uuid(out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_new_uuid", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_new_uuid: out must not be NULL")
	}
	putContext(newContext(ctxtree.NewID()), out)
	return C.DC_OK
}

// dc_context_free: see dynamo_ctx.h, the reference.
//
//export dc_context_free
func dc_context_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_context_free", &rc)
	if _, err := contexts.Remove(uint64(h)); err != nil {
		return fail(C.DC_EBADF, "dc_context_free: %v", err)
	}
	return C.DC_OK
}

// dc_context_id: see dynamo_ctx.h, the reference.
//
//export dc_context_id
func dc_context_id(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_context_id", &rc)
	c, rc := getContext("dc_context_id", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_context_id", c.ID(), buf, bufLen, n)
}

// dc_context_state: see dynamo_ctx.h, the reference.
//
//export dc_context_state
func dc_context_state(h C.uint64_t, word *C.uint32_t) (rc C.int) {
	defer guard("dc_context_state", &rc)
	if word == nil {
		return fail(C.DC_EINVAL, "dc_context_state: word must not be NULL")
	}
	c, rc := getContext("dc_context_state", h)
	if rc != C.DC_OK {
		return rc
	}
	*word = C.uint32_t(c.StateWord().Load())
	return C.DC_OK
}

// dc_context_state_word: see dynamo_ctx.h, the reference.
//
//export dc_context_state_word
func dc_context_state_word(h C.uint64_t, out **C.uint32_t) (rc C.int) {
	defer guard("dc_context_state_word", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_state_word: out must not be NULL")
	}
	c, rc := getContext("dc_context_state_word", h)
	if rc != C.DC_OK {
		return rc
	}
	*out = (*C.uint32_t)(unsafe.Pointer(c.StateWord()))
	return C.DC_OK
}

// dc_context_cancel: see dynamo_ctx.h, the reference.
//
//export dc_context_cancel
func dc_context_cancel(h C.uint64_t, state C.uint32_t, reason C.uint32_t) C.int {
	return cancelContext("dc_context_cancel", h, state, reason)
}

func cancelContext(name string, h C.uint64_t, state C.uint32_t, reason C.uint32_t) (rc C.int) {
	defer guard(name, &rc)
	st, r, rc := cancelArgs(name, state, reason)
	if rc != C.DC_OK {
		return rc
	}
	c, rc := getContext(name, h)
	if rc != C.DC_OK {
		return rc
	}
	c.Cancel(st, r)
	return C.DC_OK
}

// cancelArgs checks the state and reason of a cancel: DC_STOPPED or
// DC_KILLED, and a defined reason other than DC_REASON_NONE.
func cancelArgs(name string, state, reason C.uint32_t) (ctxtree.State, ctxtree.Reason, C.int) {
	st, r := ctxtree.State(state), ctxtree.Reason(reason)
	if st != ctxtree.Stopped && st != ctxtree.Killed {
		return st, r, fail(C.DC_EINVAL, "%s: state must be DC_STOPPED or DC_KILLED, got %d", name, state)
	}
	if !r.Valid() {
		return st, r, fail(C.DC_EINVAL, "%s: unknown reason %d", name, reason)
	}
	return st, r, C.DC_OK
}

// dc_state_word_next: see dynamo_ctx.h, the reference.
//
//export dc_state_word_next
func dc_state_word_next(word C.uint32_t, state C.uint32_t, reason C.uint32_t, out *C.uint32_t) (rc C.int) {
	defer guard("dc_state_word_next", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_state_word_next: out must not be NULL")
	}
	st, r, rc := cancelArgs("dc_state_word_next", state, reason)
	if rc != C.DC_OK {
		return rc
	}
	next, _ := ctxtree.Next(uint32(word), st, r, r) // a direct cancel: its cause is its reason
	*out = C.uint32_t(next)
	return C.DC_OK
}

// dc_context_stop_generating: see dynamo_ctx.h, the reference.
//
//export dc_context_stop_generating
func dc_context_stop_generating(h C.uint64_t) C.int {
	return cancelContext("dc_context_stop_generating", h, C.DC_STOPPED, C.DC_REASON_STOP_GENERATING)
}

// dc_context_kill: see dynamo_ctx.h, the reference.
//
//export dc_context_kill
func dc_context_kill(h C.uint64_t) C.int {
	return cancelContext("dc_context_kill", h, C.DC_KILLED, C.DC_REASON_KILL)
}

// dc_context_link_child: see dynamo_ctx.h, the reference.
//
//export dc_context_link_child
func dc_context_link_child(parent, child C.uint64_t) (rc C.int) {
	defer guard("dc_context_link_child", &rc)
	p, rc := getContext("dc_context_link_child (parent)", parent)
	if rc != C.DC_OK {
		return rc
	}
	c, rc := getContext("dc_context_link_child (child)", child)
	if rc != C.DC_OK {
		return rc
	}
	p.LinkChild(c)
	return C.DC_OK
}

// dc_context_child: see dynamo_ctx.h, the reference.
//
//export dc_context_child
func dc_context_child(parent C.uint64_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_context_child", &rc)
	if out == nil {
		return fail(C.DC_EINVAL, "dc_context_child: out must not be NULL")
	}
	p, rc := getContext("dc_context_child", parent)
	if rc != C.DC_OK {
		return rc
	}
	c := newContext(p.ID())
	p.LinkChild(c)
	putContext(c, out)
	return C.DC_OK
}

// dc_context_set_timeout: see dynamo_ctx.h, the reference.
//
//export dc_context_set_timeout
func dc_context_set_timeout(h C.uint64_t, seconds C.double) (rc C.int) {
	defer guard("dc_context_set_timeout", &rc)
	if err := ctxtree.TimeoutError(float64(seconds)); err != nil {
		return fail(C.DC_EINVAL, "dc_context_set_timeout: %v", err)
	}
	c, rc := getContext("dc_context_set_timeout", h)
	if rc != C.DC_OK {
		return rc
	}
	c.SetDeadline(time.Now().Add(time.Duration(float64(seconds) * float64(time.Second))))
	return C.DC_OK
}

// dc_context_remaining: see dynamo_ctx.h, the reference.
//
//export dc_context_remaining
func dc_context_remaining(h C.uint64_t, seconds *C.double) (rc C.int) {
	defer guard("dc_context_remaining", &rc)
	if seconds == nil {
		return fail(C.DC_EINVAL, "dc_context_remaining: seconds must not be NULL")
	}
	c, rc := getContext("dc_context_remaining", h)
	if rc != C.DC_OK {
		return rc
	}
	left, ok := c.Remaining()
	if !ok {
		*seconds = -1
		return C.DC_OK
	}
	*seconds = C.double(left.Seconds())
	return C.DC_OK
}

// dc_context_finish: see dynamo_ctx.h, the reference.
//
//export dc_context_finish
func dc_context_finish(h C.uint64_t) (rc C.int) {
	defer guard("dc_context_finish", &rc)
	c, rc := getContext("dc_context_finish", h)
	if rc != C.DC_OK {
		return rc
	}
	c.Finish()
	return C.DC_OK
}

// dc_reason_name: see dynamo_ctx.h, the reference.
//
//export dc_reason_name
func dc_reason_name(reason C.uint32_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_reason_name", &rc)
	r := ctxtree.Reason(reason)
	if !r.Valid() {
		return fail(C.DC_EINVAL, "dc_reason_name: unknown reason %d", reason)
	}
	return writeString("dc_reason_name", r.String(), buf, bufLen, n)
}

// dc_queue_new: see dynamo_ctx.h, the reference.
//
//export dc_queue_new
func dc_queue_new(out *C.uint64_t, fd *C.int) (rc C.int) {
	defer guard("dc_queue_new", &rc)
	if out == nil || fd == nil {
		return fail(C.DC_EINVAL, "dc_queue_new: out and fd must not be NULL")
	}
	e, err := wake.NewEventQueue()
	if err != nil {
		return fail(C.DC_EIO, "dc_queue_new: %v", err)
	}
	*out = C.uint64_t(queues.Insert(e))
	*fd = C.int(e.Fd())
	return C.DC_OK
}

// dc_queue_drain_after: see dynamo_ctx.h, the reference.
//
//export dc_queue_drain_after
func dc_queue_drain_after(h C.uint64_t, bytes *C.size_t) (rc C.int) {
	defer guard("dc_queue_drain_after", &rc)
	if bytes == nil {
		return fail(C.DC_EINVAL, "dc_queue_drain_after: bytes must not be NULL")
	}
	e, rc := getQueue("dc_queue_drain_after", h)
	if rc != C.DC_OK {
		return rc
	}
	*bytes = C.size_t(max(e.DrainAfter(), 0))
	return C.DC_OK
}

// dc_queue_free: see dynamo_ctx.h, the reference.
//
//export dc_queue_free
func dc_queue_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_queue_free", &rc)
	e, err := queues.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_queue_free: %v", err)
	}
	e.Close()
	return C.DC_OK
}

// dc_queue_drain: see dynamo_ctx.h, the reference.
//
//export dc_queue_drain
func dc_queue_drain(h C.uint64_t, buf *C.uint64_t, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_queue_drain", &rc)
	if n == nil || (buf == nil && bufLen > 0) {
		return fail(C.DC_EINVAL, "dc_queue_drain: buf and n must not be NULL")
	}
	e, rc := getQueue("dc_queue_drain", h)
	if rc != C.DC_OK {
		return rc
	}
	var dst []uint64
	if bufLen > 0 {
		dst = unsafe.Slice((*uint64)(unsafe.Pointer(buf)), int(bufLen))
	}
	got, _ := e.Drain(dst)
	*n = C.size_t(got)
	return C.DC_OK
}

// dc_context_watch: see dynamo_ctx.h, the reference.
//
//export dc_context_watch
func dc_context_watch(h C.uint64_t, q C.uint64_t, state C.uint32_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_context_watch", &rc)
	st := ctxtree.State(state)
	if st != ctxtree.Stopped && st != ctxtree.Killed {
		return fail(C.DC_EINVAL, "dc_context_watch: state must be DC_STOPPED or DC_KILLED, got %d", state)
	}
	c, rc := getContext("dc_context_watch", h)
	if rc != C.DC_OK {
		return rc
	}
	e, rc := getQueue("dc_context_watch", q)
	if rc != C.DC_OK {
		return rc
	}
	tok := uint64(token)
	switch err := e.Watch(tok, func(fire func()) func() bool { return c.Notify(st, fire) }); {
	case errors.Is(err, wake.ErrDuplicate):
		return fail(C.DC_EEXIST, "dc_context_watch: token %d is already pending on this queue", tok)
	case err != nil:
		return fail(C.DC_EBADF, "dc_context_watch: queue is being freed")
	}
	return C.DC_OK
}

// dc_queue_unwatch: see dynamo_ctx.h, the reference.
//
//export dc_queue_unwatch
func dc_queue_unwatch(q C.uint64_t, token C.uint64_t) (rc C.int) {
	defer guard("dc_queue_unwatch", &rc)
	e, rc := getQueue("dc_queue_unwatch", q)
	if rc != C.DC_OK {
		return rc
	}
	if err := e.Unwatch(uint64(token)); err != nil {
		return fail(C.DC_ENOENT, "dc_queue_unwatch: token %d is not pending", uint64(token))
	}
	return C.DC_OK
}

// dc_handle_counts: see dynamo_ctx.h, the reference.
//
//export dc_handle_counts
func dc_handle_counts(nContexts, nQueues, nOther *C.uint64_t) (rc C.int) {
	defer guard("dc_handle_counts", &rc)
	if nContexts != nil {
		*nContexts = C.uint64_t(contexts.Len())
	}
	if nQueues != nil {
		*nQueues = C.uint64_t(queues.Len())
	}
	if nOther != nil {
		*nOther = C.uint64_t(runtimes.Len() + endpoints.Len() + requests.Len() + clients.Len() + streams.Len() + frontends.Len())
	}
	return C.DC_OK
}

// dc_runtime_stats: see dynamo_ctx.h, the reference.
//
//export dc_runtime_stats
func dc_runtime_stats(collect C.int, goroutines, heapBytes *C.uint64_t) (rc C.int) {
	defer guard("dc_runtime_stats", &rc)
	if collect != 0 {
		runtime.GC()
	}
	if goroutines != nil {
		*goroutines = C.uint64_t(runtime.NumGoroutine())
	}
	if heapBytes != nil {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		*heapBytes = C.uint64_t(ms.HeapAlloc)
	}
	return C.DC_OK
}

// dc_selftest_panic: see dynamo_ctx.h, the reference.
//
//export dc_selftest_panic
func dc_selftest_panic() (rc C.int) {
	defer guard("dc_selftest_panic", &rc)
	var m map[string]int
	m["boom"]++ // a real runtime panic (nil map write), not just panic("...")
	return C.DC_OK
}

// dc_log_fd: see dynamo_ctx.h, the reference.
//
//export dc_log_fd
func dc_log_fd(fd *C.int) (rc C.int) {
	defer guard("dc_log_fd", &rc)
	if fd == nil {
		return fail(C.DC_EINVAL, "dc_log_fd: fd must not be NULL")
	}
	if logs == nil {
		return fail(C.DC_EIO, "dc_log_fd: the log queue could not be created")
	}
	*fd = C.int(logs.Fd())
	return C.DC_OK
}

// dc_log_set_level: see dynamo_ctx.h, the reference.
//
//export dc_log_set_level
func dc_log_set_level(level C.int) (rc C.int) {
	defer guard("dc_log_set_level", &rc)
	if logs != nil {
		logs.SetLevel(int(level))
	}
	return C.DC_OK
}

// dc_log_next: see dynamo_ctx.h, the reference.
//
//export dc_log_next
func dc_log_next(level *C.int, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_log_next", &rc)
	if level == nil || n == nil {
		return fail(C.DC_EINVAL, "dc_log_next: level and len must not be NULL")
	}
	code := C.int(C.DC_OK)
	// On DC_ERANGE the record stays queued, so the fd stays readable.
	if !logs.Next(func(r logqueue.Record) bool {
		*level = C.int(r.Level)
		code = writeString("dc_log_next", r.Msg, buf, bufLen, n)
		return code == C.DC_OK
	}) {
		return fail(C.DC_EAGAIN, "dc_log_next: no record")
	}
	return code
}
