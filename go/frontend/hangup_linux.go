//go:build linux

package frontend

import (
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// hangups is the epoll set of the connections serving requests (see
// hangup.go).
type hangups struct {
	// fdMu: the set's descriptor is used under a read lock and closed
	// under the lock, so no call reaches a number reused meanwhile.
	fdMu    sync.RWMutex
	epfd    int
	mu      sync.Mutex
	next    int32
	watched map[int32]func() // key (the event's Fd field) -> onGone
	running bool             // the watcher goroutine runs
	closed  bool
}

// newHangups is the frontend's watcher, or nil where epoll is refused.
func newHangups() *hangups {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		slog.Debug("hang-ups are seen by net/http alone: no epoll", "error", err)
		return nil
	}
	return &hangups{epfd: fd, watched: make(map[int32]func())}
}

// watch adds c to the set; see Frontend.watchHangup.
func (h *hangups) watch(c net.Conn, onGone func()) (stop func()) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return func() {}
	}
	key := h.next
	for {
		key++
		if _, used := h.watched[key]; !used {
			break
		}
	}
	h.next = key
	h.watched[key] = onGone
	start := !h.running
	h.running = true
	h.mu.Unlock()
	added := false
	// Control holds the descriptor: it cannot be closed (and its number
	// reused by another connection) during the call.
	_ = rc.Control(func(fd uintptr) {
		// One event at most (EPOLLONESHOT): a half-closed connection that
		// net/http still serves stays readable for hang-up until it closes.
		ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: key}
		h.fdMu.RLock()
		added = h.epfd >= 0 && syscall.EpollCtl(h.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) == nil
		h.fdMu.RUnlock()
	})
	if start {
		go h.run()
	}
	if !added {
		h.forget(key)
		return func() {}
	}
	return func() {
		if h.forget(key) {
			_ = rc.Control(func(fd uintptr) {
				h.fdMu.RLock()
				if h.epfd >= 0 {
					_ = syscall.EpollCtl(h.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
				}
				h.fdMu.RUnlock()
			})
		}
	}
}

// forget ends key's watch; false if it had ended (its onGone taken).
func (h *hangups) forget(key int32) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.watched[key]
	delete(h.watched, key)
	return ok
}

// run reads the set every hangupPoll while anything is watched.
func (h *hangups) run() {
	events := make([]syscall.EpollEvent, 128)
	idleSince := time.Time{}
	for {
		time.Sleep(hangupPoll)
		h.mu.Lock()
		switch {
		case h.closed:
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
		h.mu.Unlock()
		for {
			h.fdMu.RLock()
			n, err := -1, error(syscall.EBADF)
			if h.epfd >= 0 {
				n, err = syscall.EpollWait(h.epfd, events, 0)
			}
			h.fdMu.RUnlock()
			if err == syscall.EINTR {
				continue
			}
			for _, ev := range events[:max(n, 0)] {
				h.mu.Lock()
				onGone := h.watched[ev.Fd]
				delete(h.watched, ev.Fd)
				h.mu.Unlock()
				if onGone != nil {
					onGone()
				}
			}
			if n < len(events) {
				break
			}
		}
	}
}

// close releases the set (the frontend's Close); watches end with it.
func (h *hangups) close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	h.watched = map[int32]func(){}
	h.mu.Unlock()
	h.fdMu.Lock()
	if h.epfd >= 0 {
		_ = syscall.Close(h.epfd)
		h.epfd = -1
	}
	h.fdMu.Unlock()
}
