// Package zmtp is the listening end of two ZeroMQ socket pairs over ZMTP 3
// (the wire protocol of libzmq 4, rfc.zeromq.org spec 23 and 37) with the
// NULL security mechanism, over any stream listener (a Unix socket for
// ZeroMQ's ipc:// addresses, TCP for tcp://): the PULL side of PUSH sockets
// (Pull: vLLM's engine core sends its outputs so), and the ROUTER side of
// DEALER sockets (Router, router.go: its engine core reads its inputs so).
// No other socket type, no security mechanism but NULL.
//
// A Pull guarantees:
//
//   - Order: each connection's messages reach the handler in the order the
//     peer sent them, on that connection's one goroutine, so the handler
//     may act on a message before the next is read (no hand-over).
//   - Whole messages: a message is delivered once all its frames arrived;
//     a connection that ends mid-message delivers nothing of it.
//   - Bounded memory: a frame is read as its bytes arrive, never allocated
//     at the size its header claims beyond a MiB; each frame counts
//     FrameOverhead bytes more than its body toward MaxMessage (so a
//     stream of empty frames is bounded too); at most MaxPeers connections
//     are held (one more is closed at once), each with HandshakeTimeout to
//     greet. A message over MaxMessage, a peer of another socket type (a
//     Pull's are PUSH) or protocol, and a malformed frame end that connection
//     (logged through Options.Log), never the Pull; an error of the
//     listener that may pass (too many open files) is retried.
//   - Closing: Close stops accepting, closes every connection and returns
//     after each connection's goroutine did; no handler call runs after it.
//     Close is idempotent.
package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// Handler is called with each message's frames, on its connection's
// goroutine. The frames are the handler's to keep. An error ends that
// connection.
type Handler func(frames [][]byte) error

// Options tune a Pull. The zero value is usable.
type Options struct {
	// MaxMessage is the most bytes a message's frames may hold together,
	// FrameOverhead each included (0: DefaultMaxMessage).
	MaxMessage int64
	// MaxPeers is the most connections held at once (0: DefaultMaxPeers).
	MaxPeers int
	// HandshakeTimeout is how long a peer has to greet (0:
	// DefaultHandshakeTimeout), and how long a PONG may wait to be written.
	HandshakeTimeout time.Duration
	// Log, when set, is told why a connection ended, unless by Close or
	// the peer's orderly close.
	Log func(format string, args ...any)
}

// The defaults of Options, and what a frame costs beyond its body.
const (
	DefaultMaxMessage       = 1 << 30
	DefaultMaxPeers         = 16
	DefaultHandshakeTimeout = 10 * time.Second
	FrameOverhead           = 64
)

// Errors that end a connection.
var (
	ErrGreeting   = errors.New("zmtp: not a ZMTP 3 peer with the NULL mechanism")
	ErrSocketType = errors.New("zmtp: the peer's socket type does not pair with this side's")
	ErrFrame      = errors.New("zmtp: malformed frame")
	ErrTooLarge   = errors.New("zmtp: message over the size limit")
	ErrIdentity   = errors.New("zmtp: a peer of that identity is connected already")
)

// The frame header's flag bits.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// greeting is this side's 64 bytes: the signature, version 3.1, the NULL
// mechanism, as-server 0 and the filler.
var greeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	return g
}()

// Pull accepts PUSH peers on a listener and hands their messages to a
// Handler. Make one with Serve.
type Pull struct {
	ln        net.Listener
	handle    Handler
	max       int64
	maxPeers  int
	handshake time.Duration
	log       func(string, ...any)
	peers     atomic.Int64 // connections past their handshake
	self      string       // this side's socket type: PULL, or ROUTER
	peerType  string       // the peers' it accepts: PUSH, or DEALER
	router    *Router      // a Router's: where its peers' writers are kept

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Serve accepts PUSH peers on ln until Close, each on a goroutine of its
// own that calls handle with its messages. The Pull owns ln from now on.
func Serve(ln net.Listener, handle Handler, o Options) *Pull {
	p := newPull(ln, handle, o, "PULL", "PUSH")
	p.wg.Add(1)
	go p.accept()
	return p
}

func newPull(ln net.Listener, handle Handler, o Options, self, peerType string) *Pull {
	p := &Pull{ln: ln, handle: handle, max: o.MaxMessage, maxPeers: o.MaxPeers, handshake: o.HandshakeTimeout, log: o.Log,
		conns: map[net.Conn]struct{}{}, self: self, peerType: peerType}
	if p.max <= 0 {
		p.max = DefaultMaxMessage
	}
	if p.maxPeers <= 0 {
		p.maxPeers = DefaultMaxPeers
	}
	if p.handshake <= 0 {
		p.handshake = DefaultHandshakeTimeout
	}
	return p
}

// Addr is the listener's address.
func (p *Pull) Addr() net.Addr { return p.ln.Addr() }

// Peers is how many connections are past their handshake now.
func (p *Pull) Peers() int { return int(p.peers.Load()) }

// Close stops the Pull (see the package's guarantees).
func (p *Pull) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Pull) accept() {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			// What may pass (too many open files, a connection reset
			// before it was taken): wait and go on, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if p.log != nil {
				p.log("zmtp: accept: %v; retrying in %v", err, backoff)
			}
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		p.mu.Lock()
		if p.closed || len(p.conns) >= p.maxPeers {
			full := !p.closed
			p.mu.Unlock()
			_ = c.Close()
			if full && p.log != nil {
				p.log("zmtp: a connection beyond the %d held closed", p.maxPeers)
			}
			continue
		}
		// A Router writes to its peers without waiting (router.go): it
		// needs the socket's own descriptor.
		var raw syscall.RawConn
		if sc, ok := c.(syscall.Conn); ok && p.router != nil {
			raw, _ = sc.SyscallConn()
		}
		// Raw reads and writes (go/internal/rawio): a peer that sends a
		// message a step wakes no runtime bookkeeping with each.
		c = rawio.Wrap(c)
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c, raw)
	}
}

func (p *Pull) serve(c net.Conn, raw syscall.RawConn) {
	defer p.wg.Done()
	err := p.read(c, raw)
	p.mu.Lock()
	closing := p.closed
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
	if err != nil && !closing && !errors.Is(err, io.EOF) && p.log != nil {
		p.log("zmtp: connection from %v ended: %v", c.RemoteAddr(), err)
	}
}

// read speaks to one peer until it leaves or fails.
func (p *Pull) read(c net.Conn, raw syscall.RawConn) error {
	if p.handshake > 0 {
		_ = c.SetDeadline(time.Now().Add(p.handshake))
	}
	if _, err := c.Write(append(append([]byte(nil), greeting...), ready(p.self)...)); err != nil {
		return err
	}
	r := bufio.NewReaderSize(c, 64<<10)
	var peer [64]byte
	if _, err := io.ReadFull(r, peer[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return ErrGreeting
		}
		return err
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 || string(bytes.TrimRight(peer[12:32], "\x00")) != "NULL" {
		return ErrGreeting
	}
	// The peer's READY: its socket type must be the one this side pairs with.
	flags, body, err := p.frame(r, 1<<16)
	if err != nil {
		return unexpected(err)
	}
	if flags&flagCommand == 0 {
		return fmt.Errorf("%w: a message before READY", ErrFrame)
	}
	props, err := readyProps(body)
	if err != nil {
		return err
	}
	if !strings.EqualFold(props["socket-type"], p.peerType) {
		return fmt.Errorf("%w: it is %q", ErrSocketType, props["socket-type"])
	}
	_ = c.SetDeadline(time.Time{})
	// A Router's peer: its identity (ZeroMQ's routing id) names it, and its
	// messages reach the handler after it, as a ROUTER socket reads them.
	var out *peerOut
	var identity []byte
	if p.router != nil {
		identity = []byte(props["identity"])
		if out = p.router.join(c, raw, props["identity"]); out == nil {
			return fmt.Errorf("%w: %q", ErrIdentity, props["identity"])
		}
	}
	p.peers.Add(1)
	defer func() {
		if out != nil {
			// Before the count drops: a peer no longer counted holds its
			// identity no more (the same one may connect again at once).
			p.router.leave(out)
		}
		p.peers.Add(-1)
	}()
	var msg [][]byte
	var size int64
	for {
		flags, body, err := p.frame(r, p.max-size)
		if err != nil {
			if errors.Is(err, io.EOF) && msg != nil {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if flags&flagCommand != 0 {
			if msg != nil {
				return fmt.Errorf("%w: a command inside a message", ErrFrame)
			}
			if out != nil {
				// Queued after what the Router sends the peer: one writer.
				if err := pong(out, body); err != nil {
					return err
				}
				continue
			}
			// A peer that pings and never reads is dropped once the PONG
			// waits HandshakeTimeout for room, not held forever.
			_ = c.SetWriteDeadline(time.Now().Add(p.handshake))
			if err := pong(c, body); err != nil {
				return err
			}
			_ = c.SetWriteDeadline(time.Time{})
			continue
		}
		msg = append(msg, body)
		size += int64(len(body)) + FrameOverhead
		if size > p.max {
			return fmt.Errorf("%w: %d frames", ErrTooLarge, len(msg))
		}
		if flags&flagMore != 0 {
			continue
		}
		if identity != nil {
			msg = append([][]byte{bytes.Clone(identity)}, msg...) // the handler's to keep, as every frame
		}
		if err := p.handle(msg); err != nil {
			return err
		}
		msg, size = nil, 0
	}
}

// frame reads one frame of at most limit bytes.
func (p *Pull) frame(r *bufio.Reader, limit int64) (byte, []byte, error) {
	flags, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, nil, fmt.Errorf("%w: flags %#x", ErrFrame, flags)
	}
	if flags&flagCommand != 0 && flags&flagMore != 0 {
		return 0, nil, fmt.Errorf("%w: a command with MORE", ErrFrame)
	}
	var n uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, unexpected(err)
		}
		n = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, unexpected(err)
		}
		n = uint64(b)
	}
	if n > uint64(max(limit, 0)) {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes", ErrTooLarge, n)
	}
	if n <= 1<<20 {
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, nil, unexpected(err)
		}
		return flags, body, nil
	}
	// Larger: read as the bytes arrive (a claimed size is not an allocation).
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		return 0, nil, unexpected(err)
	}
	return flags, buf.Bytes(), nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ready is a READY command announcing socketType.
func ready(socketType string) []byte {
	body := []byte("\x05READY")
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType)))
	body = append(body, socketType...)
	return commandFrame(body)
}

func commandFrame(body []byte) []byte {
	if len(body) < 256 {
		return append([]byte{flagCommand, byte(len(body))}, body...)
	}
	f := []byte{flagCommand | flagLong}
	f = binary.BigEndian.AppendUint64(f, uint64(len(body)))
	return append(f, body...)
}

// readyProps parses a READY command's properties, names lower-cased.
func readyProps(body []byte) (map[string]string, error) {
	name, rest, ok := commandName(body)
	if !ok || name != "READY" {
		return nil, fmt.Errorf("%w: %q, not READY", ErrFrame, name)
	}
	props := map[string]string{}
	for len(rest) > 0 {
		n := int(rest[0])
		if len(rest) < 1+n+4 {
			return nil, fmt.Errorf("%w: a READY property cut short", ErrFrame)
		}
		key := strings.ToLower(string(rest[1 : 1+n]))
		vn := binary.BigEndian.Uint32(rest[1+n:])
		rest = rest[1+n+4:]
		if uint64(vn) > uint64(len(rest)) {
			return nil, fmt.Errorf("%w: a READY property cut short", ErrFrame)
		}
		props[key] = string(rest[:vn])
		rest = rest[vn:]
	}
	return props, nil
}

func commandName(body []byte) (string, []byte, bool) {
	if len(body) < 1 || len(body) < 1+int(body[0]) {
		return "", nil, false
	}
	return string(body[1 : 1+body[0]]), body[1+body[0]:], true
}

// pong answers a PING (ZMTP 3.1's heartbeat) with its context; any other
// command after the handshake is ignored, as the spec allows.
func pong(c io.Writer, body []byte) error {
	name, rest, ok := commandName(body)
	if !ok {
		return fmt.Errorf("%w: a command without a name", ErrFrame)
	}
	if name != "PING" {
		return nil
	}
	if len(rest) < 2 {
		return fmt.Errorf("%w: a PING without its TTL", ErrFrame)
	}
	ctx := rest[2:]
	if len(ctx) > 16 {
		ctx = ctx[:16]
	}
	_, err := c.Write(commandFrame(append([]byte("\x04PONG"), ctx...)))
	return err
}

// Push is the sending end, for tests and tools: a PUSH socket's side of one
// connection, NULL mechanism.
type Push struct {
	c net.Conn
	r *bufio.Reader
}

// NewPush greets the PULL side on c and returns the Push that sends on it.
func NewPush(c net.Conn) (*Push, error) {
	if _, err := c.Write(append(append([]byte(nil), greeting...), ready("PUSH")...)); err != nil {
		return nil, err
	}
	p := &Push{c: c, r: bufio.NewReader(c)}
	var peer [64]byte
	if _, err := io.ReadFull(p.r, peer[:]); err != nil {
		return nil, err
	}
	if peer[0] != 0xff || peer[9] != 0x7f || peer[10] < 3 {
		return nil, ErrGreeting
	}
	var pull Pull
	flags, body, err := pull.frame(p.r, 1<<16)
	if err != nil {
		return nil, err
	}
	props, err := readyProps(body)
	if err != nil || flags&flagCommand == 0 || !strings.EqualFold(props["socket-type"], "PULL") {
		return nil, fmt.Errorf("%w: a peer that is not PULL", ErrSocketType)
	}
	return p, nil
}

// Send sends one message of frames.
func (p *Push) Send(frames ...[]byte) error {
	_, err := p.c.Write(Encode(frames...))
	return err
}

// Close closes the connection.
func (p *Push) Close() error { return p.c.Close() }

// Encode is the wire form of one message of frames.
func Encode(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags |= flagMore
		}
		if len(f) < 256 {
			b = append(b, flags, byte(len(f)))
		} else {
			b = append(b, flags|flagLong)
			b = binary.BigEndian.AppendUint64(b, uint64(len(f)))
		}
		b = append(b, f...)
	}
	return b
}
