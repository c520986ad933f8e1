package listener

// The connection-limit policy of every listener (the package's doc says
// it in short).

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/rawio"
)

// idleConns bounds the connections that are not serving a request: new ones
// that have not yet sent a request's headers and kept-alive ones between
// requests (http.StateNew and http.StateIdle). At the bound, a new
// connection takes the place of the one that has waited longest, once that
// one has waited evictAfter; until then the new connection waits, and those
// behind it wait in the kernel's listen queue. So a flood of silent
// connections costs the flooder its own oldest connections and keeps no
// client out, and a burst of real clients past the bound is served (each
// sends its headers within evictAfter, and a connection serving a request
// no longer counts). A connection serving a request (a long stream
// included) is neither counted nor closed. With evictAfter 0 a new
// connection closes the oldest waiting one at once.
type idleConns struct {
	max        int
	evictAfter time.Duration

	mu    sync.Mutex
	order list.List                  // *waitingConn, oldest first
	at    map[net.Conn]*list.Element // the same, by connection
	left  chan struct{}              // a connection stopped waiting (wakes admit)
	// closed counts the connections closed for the bound.
	closed int64
}

type waitingConn struct {
	c     net.Conn
	since time.Time
}

func newIdleConns(max int, evictAfter time.Duration) *idleConns {
	return &idleConns{max: max, evictAfter: evictAfter, at: map[net.Conn]*list.Element{}, left: make(chan struct{}, 1)}
}

// connState is the http.Server's ConnState hook.
func (l *idleConns) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.at[c]; e != nil {
		l.order.Remove(e)
		delete(l.at, c)
		select {
		case l.left <- struct{}{}:
		default:
		}
	}
	if s != http.StateNew && s != http.StateIdle {
		return // active, hijacked or closed
	}
	now := time.Now()
	l.at[c] = l.order.PushBack(&waitingConn{c: c, since: now})
	// Connections that finish their requests together can take the count
	// past the bound: close the oldest that are due (admit closes the rest
	// when new connections arrive; the idle timeout, otherwise).
	for l.order.Len() > l.max {
		if !l.evictDue(now) {
			break
		}
	}
}

// evictDue closes the oldest waiting connection if it has waited
// evictAfter; mu held.
func (l *idleConns) evictDue(now time.Time) bool {
	w := l.order.Front().Value.(*waitingConn)
	if now.Sub(w.since) < l.evictAfter {
		return false
	}
	l.order.Remove(l.order.Front())
	delete(l.at, w.c)
	l.closed++
	_ = w.c.Close() // its serving goroutine sees the error and ends
	return true
}

// admit returns when there is room for one more waiting connection (closing
// the oldest once due), or false when done is closed.
func (l *idleConns) admit(done <-chan struct{}) bool {
	for {
		l.mu.Lock()
		if l.order.Len() < l.max {
			l.mu.Unlock()
			return true
		}
		now := time.Now()
		if l.evictDue(now) {
			l.mu.Unlock()
			continue
		}
		wait := l.order.Front().Value.(*waitingConn).since.Add(l.evictAfter).Sub(now)
		l.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-l.left:
		case <-t.C:
		case <-done:
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// counts returns how many connections wait and how many were closed for the
// bound.
func (l *idleConns) counts() (waiting int, closed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len(), l.closed
}

// admitListener accepts a connection only when idleConns has room for it.
type admitListener struct {
	net.Listener
	idle *idleConns
	once sync.Once
	done chan struct{}
}

func (l *admitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if !l.idle.admit(l.done) {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return rawio.Wrap(c), nil
}

func (l *admitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}
