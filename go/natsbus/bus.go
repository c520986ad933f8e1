package natsbus

// The Bus once connected: reconnection hooks, the connection's session and
// settling state, its accessors, and Close.

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// OnReconnect registers f to run (on a client callback goroutine; it must
// not block for long) after each reconnection, once subscriptions are
// restored.
func (b *Bus) OnReconnect(f func()) {
	b.mu.Lock()
	b.onReconnect = append(b.onReconnect, f)
	b.mu.Unlock()
}

type sessionCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newSession() *sessionCtx {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessionCtx{ctx, cancel}
}

// Session is a context cancelled when the connection next goes down. A
// request/reply waiting under it ends at once when the server it was sent
// to dies (the message may have died with it) instead of running into its
// timeout; the caller sends it again once connected.
func (b *Bus) Session() context.Context { return b.session.Load().ctx }

// Settling reports whether the connection is down, or came back less than
// SettleWindow ago (see the package documentation).
func (b *Bus) Settling() bool {
	if b.down.Load() {
		return true
	}
	last := b.lastChange.Load()
	return last != 0 && time.Since(time.Unix(0, last)) < SettleWindow
}

// WaitConnected returns nil once the connection is up (at once if it is),
// or ctx's error; ErrClosed-like errors come from the client library once
// the Bus is closed.
func (b *Bus) WaitConnected(ctx context.Context) error {
	for !b.nc.IsConnected() {
		if b.nc.IsClosed() {
			return nats.ErrConnectionClosed
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// Conn returns the underlying connection. It stays valid (and reconnects by
// itself) until Close; callers must not close it themselves.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// URL returns the address the Bus connected to; for an ephemeral embedded
// server it carries the actual port, so other clients can be pointed at it.
func (b *Bus) URL() string { return b.url }

// Embedded reports whether this process currently hosts the server, either
// since Connect or after a takeover.
func (b *Bus) Embedded() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv != nil
}

// Close drains the connection (pending publishes are sent, handlers of
// messages already received finish), closes it, then shuts down the
// embedded server if this process hosts it and waits for that shutdown.
// Clients of other processes lose the server at that point; embeddable ones
// take over. Close is idempotent and safe to call concurrently.
func (b *Bus) Close() {
	b.closeOnce.Do(func() {
		// Stop the takeover loop first: closing the connection fires the
		// disconnect handler, which must not start a new server.
		close(b.stop)
		b.wg.Wait()
		if err := b.nc.Drain(); err != nil {
			b.nc.Close()
		}
		select {
		case <-b.closed:
		case <-time.After(drainTimeout + time.Second):
			// Drain is bounded by DrainTimeout; this is a safety net.
			b.nc.Close()
			<-b.closed
		}
		b.mu.Lock()
		srv := b.srv
		b.srv = nil
		b.mu.Unlock()
		if srv != nil {
			// Before the server goes: a process that takes the address
			// over writes the file again (takeoverLoop).
			if b.tokenFile != "" {
				removeToken(b.tokenFile, b.srvAuth.token)
			}
			shutdown(srv)
		}
	})
}
