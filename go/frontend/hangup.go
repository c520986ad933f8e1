package frontend

// Hang-ups seen off Go's scheduler. net/http learns that a client went
// away when its connection's read returns, which Go's network poller
// reports; the poller runs when a P runs out of goroutines, and otherwise
// only every 10 ms (sysmon). While a step's items keep the Ps busy (a
// thousand streams' tokens at once), a client's FIN waits for that: at
// 1,000 streams it made most of the disconnect -> abort p99.
//
// So each connection serving a request is also in an epoll set of the
// frontend's own (EPOLLRDHUP: the peer's FIN or reset; nothing for its
// bytes), read by one watcher goroutine in two ways:
//
//   - busy (a response flushed since the watcher's last look: touch): a
//     timer wakes it every hangupPoll and it reads the set without
//     blocking. Timers are run at every scheduling decision, so it runs
//     within about hangupPoll of its time however busy the Ps are.
//   - quiet: it waits for the set itself in Go's network poller (the set's
//     descriptor is readable while a hang-up is in it), which idle Ps
//     check at once; the next response's write wakes it back to busy.
//
// A timer every hangupPoll on an otherwise idle process wakes a thread
// (and the runtime's sysmon) each time: on the real engine, whose steps
// leave the frontend idle for 10-20 ms between bursts of tokens, that was
// a quarter of the frontend's CPU per token at 16 streams. A hang-up the
// watcher reads calls the request's onDisconnect, as net/http's cancel
// does (whichever comes first; the second does nothing). The goroutine
// runs only while connections are watched, and stops after hangupLinger
// without any. Where there is no epoll, or the connection has no
// descriptor, net/http alone tells.

import (
	"context"
	"net"
	"time"
)

// hangupPoll is how often the watcher reads its epoll set while
// connections are watched: a bound on how late it sees a hang-up, paid
// with a timer wake-up that often.
const hangupPoll = 2 * time.Millisecond

// hangupLinger is how long the watcher goroutine stays without watched
// connections before it ends (a new watch starts it again).
const hangupLinger = 100 * time.Millisecond

// connKey is the request context's key of its connection (connContext).
type connKey struct{}

// connContext is the listener's ConnContext: a request's context holds its
// connection, for watchHangup.
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// watchHangup calls onGone once the connection of r's context is seen to
// be closed by its peer; the returned function stops the watch (after it,
// onGone is not called, unless it had started).
func (f *Frontend) watchHangup(ctx context.Context, onGone func()) (stop func()) {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if c == nil || f.hangups == nil {
		return func() {}
	}
	return f.hangups.watch(c, onGone)
}
