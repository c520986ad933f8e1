package plane

// Unexported state the external tests (package plane_test) reach, for the
// situations they set up by hand. They are external because the harness they
// share with the other packages' tests, go/internal/planetest, imports plane
// (see its package comment).

import "github.com/nats-io/nats.go"

// SetRoundRobin makes c's next round-robin pick its i-th instance (in the
// order of InstanceIDs).
func SetRoundRobin(c *Client, i int) { c.rr.Store(uint64(i)) }

// Serving reports whether e still serves req: its response stream is open.
func Serving(e *Endpoint, req *Request) bool { return e.serving(req) }

// NumServing is the number of requests e serves.
func NumServing(e *Endpoint) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active)
}

// SetClosing sets the mark Endpoint.Close sets first: while it is set, e
// refuses new requests although it is still subscribed and listed.
func SetClosing(e *Endpoint, closing bool) {
	e.mu.Lock()
	e.closed = closing
	e.mu.Unlock()
}

// StopReceiving unsubscribes e from its requests while its lease still
// lists it: a worker that died before its lease expired.
func StopReceiving(e *Endpoint) error { return e.sub.Unsubscribe() }

// PickFor is c's choice of an instance for one attempt (see pickFor).
func PickFor(c *Client, route Route, instance uint64, exclude map[uint64]bool, admit bool) (uint64, bool, error) {
	how := pick(0)
	if admit {
		how = pickAdmit
	}
	return c.pickFor(route, instance, exclude, how)
}

// Suspect makes c avoid instance id for a while, as a failed request does.
func Suspect(c *Client, id uint64) { c.suspect(id) }

// Suspects are the instances c avoids now.
func Suspects(c *Client) map[uint64]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]bool{}
	for id := range c.suspects {
		out[id] = true
	}
	return out
}

// Turn is c's next round-robin turn.
func Turn(c *Client) uint64 { return c.rr.Load() }

// Unload uncounts one request of c's on instance id.
func Unload(c *Client, id uint64) { c.unload(id) }

// SetAbortSubject makes rt name subject in its envelopes as where its
// aborts are confirmed; "" names none, as a caller of an earlier version.
func SetAbortSubject(rt *Runtime, subject string) { rt.aborts = subject }

// NC is r's NATS connection.
func NC(r *Runtime) *nats.Conn { return r.nc() }

// DeliverLoad hands data to c's load board as if it came from the bus
// (load.go): what a frontend does with each load report.
func DeliverLoad(c *Client, data []byte) {
	r := c.root()
	r.mu.Lock()
	b := r.board
	r.mu.Unlock()
	b.deliver(&nats.Msg{Data: data})
}
