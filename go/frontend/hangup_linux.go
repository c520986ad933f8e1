//go:build linux

package frontend

import (
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// hangups is the epoll set of the connections serving requests (see
// hangup.go). mu guards it all, the set's descriptor too: it is used and
// closed under mu, so no call reaches a number reused meanwhile.
type hangups struct {
	mu      sync.Mutex
	epfd    int // -1 once closed
	next    int32
	watched map[int32]func() // key (the event's Fd field) -> onGone
	running bool             // the watcher goroutine runs

	// The set's descriptor in Go's network poller (quiet waits): closed
	// by close, after epfd is -1, outside mu (see close).
	file *os.File
	rc   syscall.RawConn
	// busy: a response wrote since the watcher last looked (touch);
	// quiet: the watcher waits in the poller, and the first touch wakes
	// it (a read deadline in the past).
	busy, quiet atomic.Bool
	looks       atomic.Int64 // the watcher's reads of the set (the tests)
}

// newHangups is the frontend's watcher, or nil where epoll is refused.
func newHangups() *hangups {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		slog.Debug("hang-ups are seen by net/http alone: no epoll", "error", err)
		return nil
	}
	h := &hangups{epfd: fd, watched: make(map[int32]func())}
	// Non-blocking, os.NewFile puts it in Go's poller: readable while a
	// hang-up is in the set.
	if syscall.SetNonblock(fd, true) == nil {
		h.file = os.NewFile(uintptr(fd), "hangups")
		if h.rc, err = h.file.SyscallConn(); err != nil || h.file.SetReadDeadline(time.Time{}) != nil {
			h.rc = nil // not pollable: the watcher polls on its timer alone
		}
	}
	return h
}

// touch marks the watcher busy, and wakes it if it waits quiet.
func (h *hangups) touch() {
	if h.busy.Load() {
		return
	}
	h.busy.Store(true)
	if h.quiet.Load() {
		_ = h.file.SetReadDeadline(time.Unix(1, 0))
	}
}

// wait is the watcher's pause before it reads the set: hangupPoll when
// busy (see touch), else until the set is readable, a touch, or
// hangupLinger (to see whether it may end).
func (h *hangups) wait() {
	if h.busy.Swap(false) || h.rc == nil {
		time.Sleep(hangupPoll)
		return
	}
	// The deadline first: a touch that sees quiet moves it to the past
	// after this, so its wake-up is never overwritten.
	_ = h.file.SetReadDeadline(time.Now().Add(hangupLinger))
	h.quiet.Store(true)
	defer h.quiet.Store(false)
	if h.busy.Load() {
		return // a touch came meanwhile
	}
	first := true
	_ = h.rc.Read(func(uintptr) bool {
		// The first call is before any wait: wait once for readiness.
		if first {
			first = false
			return false
		}
		return true
	})
}

// watch adds c to the set; see Frontend.watchHangup.
func (h *hangups) watch(c net.Conn, onGone func()) (stop func()) {
	none := func() {}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return none
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return none
	}
	var key int32
	added, start := false, false
	// Control holds the descriptor: it cannot be closed (and its number
	// reused by another connection) during the call.
	_ = rc.Control(func(fd uintptr) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.epfd < 0 {
			return
		}
		for key = h.next + 1; h.watched[key] != nil; key++ {
		}
		h.next = key
		// One event at most (EPOLLONESHOT): a half-closed connection that
		// net/http still serves stays readable for hang-up until it closes.
		ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: key}
		if rawio.EpollCtl(h.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) != 0 {
			return
		}
		h.watched[key] = onGone
		added, start, h.running = true, !h.running, true
	})
	if start {
		go h.run()
	}
	if !added {
		return none
	}
	return func() {
		_ = rc.Control(func(fd uintptr) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.watched[key] != nil { // else its onGone was taken, or the set closed
				delete(h.watched, key)
				_ = rawio.EpollCtl(h.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
			}
		})
	}
}

// run reads the set after each wait while anything is watched.
func (h *hangups) run() {
	events := make([]syscall.EpollEvent, 128)
	var idleSince time.Time
	var gone []func()
	for {
		h.wait()
		h.looks.Add(1)
		h.mu.Lock()
		switch {
		case h.epfd < 0:
			h.running = false
			h.mu.Unlock()
			return
		case len(h.watched) > 0:
			idleSince = time.Time{}
		case idleSince.IsZero():
			idleSince = time.Now()
		case time.Since(idleSince) > hangupLinger:
			h.running = false
			h.mu.Unlock()
			return
		}
		for {
			n, err := rawio.EpollWait(h.epfd, events)
			if err == syscall.EINTR {
				continue
			}
			for _, ev := range events[:max(n, 0)] {
				if onGone := h.watched[ev.Fd]; onGone != nil {
					delete(h.watched, ev.Fd)
					gone = append(gone, onGone)
				}
			}
			if n < len(events) {
				break
			}
		}
		h.mu.Unlock()
		for i, onGone := range gone {
			onGone()
			gone[i] = nil
		}
		gone = gone[:0]
	}
}

// close releases the set (the frontend's Close); watches end with it.
func (h *hangups) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	fd := h.epfd
	h.epfd = -1
	h.watched = map[int32]func(){}
	h.mu.Unlock()
	switch {
	case fd < 0:
	case h.file != nil:
		// Outside mu: the close waits for a watcher in the poller, which
		// returns, then takes mu to see the set closed.
		_ = h.file.Close()
	default:
		_ = syscall.Close(fd)
	}
}
