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
//     (ErrIdentity), as a ROUTER socket does without handover.
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

// join registers c's writer under identity, and starts it (nil: the
// identity is taken).
func (r *Router) join(c net.Conn, raw syscall.RawConn, identity string) *peerOut {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.peers[identity]; ok {
		return nil
	}
	o := &peerOut{c: c, raw: raw, identity: identity, kick: make(chan struct{}, 1), done: make(chan struct{})}
	r.peers[identity] = o
	go o.write()
	return o
}

// leave forgets o and stops its writer (the connection is closing).
func (r *Router) leave(o *peerOut) {
	r.mu.Lock()
	if r.peers[o.identity] == o {
		delete(r.peers, o.identity)
	}
	r.mu.Unlock()
	o.mu.Lock()
	o.broken, o.out = true, nil
	close(o.kick) // under mu: Write pokes under it, and only while not broken
	o.mu.Unlock()
	_ = o.c.Close() // a writer waiting for room returns
	<-o.done
}

// peerOut is one peer's writing end: bytes written at once while nothing
// is queued and the socket takes them, else queued for write.
type peerOut struct {
	c        net.Conn
	raw      syscall.RawConn // nil: every write is queued
	identity string

	mu      sync.Mutex
	out     []byte
	writing bool // the writer holds bytes taken from out
	broken  bool // the connection failed or left: nothing more goes
	kick    chan struct{}
	done    chan struct{}
}

// Write queues b whole (io.Writer for pong): net.ErrClosed once the
// connection failed.
func (o *peerOut) Write(b []byte) (int, error) {
	o.mu.Lock()
	if o.broken {
		o.mu.Unlock()
		return 0, net.ErrClosed
	}
	if len(o.out) > 0 || o.writing || o.raw == nil {
		o.out = append(o.out, b...)
		o.poke()
		o.mu.Unlock()
		return len(b), nil
	}
	n := 0
	var errno syscall.Errno
	err := o.raw.Write(func(fd uintptr) bool {
		n, errno = rawio.TryWriteAll(fd, b) // raw: no runtime bookkeeping (rawio's doc)
		return true
	})
	if err != nil || (errno != 0 && errno != syscall.EAGAIN) {
		o.broken = true
		o.mu.Unlock()
		_ = o.c.Close() // the reader sees it and the peer leaves
		return 0, net.ErrClosed
	}
	if n < len(b) {
		o.out = append(o.out, b[n:]...)
		o.poke()
	}
	o.mu.Unlock()
	return len(b), nil
}

// poke tells the writer that out has bytes (mu held, not broken: leave
// closes kick under mu once broken).
func (o *peerOut) poke() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// keptBuffer is the largest queue buffer a writer keeps once drained.
const keptBuffer = 1 << 20

// write writes what Write queued, waiting for the socket as it must,
// until the connection fails or the peer leaves.
func (o *peerOut) write() {
	defer close(o.done)
	var buf []byte
	for range o.kick {
		for {
			o.mu.Lock()
			if len(o.out) == 0 || o.broken {
				o.writing = false
				o.mu.Unlock()
				if cap(buf) > keptBuffer {
					buf = nil
				}
				break
			}
			buf, o.out = o.out, buf[:0]
			if cap(o.out) > keptBuffer {
				o.out = nil
			}
			o.writing = true
			o.mu.Unlock()
			if _, err := o.c.Write(buf); err != nil {
				o.mu.Lock()
				o.broken, o.out, o.writing = true, nil, false
				o.mu.Unlock()
				_ = o.c.Close()
				break
			}
		}
	}
}
