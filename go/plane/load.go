package plane

// The load the workers publish, as a caller routing by capacity reads it.
// A client with SetCapacity listens to the load reports of its endpoint
// path (LoadSubject; one subscription per root client, shared by the
// clients Filtered made from it) and keeps, per instance, the requests
// running there that are not its own: the report's Running less its own
// count when the report arrived. An instance's free places are then its
// capacity less its own count less those others: its own count is the
// fresher (it moves with every request it routes), the others as fresh as
// the last report (at most a load interval and a hop old). A report older
// than one already applied (a smaller Gen) is ignored. Applying one costs
// O(log W) (one leaf of the free tree); a report that shows places freed
// calls onRoom, so a request waiting in a queue for a place gets one.
//
// A worker that refuses a request as busy (workerload.go) sends its load
// with the refusal: the caller applies it (the instance is full until a
// newer report says otherwise) and sends the request to the instance with
// the most free places among those that did not refuse it, within the same
// attempt and under the same stream token: no migration attempt is spent,
// and the instance is not suspected. When none is left with a free place
// the attempt ends with ErrBusy.

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/discovery"
)

// ErrBusy: every instance the request could go to refused it as busy (at
// its capacity). It never reached a handler: it may be sent again once a
// place is free. It is a kind of ErrNoResponders for callers that only
// know that, but migration does not count it as an attempt.
var ErrBusy = fmt.Errorf("%w: every worker is busy (at its capacity)", ErrNoResponders)

// maxReroutes bounds the instances one attempt tries after a busy refusal.
const maxReroutes = 8

// seenLoad is what a client keeps of an instance's last load report.
type seenLoad struct {
	gen    uint64
	others int // requests running there that are not this client's
	engine engineLoad
}

// engineLoad is what an instance's engine reported of itself, as the pick
// weighs it (route.go): the requests its scheduler holds back, and its KV
// cache usage in whole percent (0 to 100). An engine that reports neither
// counts as 0 and 0.
type engineLoad struct{ waiting, kvPercent int }

// maxWaiting bounds the waiting requests a report counts: more than any
// engine holds, and small enough that a score (route.go) never overflows.
const maxWaiting = 1 << 30

// engineOf is rep's engine figures, as a pick weighs them.
func engineOf(rep *LoadReport) engineLoad {
	var e engineLoad
	if rep.Waiting != nil {
		// Bounded, so that no report can overflow a score (route.go).
		e.waiting = min(max(*rep.Waiting, 0), maxWaiting)
	}
	if rep.KVUsage != nil && *rep.KVUsage > 0 { // NaN too is left at 0
		e.kvPercent = int(min(*rep.KVUsage, 1) * 100)
	}
	return e
}

// loadBoard is the subscription to one endpoint path's load reports and
// the clients (of one root client) that read them.
type loadBoard struct {
	sub     *nats.Subscription
	mu      sync.Mutex
	readers atomic.Pointer[[]*Client] // replaced, never modified
}

// root is the client that owns the watch (and the load board).
func (c *Client) root() *Client {
	if c.parent != nil {
		return c.parent
	}
	return c
}

// listenLoad makes c read its path's load reports (on, with SetCapacity)
// or stop reading them.
func (c *Client) listenLoad(on bool) {
	r := c.root()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.board == nil {
		if !on {
			return
		}
		b := &loadBoard{}
		sub, err := c.rt.nc().Subscribe(LoadSubject(c.path), b.deliver)
		if err != nil {
			return // routing falls back on the client's own count and busy refusals
		}
		b.sub = sub
		r.board = b
	}
	b := r.board
	b.mu.Lock()
	defer b.mu.Unlock()
	var next []*Client
	if cur := b.readers.Load(); cur != nil {
		for _, d := range *cur {
			if d != c {
				next = append(next, d)
			}
		}
	}
	if on {
		next = append(next, c)
	}
	b.readers.Store(&next)
}

// closeBoard ends the root client's subscription (at Close).
func (c *Client) closeBoard() {
	c.mu.Lock()
	b := c.board
	c.board = nil
	c.mu.Unlock()
	if b != nil {
		_ = b.sub.Unsubscribe()
	}
}

func (b *loadBoard) deliver(m *nats.Msg) {
	var rep LoadReport
	if json.Unmarshal(m.Data, &rep) != nil || rep.Instance == 0 {
		return
	}
	if cur := b.readers.Load(); cur != nil {
		for _, c := range *cur {
			c.applyLoad(rep, false)
		}
	}
}

// applyLoad applies an instance's load report (refused: it came with a busy
// refusal of a request still counted on the instance, which is not running
// there).
func (c *Client) applyLoad(rep LoadReport, refused bool) {
	if c.capacity.Load() == nil || c.currentView().index(rep.Instance) < 0 {
		return // not an instance c routes to (its filter, or not yet discovered)
	}
	c.mu.Lock()
	s, ok := c.others[rep.Instance]
	if ok && rep.Gen < s.gen {
		c.mu.Unlock()
		return
	}
	own := c.load[rep.Instance]
	if refused {
		own--
	}
	before := s.others
	s.gen, s.others, s.engine = rep.Gen, max(rep.Running-own, 0), engineOf(&rep)
	if c.others == nil {
		c.others = map[uint64]seenLoad{}
	}
	c.others[rep.Instance] = s
	c.loadChangedLocked(rep.Instance)
	c.mu.Unlock()
	if s.others < before && !refused {
		c.roomMaybe()
	}
}

// othersLocked is how many requests not c's run on instance id, as last
// reported (c.mu held).
func (c *Client) othersLocked(id uint64) int { return c.others[id].others }

// engineLocked is instance id's engine figures, as last reported (c.mu
// held).
func (c *Client) engineLocked(id uint64) engineLoad { return c.others[id].engine }

// pruneOthersLocked forgets the reports of instances not in v (c.mu held).
func (c *Client) pruneOthersLocked(v *view) {
	for id := range c.others {
		if v.index(id) < 0 {
			delete(c.others, id)
		}
	}
}

// reroute sends an attempt that its instance refused as busy (rep: the
// instance's load, sent with the refusal) to another instance, as the top
// of this file says: the subject to send it to, or false when no instance
// is left (or the request was sent Direct, or it was rerouted enough).
func (s *Stream) reroute(rep *LoadReport, refused *map[uint64]bool, hops int) (string, bool) {
	c := s.client
	if c == nil {
		return "", false
	}
	if rep != nil && rep.Instance == s.instance {
		c.applyLoad(*rep, true)
	}
	if s.route == Direct || hops >= maxReroutes {
		return "", false
	}
	if f := s.unload.Swap(nil); f != nil {
		(*f)()
	}
	if *refused == nil {
		*refused = make(map[uint64]bool, len(s.exclude)+1)
		for id, bad := range s.exclude {
			(*refused)[id] = bad
		}
	}
	(*refused)[s.instance] = true
	id, counted, err := c.pickFor(RoundRobin, 0, *refused, pickAdmit|pickStrict)
	if err != nil {
		return "", false
	}
	if counted {
		f := c.unloader(id)
		s.unload.Store(&f)
	}
	s.instance = id
	s.served.Store(id)
	if s.outer != nil {
		s.outer.served.Store(id)
	}
	return discovery.RequestSubject(c.path, id), true
}
