package main

// The exports of the engine-output reader (go/engineout over go/zmtp): the
// library takes a vLLM engine core's output stream in the host's place,
// hands routed requests' plain tokens straight to their plane streams, and
// forwards every message to the host through a pipe (no call per
// message: a call from the host's thread costs the process the Go
// scheduler's polling, see posted.go). The routes of requests are posted
// calls too (runEngineRoute), or calls where posting is off.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/engineout"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/transport"
	"github.com/dynamo-ctx/dynamo-ctx/go/zmtp"
)

// engineOutputs is one reader: its listener, its router and the socket
// that carries the host its messages.
type engineOutputs struct {
	pull   *zmtp.Pull
	router *engineout.Router[*plane.Request]
	batch  transport.Batch // the deliveries of one message (the router's lock held)

	// The host's messages, each length-prefixed, go to host (the write end
	// of a pipe whose read end is the host's): written at once
	// by the reader, without waiting, while nothing is queued before them;
	// else queued for its writer (when the host reads slower than the
	// engine sends).
	host    *rawio.Queue
	frame   []byte // forward's scratch (the router's lock held)
	inPlane bool   // a delivery is in the plane's code (the router's lock held)

	suffix int // the bytes the engine adds to a request's id (dc_engine_outputs_listen)
	// The engine's input socket, once the library took it too
	// (engineinput_exports.go), and the stop notifications of the armed
	// routes' requests, by id: each aborts its request in the engine.
	inputs atomic.Pointer[engineInputs]
	armMu  sync.Mutex
	armed  map[string]armedAbort
}

// forward hands message m to the host (the router's lock held: in order).
// Once the host's pipe failed it is dropped: the host is gone.
func (e *engineOutputs) forward(m []byte) {
	e.frame = binary.LittleEndian.AppendUint32(e.frame[:0], uint32(len(m)))
	e.frame = append(e.frame, m...)
	_, _ = e.host.Write(e.frame)
	if cap(e.frame) > keptBuffer {
		e.frame = nil // the largest message's size is not kept for the reader's life
	}
}

// fail stops a reader whose handling of a message panicked (p) outside
// the plane's code (its reading, routing or forwarding): it
// delivers and forwards nothing more, since what it delivered of that
// message is unknown, and the host's end of the socket reads its end, as
// when the engine core dies (the host's reader stops and the engine's
// requests fail). The process lives on; dc_engine_outputs_free still frees
// the rest.
func (e *engineOutputs) fail(p any) error {
	slog.Error("engine outputs: the reader stopped on a panic", "panic", p)
	e.router.Close()
	e.host.Close()
	return fmt.Errorf("engine outputs: the reader stopped on a panic: %v", p)
}

func (e *engineOutputs) close() {
	if e.pull != nil {
		_ = e.pull.Close()
	}
	e.disarmAll()
	if in := e.inputs.Swap(closedInputs); in != nil && in != closedInputs {
		in.close()
	}
	e.router.Close()
	e.host.Close()
}

// keptBuffer is the largest scratch buffer a reader keeps: a larger one
// (a message far above the usual) goes back to the garbage collector.
const keptBuffer = 1 << 20

// maxEngineWindow bounds dc_engine_outputs_listen's window: a second is
// already far past what statistics may lag.
const maxEngineWindow = 1.0

// dc_engine_outputs_listen: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_listen
func dc_engine_outputs_listen(path *C.char, pathLen C.size_t, messageLayout *C.char, messageLen C.size_t,
	outputLayout *C.char, outputLen C.size_t, suffix C.size_t, window C.double, out *C.uint64_t, fd *C.int) (rc C.int) {
	defer guard("dc_engine_outputs_listen", &rc)
	if path == nil || messageLayout == nil || outputLayout == nil || out == nil || fd == nil {
		return fail(C.DC_EINVAL, "dc_engine_outputs_listen: path, layouts, out and fd must not be NULL")
	}
	w := float64(window)
	if !(w >= 0 && w <= maxEngineWindow) || suffix > 64 || pathLen == 0 {
		return fail(C.DC_EINVAL, "dc_engine_outputs_listen: window %v (0 to %v seconds), suffix %d (at most 64), a path", w, maxEngineWindow, suffix)
	}
	pipe, raw, hostFd, err := hostPipe()
	if err != nil {
		return fail(C.DC_EIO, "dc_engine_outputs_listen: %v", err)
	}
	e := &engineOutputs{host: rawio.NewQueue(pipe, raw, nil), suffix: int(suffix), armed: map[string]armedAbort{}}
	e.router, err = engineout.New(engineout.Options[*plane.Request]{
		Layout: engineout.Layout{Message: string(goBytes(messageLayout, messageLen)), Output: string(goBytes(outputLayout, outputLen))},
		Suffix: int(suffix),
		Window: time.Duration(w * float64(time.Second)),
		Deliver: func(req *plane.Request, item []byte) bool {
			if req.Ctx != nil && req.Ctx.IsStopped() {
				return false // as the worker's own sends: nothing after its request stopped
			}
			// Beyond the send buffer's bound if need be, as a posted send:
			// a request holds at most what it makes.
			e.inPlane = true
			if _, err := req.SendManyPosted([][]byte{item}, &e.batch); err != nil {
				slog.Error("engine outputs: an item the library made is not JSON", "err", err)
			}
			e.inPlane = false
			return true
		},
		Flush: func() {
			e.inPlane = true
			e.batch.Flush()
			e.inPlane = false
		},
		Forward: e.forward,
	})
	if err != nil {
		_ = syscall.Close(hostFd)
		e.host.Close()
		return fail(C.DC_EINVAL, "dc_engine_outputs_listen: %v", err)
	}
	ln, err := net.Listen("unix", string(goBytes(path, pathLen)))
	if err == nil {
		// Only this user's processes (the engine core is one) may connect,
		// whatever the umask: a peer here can have tokens sent to callers.
		if err = os.Chmod(string(goBytes(path, pathLen)), 0o600); err != nil {
			_ = ln.Close()
		}
	}
	if err != nil {
		_ = syscall.Close(hostFd)
		e.close()
		return fail(C.DC_EIO, "dc_engine_outputs_listen: %v", err)
	}
	// What the host posted (the routes of requests it hands the engine) runs
	// before each message: a route reserved before its request reached the
	// engine is in place when the request's first output comes.
	handle := func(frames [][]byte) (err error) {
		defer func() {
			if p := recover(); p != nil {
				if e.inPlane {
					// Inside the plane's sends, which may hold a request's or
					// a session's lock at the panic: the process ends, as
					// any panic of the plane ends it, rather than a later
					// send hanging on that lock.
					panic(p)
				}
				err = e.fail(p)
			}
		}()
		drainPosted()
		return e.router.Handle(frames)
	}
	e.pull = zmtp.Serve(ownerOnly{ln}, handle, zmtp.Options{Log: func(format string, args ...any) {
		slog.Warn(fmt.Sprintf(format, args...))
	}})
	*out = C.uint64_t(engineReaders.Insert(e))
	*fd = C.int(hostFd)
	liveReaders.Lock()
	liveReaders.set[e] = struct{}{}
	liveReaders.Unlock()
	return C.DC_OK
}

// liveReaders are the readers whose waiting messages the host's tick
// forwards (flushEngineReaders).
var liveReaders = struct {
	sync.Mutex
	set map[*engineOutputs]struct{}
}{set: map[*engineOutputs]struct{}{}}

// flushEngineReaders forwards what waits for the window in every reader:
// the host's tick (every HOST_TICK_MS while it serves) does, for the
// messages after which the engine sent none (engineout.Router keeps no
// timer).
func flushEngineReaders() {
	liveReaders.Lock()
	defer liveReaders.Unlock()
	for e := range liveReaders.set {
		e.router.FlushPending()
	}
}

// hostPipeSize is the capacity asked for the host's pipe: about a Unix
// stream socket's default send buffer (what carried the messages before),
// so that a host a few messages behind costs no queueing. The kernel may
// refuse it (a lower limit): the default 64 KiB then.
const hostPipeSize = 256 << 10

// hostPipe makes the pipe that carries the host its messages: the
// library's write end, non-blocking, in Go's network poller, and the host's
// read end (both close-on-exec). A pipe, not a socket pair: a socket pair
// reports its writer's end writable again (EPOLLOUT, edge-triggered in
// Go's poller) at every read of the host's, so each of the host's reads
// woke a thread of the library's for nothing; a pipe wakes its writer only
// when the read made room in a full pipe.
func hostPipe() (*os.File, syscall.RawConn, int, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, nil, -1, err
	}
	_, _, _ = syscall.Syscall(syscall.SYS_FCNTL, uintptr(p[1]), syscall.F_SETPIPE_SZ, hostPipeSize)
	f := os.NewFile(uintptr(p[1]), "engine-outputs") // non-blocking: in the poller
	raw, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		_ = syscall.Close(p[0])
		return nil, nil, -1, err
	}
	return f, raw, p[0], nil
}

// engineRoute is the call of a route change (kind: postEngineReserve,
// postEngineActivate of request, postEngineDrop) on reader h, as name;
// armed, where not nil, says whether an activation armed the route.
func engineRoute(name string, kind uint32, h C.uint64_t, id *C.char, idLen C.size_t, request C.uint64_t, armed *C.int) C.int {
	if id == nil && idLen > 0 {
		return fail(C.DC_EINVAL, "%s: id must not be NULL", name)
	}
	drainPosted() // after what the host posted before (posted.go)
	e, rc := get(engineReaders, name, h)
	if rc != C.DC_OK {
		return rc
	}
	ok, err := applyRoute(e, kind, string(goBytes(id, idLen)), uint64(request))
	if err != nil {
		return fail(C.DC_EBADF, "%s: %v", name, err)
	}
	if ok && armed != nil {
		*armed = 1
	}
	return C.DC_OK
}

// applyRoute makes one route change on reader e, called or posted: an
// activation of a handle that is not a request's drops the route (its
// request's outputs are the host's) and returns the handle's error. An
// activation's id is the engine's (the reserved id and the suffix); where
// the library holds the engine's input socket, an armed route's request,
// once stopped, is aborted in the engine from here (engineinput_exports.go)
// until the route is dropped.
func applyRoute(e *engineOutputs, kind uint32, id string, request uint64) (armed bool, err error) {
	r := e.router
	switch kind {
	case postEngineReserve:
		r.Reserve(id)
	case postEngineActivate:
		req, err := requests.Get(request)
		if len(id) < e.suffix {
			return false, err // not an id the engine made: no route reserved is armed
		}
		engineID := id[:len(id)-e.suffix]
		if err != nil {
			r.Drop(engineID)
			return false, err
		}
		if !r.Activate(engineID, req) {
			return false, nil
		}
		e.arm(engineID, id, req)
		return true, nil
	default:
		e.disarm(id)
		r.Drop(id)
	}
	return false, nil
}

// dc_engine_outputs_reserve: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_reserve
func dc_engine_outputs_reserve(h C.uint64_t, id *C.char, idLen C.size_t) (rc C.int) {
	defer guard("dc_engine_outputs_reserve", &rc)
	return engineRoute("dc_engine_outputs_reserve", postEngineReserve, h, id, idLen, 0, nil)
}

// dc_engine_outputs_activate: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_activate
func dc_engine_outputs_activate(h C.uint64_t, id *C.char, idLen C.size_t, request C.uint64_t, armed *C.int) (rc C.int) {
	defer guard("dc_engine_outputs_activate", &rc)
	if armed == nil {
		return fail(C.DC_EINVAL, "dc_engine_outputs_activate: armed must not be NULL")
	}
	*armed = 0
	return engineRoute("dc_engine_outputs_activate", postEngineActivate, h, id, idLen, request, armed)
}

// dc_engine_outputs_drop: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_drop
func dc_engine_outputs_drop(h C.uint64_t, id *C.char, idLen C.size_t) (rc C.int) {
	defer guard("dc_engine_outputs_drop", &rc)
	return engineRoute("dc_engine_outputs_drop", postEngineDrop, h, id, idLen, 0, nil)
}

// dc_engine_outputs_peers: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_peers
func dc_engine_outputs_peers(h C.uint64_t, n *C.int) (rc C.int) {
	defer guard("dc_engine_outputs_peers", &rc)
	if n == nil {
		return fail(C.DC_EINVAL, "dc_engine_outputs_peers: n must not be NULL")
	}
	e, rc := get(engineReaders, "dc_engine_outputs_peers", h)
	if rc != C.DC_OK {
		return rc
	}
	*n = C.int(e.pull.Peers())
	return C.DC_OK
}

// dc_engine_outputs_sent: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_sent
func dc_engine_outputs_sent(h C.uint64_t, tokens *C.int64_t) (rc C.int) {
	defer guard("dc_engine_outputs_sent", &rc)
	if tokens == nil {
		return fail(C.DC_EINVAL, "dc_engine_outputs_sent: tokens must not be NULL")
	}
	e, rc := get(engineReaders, "dc_engine_outputs_sent", h)
	if rc != C.DC_OK {
		return rc
	}
	*tokens = C.int64_t(e.router.Sent())
	return C.DC_OK
}

// dc_engine_outputs_free: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_outputs_free
func dc_engine_outputs_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_engine_outputs_free", &rc)
	e, err := engineReaders.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_engine_outputs_free: %v", err)
	}
	liveReaders.Lock()
	delete(liveReaders.set, e)
	liveReaders.Unlock()
	e.close()
	return C.DC_OK
}

// runEngineRoute runs a posted route message (posted.mu held): the
// reader's handle (u64), the request's (u64, for postEngineActivate), the
// id's length (u32) and the id. A reader or request freed meanwhile drops
// it, as a call would have been refused (an activation dropped so leaves
// the request's outputs the host's).
func runEngineRoute(kind uint32, m []byte) error {
	if len(m) < 20 || uint64(len(m)-20) != uint64(binary.LittleEndian.Uint32(m[16:])) {
		return errMalformed
	}
	e, err := engineReaders.Get(binary.LittleEndian.Uint64(m))
	if err != nil {
		return nil
	}
	_, _ = applyRoute(e, kind, string(m[20:]), binary.LittleEndian.Uint64(m[8:])) // a request freed: its route dropped, nothing to tell
	return nil
}
