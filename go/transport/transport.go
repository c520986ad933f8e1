// Package transport is the response-stream transport of the dynamo-ctx request
// plane: direct TCP from the worker that runs a request to the caller that
// awaits its items, carrying frames (package frame) both ways.
//
// The caller listens (Listen), registers the stream it is about to request
// (Server.Expect, before sending the request, so that the worker's stream
// can never arrive first) and reads items with Incoming.Recv. The worker
// connects back with the stream's token and sends items with Outgoing.Send:
// on its session to that caller (Dialer.Dial: every stream to one caller
// shares one long-lived connection, see session.go), or on a connection of
// the stream's own (Dial). Control flows back the same way: Stop, Kill and
// Credit. Everything below holds for both; "the connection" of a stream on a
// session is its share of the session.
//
// A stream guarantees:
//
//   - Order: items are received in the order they were sent, each exactly
//     once, and no item sent after Finish, Fail or Close is ever delivered.
//   - Ending: Recv returns io.EOF only after the worker's Finish (a Final
//     frame), *HandlerError only after its Fail (an Error frame), and only
//     once every item sent before them has been returned. Any other end of
//     the connection before one of those frames (worker crashed, connection
//     dropped, Outgoing.Close, a protocol violation) makes Recv return an
//     error matching ErrIncomplete with errors.Is; a worker that never
//     connects within the connect timeout yields ErrNoConnection, which
//     matches ErrIncomplete too.
//   - Stop: Incoming.Stop sends one Stop frame, at most once however often it
//     is called. The worker's Stopped channel closes; the stream stays open,
//     items keep flowing and the stream ends as the worker ends it.
//   - Kill: Incoming.Kill sends one Kill frame and ends the stream for the
//     caller at once: buffered items are dropped and Recv returns ErrKilled.
//     The worker's Killed channel closes (Lost instead, if the connection
//     failed before the Kill got through), its Send fails with ErrKilled
//     immediately, and the connection is released. A Kill after the end of
//     the stream was received changes nothing.
//   - Early control: Stop and Kill called before the worker connected are
//     sent right after its Hello, before any item can be sent (a Kill keeps
//     the token registered until then, or until the connect timeout).
//   - Loss: a worker's Lost channel closes when the caller's side of the
//     connection ends without a Kill: the caller's process died, its
//     Server was closed, or the network failed (detected by the peer's FIN or
//     RST, or by TCP keepalive). After Kill or loss, Send fails immediately.
//   - Flow control: the caller grants the worker a window of W items (default
//     256) right after Hello, and grants more only as Recv consumes items
//     (W/2 at a time), so at most W items are ever buffered by the caller and
//     a Send blocks while the worker's credit is exhausted: a slow consumer
//     slows its producer and memory stays bounded. A worker that sends
//     beyond its credit is a protocol violation that ends the stream.
//   - Resources: each stream has one reader goroutine per side and no
//     other goroutine (a Server adds one accept goroutine, a connect timeout
//     a timer); on a session, a reader and a writer per side serve all its
//     streams, and a caller's stream has no goroutine of its own (the
//     session's reader hands it its frames). Every goroutine and socket of a stream is released when the
//     stream ends normally, is killed, loses its peer, or its Server is
//     closed (a session's, when it fails, its Server or Dialer closes, or
//     it stays without streams for the Dialer's idle time); a graceful end (Final, Error, Kill) half-closes first and
//     lingers at most the linger timeout for the peer, so that no frame
//     already written is destroyed by a TCP reset.
//   - Liveness: each side sends heartbeats while it has nothing else to
//     send and declares its peer gone after the idle timeout of silence (see
//     liveness.go): a stopped, partitioned or wedged worker ends the caller's
//     stream with ErrPeerSilent (an ErrIncomplete), a silent caller is Lost
//     to the worker. A quiet but live peer (long prefill, no credit) is never
//     mistaken for a dead one.
//   - Latency: TCP_NODELAY is set and every Send, SendBatch, Stop, Kill and
//     credit grant is flushed before it returns, so no frame waits for a later
//     one; SendBatch puts many items in one write for throughput.
package transport

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// ErrIncomplete is what Recv returns when the worker's connection ended
// before the worker's final marker. Errors that add detail (ErrNoConnection,
// protocol violations) wrap it.
var ErrIncomplete = errors.New("Stream ended before generation completed")

// ErrNoConnection is returned by Recv when no worker connected with the
// stream's token within the connect timeout. It wraps ErrIncomplete.
var ErrNoConnection = fmt.Errorf("%w: no worker connected", ErrIncomplete)

// ErrKilled is returned by Recv after Incoming.Kill, and by Send, SendBatch,
// Finish and Fail after the caller killed the stream.
var ErrKilled = errors.New("stream: killed")

// ErrLost is returned by the worker's Send, SendBatch, Finish and Fail once the
// caller's connection is gone.
var ErrLost = errors.New("stream: caller connection lost")

// ErrClosed is returned by Recv after Incoming.Close, and by the worker's
// methods after Finish, Fail or Close.
var ErrClosed = errors.New("stream: closed")

// ErrServerClosed is returned by Recv when the Server was closed before the
// stream ended. It does not match ErrIncomplete: the caller is going away,
// there is nothing to retry.
var ErrServerClosed = errors.New("stream: server closed")

// ErrDuplicateToken is returned by Recv when Expect was called with a token
// already registered on the Server.
var ErrDuplicateToken = errors.New("stream: token already expected")

// ErrStoppedByHandler is returned by Recv when the worker's handler stopped
// its own request and returned (Outgoing.Incomplete). It matches
// ErrIncomplete, with which it shares its text, but unlike a broken stream it
// was deliberate: migration must not retry it.
var ErrStoppedByHandler = &stoppedByHandler{}

type stoppedByHandler struct{}

func (*stoppedByHandler) Error() string        { return ErrIncomplete.Error() }
func (*stoppedByHandler) Is(target error) bool { return target == ErrIncomplete }

// HandlerError is returned by Recv when the worker's handler failed
// (Outgoing.Fail). Its Error method returns the worker's message unchanged,
// so the caller can surface it verbatim.
type HandlerError struct {
	Message string
}

func (e *HandlerError) Error() string { return e.Message }

// Defaults of the options.
const (
	DefaultConnectTimeout = 3 * time.Second
	DefaultWindow         = 256
	DefaultLinger         = 5 * time.Second
)

// An Option configures a Server (Listen, and per stream Expect) or an
// Outgoing stream (Dial). Each option says which side reads it; the other
// side ignores it.
type Option func(*config)

type config struct {
	connectTimeout time.Duration
	window         int
	maxPayload     int
	linger         time.Duration
	idleTimeout    time.Duration
	heartbeatGate  func() bool   // a worker's heartbeats are written only while it returns true (nil: always)
	sessionIdle    time.Duration // a caller closes a session left without streams this long
}

func newConfig(base *config, opts []Option) config {
	c := config{
		connectTimeout: DefaultConnectTimeout,
		window:         DefaultWindow,
		linger:         DefaultLinger,
		idleTimeout:    DefaultIdleTimeout,
		sessionIdle:    2 * DefaultSessionIdle,
	}
	if base != nil {
		c = *base
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithConnectTimeout (caller side) bounds how long an expected stream waits
// for its worker, and how long an accepted connection may take to send its
// Hello. Default 3 s: a worker dials as soon as it acknowledged the request,
// so a longer wait only delays noticing a worker that stalled in between.
// On the worker's side (Dial) it bounds the redials of a connection the
// caller dropped before reading its Hello.
func WithConnectTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.connectTimeout = d
		}
	}
}

// WithWindow (caller side) sets the flow-control window: the most items the
// worker may have sent and the consumer not yet received. Default 256,
// clamped to [1, 1<<30].
func WithWindow(n int) Option {
	return func(c *config) { c.window = min(max(n, 1), 1<<30) }
}

// WithMaxPayload (caller side) sets the largest item accepted; a larger one
// is a protocol violation. Default frame.DefaultMaxPayload (16 MiB).
func WithMaxPayload(n int) Option {
	return func(c *config) { c.maxPayload = n }
}

// WithLinger (both sides) bounds how long a gracefully ended connection
// (Final, Error, Kill, Outgoing.Close) waits for the peer to close its side
// before it is closed anyway. Default 5 s.
func WithLinger(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.linger = d
		}
	}
}

// NewToken returns a fresh random stream token (32 hex digits).
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24)
	return hex.EncodeToString(b[:])
}
