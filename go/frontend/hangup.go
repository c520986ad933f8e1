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
// bytes), read in two ways:
//
//   - by the writers: every flush of a response tells the set (touch), and
//     once hangupPoll has passed since it was last read, that writer reads
//     it, without waiting, and hands what it finds to a goroutine. So while
//     responses write, a hang-up is seen within about hangupPoll of the
//     next write, however busy the Ps are.
//   - by one watcher goroutine, which waits for the set itself in Go's
//     network poller (the set's descriptor is readable while a hang-up is
//     in it), which idle Ps check at once.
//
// No timer wakes a thread every hangupPoll for it (the watcher's only
// timer is its linger's deadline, hangupLinger). One did before: a 2 ms
// timer, armed while any request was in flight and later only while
// responses wrote, woke a thread (and the runtime's sysmon) in a process
// otherwise idle between the engine's steps, after each step's burst of
// tokens; on the real engine that was half the frontend's thread switches
// at 16 streams. (Where the set cannot wait in Go's poller, the watcher
// reads it every hangupPoll, on a timer.)
// A hang-up the watcher or a writer reads calls the request's
// onDisconnect, as net/http's cancel does (whichever comes first; the
// second does nothing). The goroutine runs only while connections are
// watched, and stops after hangupLinger without any. Where there is no
// epoll, or the connection has no descriptor, net/http alone tells.

import (
	"context"
	"net"
	"time"
)

// hangupPoll is how often the writers read the epoll set while responses
// write: about how late a hang-up is seen under load, paid with a system
// call that often.
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
// be closed by its peer; the returned function stops the watch: after it
// returns, onGone is not called, and a call that had started has returned.
func (f *Frontend) watchHangup(ctx context.Context, onGone func()) (stop func()) {
	c, _ := ctx.Value(connKey{}).(net.Conn)
	if c == nil || f.hangups == nil {
		return func() {}
	}
	return f.hangups.watch(c, onGone)
}
