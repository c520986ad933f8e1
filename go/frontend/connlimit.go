package frontend

import (
	"container/list"
	"net"
	"net/http"
	"sync"
)

// idleConns bounds the connections that are not serving a request: new ones
// that have not yet sent a request's headers and kept-alive ones between
// requests (http.StateNew and http.StateIdle). When one more arrives past
// the bound, the one that has waited longest (accepted, or last answered,
// first) is closed, so a flood of silent connections costs the flooder its
// own oldest connections and keeps no client out. A connection serving a
// request (a long stream included) is neither counted nor closed.
type idleConns struct {
	max int

	mu    sync.Mutex
	order list.List                  // net.Conn, oldest first
	at    map[net.Conn]*list.Element // the same, by connection
	// closed counts the connections closed for the bound.
	closed int64
}

func newIdleConns(max int) *idleConns {
	return &idleConns{max: max, at: map[net.Conn]*list.Element{}}
}

// connState is the http.Server's ConnState hook.
func (l *idleConns) connState(c net.Conn, s http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.at[c]
	switch s {
	case http.StateNew, http.StateIdle:
		if e != nil {
			l.order.MoveToBack(e)
		} else {
			l.at[c] = l.order.PushBack(c)
		}
		for l.order.Len() > l.max {
			old := l.order.Remove(l.order.Front()).(net.Conn)
			delete(l.at, old)
			l.closed++
			_ = old.Close() // its serving goroutine sees the error and ends
		}
	default: // active, hijacked, closed
		if e != nil {
			l.order.Remove(e)
			delete(l.at, c)
		}
	}
}

// counts returns how many connections are held waiting and how many were
// closed for the bound.
func (l *idleConns) counts() (held int, closed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len(), l.closed
}
