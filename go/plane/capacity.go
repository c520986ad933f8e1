package plane

// Capacity. A client told how to read each instance's capacity from its
// metadata (SetCapacity) counts the requests it has running on each
// instance: every attempt, from the moment it is routed until its stream
// ends. It routes each new attempt to the instance with the most free
// capacity (capacity minus running; an instance that declares none counts
// as the largest any instance declares, and always has room), ties in turn. Reserve is admission: it takes one free
// place, or says that every instance is at its capacity (ErrAtCapacity),
// atomically, so two callers never both take the last place;
// WithReservation sends a request into the place taken. Attempts sent
// without a reservation (migration's, the other choices of a request) are
// not refused here: they go to the instance with the most free capacity
// even when it is negative.
//
// The client's count is only its picture: the authority is each worker's
// own count (workerload.go), which refuses as busy what is past its
// capacity, whoever sent it. The picture blends the client's own requests
// with the others' as the workers report them (load.go), so several
// clients (frontends) routing to the same instances mostly pick places that
// are free, and a busy refusal sends a request on to another instance.

import (
	"errors"
	"math"
	"sync/atomic"
)

// ErrAtCapacity: every instance is running as many requests as its capacity
// (Reserve).
var ErrAtCapacity = errors.New("plane: every instance is at its capacity")

// unlimited is the capacity of an instance that declares none.
const unlimited = math.MaxInt32

// capacityConfig is what SetCapacity set.
type capacityConfig struct {
	of     func(meta []byte) int
	onRoom func()
}

// SetCapacity makes c route by free capacity (see the top of this file).
// of reads an instance's capacity from its metadata (0 or less: unlimited);
// onRoom, if not nil, is called (outside any lock; it must not block)
// whenever a request of c's ends or the instances change: a place may have
// become free. Set it before the first request: only requests routed after
// it are counted.
func (c *Client) SetCapacity(of func(meta []byte) int, onRoom func()) {
	if of == nil {
		c.capacity.Store(nil)
		c.listenLoad(false)
		return
	}
	c.capacity.Store(&capacityConfig{of: of, onRoom: onRoom})
	c.listenLoad(true) // the load the instances publish (load.go)
}

// Running returns how many requests of c run on each instance (counted only
// with SetCapacity).
func (c *Client) Running() map[uint64]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[uint64]int, len(c.load))
	for id, n := range c.load {
		out[id] = n
	}
	return out
}

// Reservation is one place on an instance taken by Reserve. It is released
// by the request sent into it (WithReservation) when that ends, or by
// Release if none is.
type Reservation struct {
	c       *Client
	id      uint64
	counted bool // false: the client routes without capacity, nothing to give back
	done    atomic.Bool
}

// Instance is the instance the place is on.
func (r *Reservation) Instance() uint64 { return r.id }

// Release gives the place back (once; later calls do nothing).
func (r *Reservation) Release() {
	if r.done.CompareAndSwap(false, true) && r.counted {
		r.c.unload(r.id)
	}
}

// Reserve takes a free place on the instance with the most free capacity:
// ErrNoInstances when c knows none, ErrAtCapacity when every one is full.
// Without SetCapacity every instance has room.
func (c *Client) Reserve() (*Reservation, error) {
	id, counted, err := c.pickFor(RoundRobin, 0, nil, pickAdmit)
	if err != nil {
		return nil, err
	}
	return &Reservation{c: c, id: id, counted: counted}, nil
}

// WithReservation sends the request into r's place (Reserve): to r's
// instance, counted there already. The request owns the place from then on:
// it is released when the request's first attempt ends, or at once when
// Generate fails. Later attempts (migration) are routed as usual.
func WithReservation(r *Reservation) GenerateOption {
	return func(o *generateOptions) { o.reservation = r }
}

// unloader uncounts one request on instance id, once.
func (c *Client) unloader(id uint64) func() {
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			c.unload(id)
		}
	}
}

func (c *Client) unload(id uint64) {
	c.mu.Lock()
	if n := c.load[id]; n > 1 {
		c.load[id] = n - 1
	} else {
		delete(c.load, id)
	}
	c.loadChangedLocked(id)
	c.mu.Unlock()
	c.roomMaybe()
}

// roomMaybe tells SetCapacity's onRoom that a place may be free.
func (c *Client) roomMaybe() {
	if cfg := c.capacity.Load(); cfg != nil && cfg.onRoom != nil {
		cfg.onRoom()
	}
}
