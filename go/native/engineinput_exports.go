package main

// The engine's input socket, taken by the library too: vLLM's engine core
// reads its requests from a ZeroMQ DEALER socket connected to its
// client's ROUTER. Where the host hands the library that ROUTER's path
// (dc_engine_inputs_listen), the library listens there (go/zmtp's Router),
// sends what the host gives it (dc_engine_inputs_send, or posted), and
// aborts a request in the engine itself the moment its context stops,
// from the goroutine that stops it (the Kill frame's reader, a deadline's
// timer): the host's event loop, and the ZeroMQ I/O thread behind it, are
// no longer on a cancellation's path to the engine. The host still aborts
// the request its own way when it learns of the stop (its own bookkeeping;
// the engine drops an abort of a request it no longer has).

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
	"time"
	"unicode/utf8"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/zmtp"
)

// engineInputs is one engine's input socket, in the library.
type engineInputs struct {
	router    *zmtp.Router
	identity  []byte // the engine's DEALER's routing id
	abortType []byte // the first frame of an abort (vLLM's EngineCoreRequestType.ABORT)
	aborts    atomic.Int64
}

// closedInputs marks a reader freed: its inputs can no longer be taken.
var closedInputs = &engineInputs{}

func (in *engineInputs) close() { _ = in.router.Close() }

// abort sends the engine an abort of request id, never waiting.
func (in *engineInputs) abort(id string) {
	if in.router.Send(in.identity, in.abortType, abortBody(id)) {
		in.aborts.Add(1)
	}
}

// abortBody is an abort's body: MessagePack's array of the one id.
func abortBody(id string) []byte {
	b := make([]byte, 0, len(id)+6)
	b = append(b, 0x91)
	switch n := len(id); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = append(b, 0xdb)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
	}
	return append(b, id...)
}

// arm has request req (the engine's id for it: engineID and the suffix)
// aborted in the engine once its context stops, until disarm.
func (e *engineOutputs) arm(engineID, id string, req *plane.Request) {
	if req.Ctx == nil || !utf8.ValidString(id) {
		return // vLLM's ids are strings: the engine's decoder refuses anything else
	}
	e.armMu.Lock()
	defer e.armMu.Unlock()
	in := e.inputs.Load()
	if e.armed == nil || in == nil || in == closedInputs {
		return // freed (disarmAll ran), or the inputs are vLLM's
	}
	if prev, ok := e.armed[engineID]; ok {
		prev.disarm()
	}
	// Counted before it is registered: a kill that comes at once finds
	// the context's watches handed off (handOff).
	libraryAborts.add(req.Ctx, 1)
	// Registered under armMu: a stop that comes at once runs the abort
	// here, which takes no lock of the reader's.
	c := req.Ctx
	e.armed[engineID] = armedAbort{c.Notify(ctxtree.Stopped, func() {
		in.abort(id)
		libraryAborts.aborted(c)
	}), c}
}

// armedAbort is an armed route's abort on stop: its notification, and
// the context it is registered on.
type armedAbort struct {
	stop func() bool
	ctx  *ctxtree.Context
}

func (a armedAbort) disarm() {
	a.stop()
	libraryAborts.add(a.ctx, -1)
}

// disarm forgets engineID's abort on stop.
func (e *engineOutputs) disarm(engineID string) {
	e.armMu.Lock()
	a, ok := e.armed[engineID]
	delete(e.armed, engineID) // a no-op on nil
	e.armMu.Unlock()
	if ok {
		a.disarm()
	}
}

// disarmAll forgets every abort on stop, for good: the reader is being
// freed, and arm arms nothing more.
func (e *engineOutputs) disarmAll() {
	e.armMu.Lock()
	armed := e.armed
	e.armed = nil
	e.armMu.Unlock()
	for _, a := range armed {
		a.disarm()
	}
}

// killHandOff is how much later than the library's abort the host's
// event loop learns of a kill of a request the library aborts in the
// engine itself (an armed route's request): a watch of its context
// (dc_context_watch) that a kill fires fires no sooner than that after the
// abort left; one that fires later than that, at once. The host's work on
// a kill (its handler's cancellation, its engine client's own abort and
// books) would otherwise run on the CPUs at the moment the engine core's
// input thread needs one to read the abort: on the project's two-core
// machine, with the host's work deferred, the engine read the abort 0.3 ms
// sooner at the median (docs/benchmarks.md, "Disconnect -> engine
// abort"). A stop that is not a kill reaches the host at once (its caller
// waits for the stream's end), as does every poll of the context's state.
const killHandOff = 5 * time.Millisecond

// libraryAborts counts, by context, the armed routes that abort a request
// in the engine once the context stops, and keeps when the first of those
// aborts left.
var libraryAborts = contextCounts{n: map[*ctxtree.Context]abortCount{}}

type contextCounts struct {
	mu sync.Mutex
	n  map[*ctxtree.Context]abortCount
}

type abortCount struct {
	n  int
	at time.Time // when the library's first abort for the context left; zero until then
}

func (cc *contextCounts) add(c *ctxtree.Context, d int) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if e := cc.n[c]; e.n+d > 0 {
		e.n += d
		cc.n[c] = e
	} else {
		delete(cc.n, c)
	}
}

// aborted notes that the library's abort of a request of c left (the
// first one counts), while c is counted.
func (cc *contextCounts) aborted(c *ctxtree.Context) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if e, ok := cc.n[c]; ok && e.at.IsZero() {
		e.at = time.Now()
		cc.n[c] = e
	}
}

// wait is how much longer a watch of killed context c waits (handOff):
// killHandOff after the library's abort left, all of it if the abort is
// yet to leave (the watch fired first), none if the library aborts nothing
// of c.
func (cc *contextCounts) wait(c *ctxtree.Context) time.Duration {
	cc.mu.Lock()
	e := cc.n[c]
	cc.mu.Unlock()
	switch {
	case e.n == 0:
		return 0
	case e.at.IsZero():
		return killHandOff
	}
	return killHandOff - time.Since(e.at)
}

// handOff is a watch's fire for context c: at once, unless c is killed
// and the library aborts a request of c in the engine itself, when it
// fires killHandOff after that abort left (on a timer: the killing
// goroutine goes on).
func handOff(c *ctxtree.Context, fire func()) func() {
	return func() {
		if c.IsKilled() {
			if d := libraryAborts.wait(c); d > 0 {
				time.AfterFunc(d, fire)
				return
			}
		}
		fire()
	}
}

// maxEngineIdentity bounds an identity (ZMTP's routing ids are at most
// 255 bytes) and maxAbortType the abort's type frame.
const (
	maxEngineIdentity = 255
	maxAbortType      = 16
)

// dc_engine_inputs_listen: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_inputs_listen
func dc_engine_inputs_listen(h C.uint64_t, path *C.char, pathLen C.size_t, identity *C.char, identityLen C.size_t,
	abortType *C.char, abortTypeLen C.size_t) (rc C.int) {
	defer guard("dc_engine_inputs_listen", &rc)
	if path == nil || identity == nil || abortType == nil || pathLen == 0 || identityLen == 0 || identityLen > maxEngineIdentity ||
		abortTypeLen == 0 || abortTypeLen > maxAbortType {
		return fail(C.DC_EINVAL, "dc_engine_inputs_listen: a path, an identity of 1 to %d bytes and an abort type of 1 to %d",
			maxEngineIdentity, maxAbortType)
	}
	e, rc := get(engineReaders, "dc_engine_inputs_listen", h)
	if rc != C.DC_OK {
		return rc
	}
	if e.inputs.Load() != nil {
		return fail(C.DC_EINVAL, "dc_engine_inputs_listen: the reader listens for the engine's inputs already, or was freed")
	}
	p := string(goBytes(path, pathLen))
	ln, err := net.Listen("unix", p)
	if err == nil {
		// As the outputs' socket: a peer here reads every request's prompt.
		if err = os.Chmod(p, 0o600); err != nil {
			_ = ln.Close()
		}
	}
	if err != nil {
		return fail(C.DC_EIO, "dc_engine_inputs_listen: %v", err)
	}
	in := &engineInputs{identity: goBytes(identity, identityLen), abortType: goBytes(abortType, abortTypeLen)}
	// The engine's DEALER says nothing after its first connection's
	// greeting; what a peer sends is read and dropped.
	in.router = zmtp.ServeRouter(ownerOnly{ln}, func([][]byte) error { return nil }, zmtp.Options{
		MaxMessage: 1 << 20,
		Log:        func(format string, args ...any) { slog.Warn(fmt.Sprintf(format, args...)) },
	})
	if !e.inputs.CompareAndSwap(nil, in) {
		in.close()
		return fail(C.DC_EINVAL, "dc_engine_inputs_listen: the reader listens for the engine's inputs already, or was freed")
	}
	return C.DC_OK
}

// inputsOf is reader h's input socket (name for errors).
func inputsOf(name string, h C.uint64_t) (*engineInputs, C.int) {
	e, rc := get(engineReaders, name, h)
	if rc != C.DC_OK {
		return nil, rc
	}
	in := e.inputs.Load()
	if in == nil || in == closedInputs {
		return nil, fail(C.DC_EINVAL, "%s: the reader does not hold the engine's inputs", name)
	}
	return in, C.DC_OK
}

// sendInput sends one message in the host's form (a frame count (u32),
// then each frame's length (u32) and bytes, little-endian; the first
// frame names the peer, as a ROUTER socket's sends do).
func sendInput(in *engineInputs, m []byte) error {
	if len(m) < 4 {
		return errMalformed
	}
	count := binary.LittleEndian.Uint32(m)
	m = m[4:]
	if count < 2 || uint64(count) > uint64(len(m))/4 {
		return errMalformed
	}
	frames := make([][]byte, count)
	for i := range frames {
		if len(m) < 4 {
			return errMalformed
		}
		n := int(binary.LittleEndian.Uint32(m))
		if n > len(m)-4 {
			return errMalformed
		}
		frames[i], m = m[4:4+n], m[4+n:]
	}
	if len(m) != 0 {
		return errMalformed
	}
	in.router.Send(frames[0], frames[1:]...) // a peer not connected drops it, as a ROUTER socket does
	return nil
}

// dc_engine_inputs_send: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_inputs_send
func dc_engine_inputs_send(h C.uint64_t, msg *C.char, msgLen C.size_t) (rc C.int) {
	defer guard("dc_engine_inputs_send", &rc)
	if msg == nil {
		return fail(C.DC_EINVAL, "dc_engine_inputs_send: msg must not be NULL")
	}
	drainPosted() // after what the host posted before (posted.go)
	in, rc := inputsOf("dc_engine_inputs_send", h)
	if rc != C.DC_OK {
		return rc
	}
	if err := sendInput(in, goBytes(msg, msgLen)); err != nil {
		return fail(C.DC_EINVAL, "dc_engine_inputs_send: %v", err)
	}
	return C.DC_OK
}

// dc_engine_inputs_abort: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_inputs_abort
func dc_engine_inputs_abort(h C.uint64_t, id *C.char, idLen C.size_t) (rc C.int) {
	defer guard("dc_engine_inputs_abort", &rc)
	if id == nil && idLen > 0 {
		return fail(C.DC_EINVAL, "dc_engine_inputs_abort: id must not be NULL")
	}
	drainPosted()
	in, rc := inputsOf("dc_engine_inputs_abort", h)
	if rc != C.DC_OK {
		return rc
	}
	s := string(goBytes(id, idLen))
	if !utf8.ValidString(s) {
		// The engine's decoder would refuse it, and with it the engine's input.
		return fail(C.DC_EINVAL, "dc_engine_inputs_abort: id must be UTF-8")
	}
	in.abort(s)
	return C.DC_OK
}

// dc_engine_inputs_peers: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_inputs_peers
func dc_engine_inputs_peers(h C.uint64_t, n *C.int) (rc C.int) {
	defer guard("dc_engine_inputs_peers", &rc)
	if n == nil {
		return fail(C.DC_EINVAL, "dc_engine_inputs_peers: n must not be NULL")
	}
	in, rc := inputsOf("dc_engine_inputs_peers", h)
	if rc != C.DC_OK {
		return rc
	}
	*n = C.int(in.router.Peers())
	return C.DC_OK
}

// dc_engine_inputs_aborts: see dynamo_ctx_services.h, the reference.
//
//export dc_engine_inputs_aborts
func dc_engine_inputs_aborts(h C.uint64_t, n *C.int64_t) (rc C.int) {
	defer guard("dc_engine_inputs_aborts", &rc)
	if n == nil {
		return fail(C.DC_EINVAL, "dc_engine_inputs_aborts: n must not be NULL")
	}
	in, rc := inputsOf("dc_engine_inputs_aborts", h)
	if rc != C.DC_OK {
		return rc
	}
	*n = C.int64_t(in.aborts.Load())
	return C.DC_OK
}

// runEngineInput runs a posted input message (posted.mu held): the
// reader's handle (u64), then the message in dc_engine_inputs_send's form.
// A reader freed meanwhile, or one without the engine's inputs, drops it.
func runEngineInput(m []byte) error {
	if len(m) < 8 {
		return errMalformed
	}
	e, err := engineReaders.Get(binary.LittleEndian.Uint64(m))
	if err != nil {
		return nil
	}
	in := e.inputs.Load()
	if in == nil || in == closedInputs {
		return nil
	}
	return sendInput(in, m[8:])
}
