package zmtp

// The ROUTER side of DEALER sockets: what writing to one process's DEALER
// takes (vLLM's engine core reads its requests so), on a Pull's listener,
// handshake and reader.

import (
	"net"
	"sync"
	"syscall"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// Router accepts DEALER peers on a listener and sends each the messages
// addressed to its identity (ZeroMQ's routing id, from its READY). Besides
// a Pull's guarantees (its peers' messages reach the handler, each after a
// first frame that is the peer's identity, as a ROUTER socket reads them):
//
//   - Send never waits: a message goes to the peer's socket at once where
//     nothing of that peer waits before it and the socket takes it, else
//     it is queued for the peer's writer, a goroutine that waits for the
//     socket. A peer's messages (and its PONGs) go out whole and in the
//     order sent. The queue is not bounded, as a ROUTER socket's with
//     ZeroMQ's high-water mark off (vLLM's); a peer that fails drops it.
//   - A message to an identity no peer has (not yet connected, or gone) is
//     dropped, as a ROUTER socket drops it: Send says whether it went to a
//     peer. A second peer of an identity already connected is turned away
//     (ErrIdentity), as a ROUTER socket does without handover, unless the
//     first one's connection failed (its writes did), though its reader
//     has not seen it yet: a DEALER that reconnects takes its place.
type Router struct {
	*Pull

	mu    sync.Mutex
	peers map[string]*peerOut
}

// ServeRouter accepts DEALER peers on ln until Close, each on a goroutine
// of its own that calls handle with its messages (after their identity).
// The Router owns ln from now on.
func ServeRouter(ln net.Listener, handle Handler, o Options) *Router {
	r := &Router{Pull: newPull(ln, handle, o, "ROUTER", "DEALER"), peers: map[string]*peerOut{}}
	r.router = r
	r.wg.Add(1)
	go r.accept()
	return r
}

// Send sends one message of frames to the peer of identity (see Router).
func (r *Router) Send(identity []byte, frames ...[]byte) bool {
	r.mu.Lock()
	o := r.peers[string(identity)]
	r.mu.Unlock()
	if o == nil {
		return false
	}
	_, err := o.Write(Encode(frames...))
	return err == nil
}

// join registers c's writer under identity (nil: the identity is taken
// by a peer whose connection has not failed; one whose writes failed is
// gone, though its reader may not have seen it yet). A write that fails
// closes c: its reader sees it, and the peer leaves.
func (r *Router) join(c net.Conn, raw syscall.RawConn, identity string) *peerOut {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.peers[identity]; ok && !old.Failed() {
		return nil
	}
	o := &peerOut{Queue: rawio.NewQueue(c, raw, func() { _ = c.Close() }), identity: identity}
	r.peers[identity] = o
	return o
}

// leave forgets o and stops its writer (the connection is closing).
func (r *Router) leave(o *peerOut) {
	r.mu.Lock()
	if r.peers[o.identity] == o {
		delete(r.peers, o.identity)
	}
	r.mu.Unlock()
	o.Close()
}

// peerOut is one peer's writing end (an io.Writer for pong too).
type peerOut struct {
	*rawio.Queue
	identity string
}
