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
	watched map[int32]*watchEntry // key (the event's Fd field) -> its watch
	running bool                  // the watcher goroutine runs
	linger  time.Duration         // hangupLinger (the tests set their own)

	// The set's descriptor in Go's network poller (the watcher's waits):
	// closed by close, after epfd is -1, outside mu (see close).
	file *os.File
	rc   syscall.RawConn
	// When the set was last read, in nanoseconds since epoch: a writer's
	// touch reads it once hangupPoll has passed since.
	epoch    time.Time
	lastLook atomic.Int64
	looks    atomic.Int64 // reads of the set (the tests)
}

// newHangups is the frontend's watcher, or nil where epoll is refused.
func newHangups() *hangups {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		slog.Debug("hang-ups are seen by net/http alone: no epoll", "error", err)
		return nil
	}
	h := &hangups{epfd: fd, watched: make(map[int32]*watchEntry), epoch: time.Now(), linger: hangupLinger}
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

// watchEntry is one watched connection's onGone. once runs it at most
// once, and its stop runs once too: so stop waits for an onGone that
// started, and no onGone starts after stop.
type watchEntry struct {
	onGone func()
	once   sync.Once
}

// touch is told of every flush of a response: once hangupPoll has passed
// since the set was last read, the writer reads it (one system call that
// does not wait), and its hang-ups are handed to a goroutine of their own.
// So while responses write, hang-ups are seen within about hangupPoll of a
// write however busy the Ps are, and no timer wakes a thread for it.
func (h *hangups) touch() {
	now := int64(time.Since(h.epoch))
	last := h.lastLook.Load()
	if now-last < int64(hangupPoll) || !h.lastLook.CompareAndSwap(last, now) {
		return
	}
	if !h.mu.TryLock() {
		// The watcher reads it, or a watch changes it: the next touch
		// reads it, unless another's read is due meanwhile.
		h.lastLook.CompareAndSwap(now, last)
		return
	}
	gone := h.lookLocked()
	h.mu.Unlock()
	if len(gone) > 0 {
		go callAll(gone) // not on this writer's goroutine: another request's work
	}
}

// wait is the watcher's pause before it reads the set: until the set is
// readable (a hang-up is in it), or hangupLinger (to see whether it may
// end). Go's poller, which idle Ps check at once, wakes it.
func (h *hangups) wait() {
	if h.rc == nil {
		time.Sleep(hangupPoll) // not in the poller: a timer, as the only way
		return
	}
	_ = h.file.SetReadDeadline(time.Now().Add(h.linger))
	first := true
	_ = h.rc.Read(func(fd uintptr) bool {
		// The first call is before any wait, and Read has just cleared
		// the readiness the poller had seen: a hang-up that came since the
		// set was last read is looked for here, or its wake-up is lost
		// (until the linger's deadline or a writer's read).
		if first {
			first = false
			return rawio.Readable(fd)
		}
		return true
	})
}

// lookLocked reads the set without waiting (mu held; the set open) and
// returns the watch of each hang-up in it, taken out of the set.
func (h *hangups) lookLocked() (gone []*watchEntry) {
	if h.epfd < 0 {
		return nil
	}
	h.looks.Add(1)
	var events [128]syscall.EpollEvent
	for {
		n, err := rawio.EpollWait(h.epfd, events[:])
		if err == syscall.EINTR {
			continue
		}
		for _, ev := range events[:max(n, 0)] {
			if e := h.watched[ev.Fd]; e != nil {
				delete(h.watched, ev.Fd)
				gone = append(gone, e)
			}
		}
		if n < len(events) {
			return gone
		}
	}
}

// callAll calls the onGone of each of es (unless its watch stopped first).
func callAll(es []*watchEntry) {
	for _, e := range es {
		e.once.Do(e.onGone)
	}
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
	e := &watchEntry{onGone: onGone}
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
		h.watched[key] = e
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
			if h.watched[key] == e { // else its onGone was taken, or the set closed
				delete(h.watched, key)
				_ = rawio.EpollCtl(h.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil)
			}
		})
		e.once.Do(func() {}) // waits for an onGone that started; none starts after
	}
}

// run reads the set after each wait while anything is watched.
func (h *hangups) run() {
	var idleSince time.Time
	for {
		h.wait()
		h.lastLook.Store(int64(time.Since(h.epoch)))
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
		case time.Since(idleSince) > h.linger:
			h.running = false
			h.mu.Unlock()
			return
		}
		gone := h.lookLocked()
		h.mu.Unlock()
		callAll(gone)
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
	h.watched = map[int32]*watchEntry{}
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
