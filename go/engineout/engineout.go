// Package engineout reads the output stream of a vLLM engine core (its
// EngineCoreOutputs messages, MessagePack arrays in the fields' order) and
// hands the new tokens of the requests routed to it straight to their
// streams, so that a step's plain decode tokens reach the caller without
// waking the host's interpreter. Every message, delivered or not, is also
// forwarded to the host, which keeps the engine's bookkeeping (statistics,
// finishes, everything else) as it would have kept it.
//
// A Router guarantees:
//
//   - One delivery: each output's tokens go out at most once, either here
//     (its flag in the forwarded message is 1, or 2 when it also carries
//     fields the host keeps in its books) or by the host (0); a flag of 1
//     or 2 means they went out (a target that refuses them, its request
//     stopped, hands the request back: Options.Deliver).
//   - Order per request: a routed request's deliveries here all come before
//     the first output left to the host; from that output on (a finish,
//     logprobs, anything not plain) the request is handed back and never
//     delivered here again. A route is armed (Activate) only if no output
//     of its request went by since it was reserved (Reserve), so the host
//     never holds an earlier output of it when this side starts.
//   - Order of forwarding: messages are forwarded in the order they were
//     read. A message whose outputs were all delivered here, and that
//     carries nothing the host must act on at once, may wait to go with
//     later ones (one wake-up of the host for several steps): until a
//     message comes Window or more after the first that waits, or one the
//     host must act on, or FlushPending; any other message goes at once,
//     after those waiting.
//   - Bad input: a message that does not read as the Layout says is
//     forwarded whole, nothing of it delivered.
package engineout

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The letters of a Layout, one per field in the struct's order.
const (
	// Of EngineCoreOutputs:
	FieldOutputs = 'o' // the list of EngineCoreOutput
	FieldAtOnce  = 'f' // set (not nil): the host gets the message at once
	// Of EngineCoreOutput:
	FieldID     = 'i' // the request's id, a string
	FieldTokens = 't' // the new token ids, an array of integers
	FieldUnset  = 'n' // set: the output's tokens are left to the host
	FieldExtra  = 'x' // set: the host takes the output its own way, at once (the tokens still go out here)
	// Either:
	FieldAny = 'a' // read by the host only
)

// Layout says what each field of the two structs is to a Router, as the
// host's running vLLM declares them (MessagePack arrays in field order, a
// struct's trailing defaults left out).
type Layout struct {
	Message string // per field of EngineCoreOutputs: FieldOutputs once, FieldAtOnce, FieldAny
	Output  string // per field of EngineCoreOutput: FieldID and FieldTokens once each, FieldUnset, FieldExtra, FieldAny
}

// Check reports what is wrong with l, or nil.
func (l Layout) Check() error {
	if strings.Count(l.Message, string(rune(FieldOutputs))) != 1 || strings.Trim(l.Message, "ofa") != "" {
		return fmt.Errorf("engineout: message layout %q: one %q, and only %q, %q, %q", l.Message, FieldOutputs, FieldOutputs, FieldAtOnce, FieldAny)
	}
	if strings.Count(l.Output, "i") != 1 || strings.Count(l.Output, "t") != 1 || strings.Trim(l.Output, "itnxa") != "" {
		return fmt.Errorf("engineout: output layout %q: one %q and one %q, and only %q", l.Output, FieldID, FieldTokens, "itnxa")
	}
	return nil
}

// Options make a Router.
type Options[T any] struct {
	Layout Layout
	// Suffix is how many trailing bytes of an output's request id are the
	// engine's own, not the id a route was reserved under (vLLM adds "-" and
	// 8 random characters to each request's id). An id no longer than that
	// is never routed.
	Suffix int
	// Window is the most a message of delivered outputs waits to be
	// forwarded while messages keep coming (0: forwarded at once, as every
	// other); after the last, until FlushPending.
	Window time.Duration
	// Deliver hands a routed request's item ({"token_ids":[...]}, the
	// caller's to keep) to its target and reports whether it took it. A
	// target that refuses (its request stopped: nothing more goes to its
	// caller) hands its request back: that output and every later one are
	// the host's (flag 0), which keeps them in its books, or not, as its
	// own way does for a stopped request, and counts none as sent. Flush
	// follows each message's deliveries. Both are called with the Router's
	// lock held: they must not call back into it.
	Deliver func(target T, item []byte) bool
	Flush   func()
	// Forward hands the host one message (EncodeForward's form), in the
	// order read, with the Router's lock held.
	Forward func(msg []byte)
}

type route[T any] struct {
	target T
	armed  bool
	seen   bool // an output went by while reserved
}

// Router routes one engine core's outputs (see the package's guarantees).
type Router[T any] struct {
	o Options[T]

	mu      sync.Mutex
	routes  map[string]*route[T]
	pending [][]byte  // forwarded messages waiting for the window
	since   time.Time // when the first of them came
	closed  bool
	sent    int64 // tokens delivered
}

// New makes a Router.
func New[T any](o Options[T]) (*Router[T], error) {
	if err := o.Layout.Check(); err != nil {
		return nil, err
	}
	if o.Suffix < 0 {
		return nil, fmt.Errorf("engineout: a negative Suffix")
	}
	if o.Deliver == nil || o.Forward == nil {
		return nil, fmt.Errorf("engineout: Deliver and Forward are required")
	}
	if o.Flush == nil {
		o.Flush = func() {}
	}
	return &Router[T]{o: o, routes: map[string]*route[T]{}}, nil
}

// Reserve starts watching request id, before the engine has it: Activate
// arms it later if none of its outputs went by meanwhile. Reserving an id
// again starts over.
func (r *Router[T]) Reserve(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.routes[id] = &route[T]{}
	}
}

// Activate arms request id's route to target and reports true, if id was
// reserved and none of its outputs went by since; else it drops the route
// and reports false (its outputs are the host's).
func (r *Router[T]) Activate(id string, target T) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rt := r.routes[id]
	if rt == nil || rt.seen || rt.armed || r.closed {
		delete(r.routes, id)
		return false
	}
	rt.target, rt.armed = target, true
	return true
}

// Drop forgets request id's route: its outputs are the host's from now on.
func (r *Router[T]) Drop(id string) {
	r.mu.Lock()
	delete(r.routes, id)
	r.mu.Unlock()
}

// Sent is how many tokens were delivered here so far (that their targets
// took).
func (r *Router[T]) Sent() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent
}

// Routes is how many routes are reserved or armed.
func (r *Router[T]) Routes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.routes)
}

// Close stops the Router: it forwards and delivers nothing after it
// returns, and drops what waited for the window. Idempotent.
func (r *Router[T]) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.pending = nil
	r.routes = map[string]*route[T]{}
}

// Handle takes one message of the engine core (its frames; the first is
// the MessagePack EngineCoreOutputs, the others its large buffers): a
// zmtp.Handler. It never fails: what it cannot read goes to the host.
func (r *Router[T]) Handle(frames [][]byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	var flags []byte
	atOnce, ok := true, false
	if len(frames) > 0 {
		flags, atOnce, ok = r.route(frames[0])
	}
	if !ok {
		r.handBackAll()
	}
	msg := EncodeForward(frames, flags)
	now := time.Now()
	if atOnce || r.o.Window <= 0 || (len(r.pending) > 0 && now.Sub(r.since) >= r.o.Window) {
		r.flushPending()
		r.o.Forward(msg)
		return nil
	}
	if len(r.pending) == 0 {
		r.since = now
	}
	r.pending = append(r.pending, msg)
	return nil
}

// FlushPending forwards the messages waiting for the window now. The
// Router keeps no timer (a timer's every expiry costs the process the Go
// scheduler's polling): the window's end is seen when the next message
// comes, and the host calls this from time to time for the messages after
// which none came.
func (r *Router[T]) FlushPending() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.flushPending()
	}
}

// handBackAll leaves every route's outputs to the host from now on (mu
// held): after a message this side could not read, whose outputs the host
// sends itself, none of their later outputs may go out here before them.
func (r *Router[T]) handBackAll() {
	for id, rt := range r.routes {
		if rt.armed {
			delete(r.routes, id)
		} else {
			rt.seen = true
		}
	}
}

// flushPending forwards the messages waiting for the window (mu held).
func (r *Router[T]) flushPending() {
	for _, m := range r.pending {
		r.o.Forward(m)
	}
	clear(r.pending) // forwarded: not kept reachable
	r.pending = r.pending[:0]
}

// output is what route reads of one EngineCoreOutput.
type output struct {
	index  int // in the message's outputs
	id     []byte
	tokens int  // where its array of token ids starts in the message (read: tokenItem)
	count  int  // of tokens
	plain  bool // every FieldUnset field is nil, the tokens read
	extra  bool // a FieldExtra field is set
}

// route reads message m, delivers what it can, and returns each output's
// flag, whether the host must have the message at once, and whether m read
// as the layout says (mu held).
func (r *Router[T]) route(m []byte) (flags []byte, atOnce, ok bool) {
	rd := reader{b: m}
	n, ok := rd.array()
	if !ok {
		return nil, true, false
	}
	var outs []output // those with a route
	count := 0        // of outputs
	read := false
	for f := 0; f < n; f++ {
		kind := byte(FieldAny)
		if f < len(r.o.Layout.Message) {
			kind = r.o.Layout.Message[f]
		}
		switch {
		case kind == FieldOutputs:
			var unrouted bool
			if outs, count, unrouted, ok = r.readOutputs(&rd); !ok {
				return nil, true, false
			}
			atOnce = atOnce || unrouted
			read = true
		case kind == FieldAtOnce:
			if rd.nil() {
				continue
			}
			atOnce = true
			if !rd.skip() {
				return nil, true, false
			}
		default:
			if !rd.skip() {
				return nil, true, false
			}
		}
	}
	if !rd.done() {
		return nil, true, false
	}
	if !read {
		return nil, atOnce, true
	}
	flags = make([]byte, count)
	delivered := 0
	for k := range outs {
		o := &outs[k]
		i := o.index
		rt := r.routes[string(o.id[:len(o.id)-r.o.Suffix])] // gone since if an earlier output handed it back
		switch {
		case rt == nil:
			atOnce = true
		case !rt.armed:
			rt.seen = true
			atOnce = true
		case o.plain && r.o.Deliver(rt.target, tokenItem(m, o.tokens)):
			r.sent += int64(o.count)
			delivered++
			flags[i] = 1
			if o.extra {
				flags[i] = 2
				atOnce = true
			}
		default: // handed back (not plain, or refused): the host has this output and every later one
			delete(r.routes, string(o.id[:len(o.id)-r.o.Suffix]))
			atOnce = true
		}
	}
	if delivered > 0 {
		r.o.Flush()
	}
	return flags, atOnce, true
}

// readOutputs reads the list of EngineCoreOutput: the outputs whose
// request has a route now (only those are kept: what a message costs in
// memory grows with the routed requests, not with its outputs), how many
// there are in all, and whether any has none (the host then has the
// message at once).
func (r *Router[T]) readOutputs(rd *reader) (outs []output, count int, unrouted, ok bool) {
	n, ok := rd.array()
	if !ok {
		return nil, 0, false, false
	}
	for i := range n {
		o := output{index: i}
		if !r.readOutput(rd, &o) {
			return nil, 0, false, false
		}
		if len(o.id) <= r.o.Suffix || r.routes[string(o.id[:len(o.id)-r.o.Suffix])] == nil {
			unrouted = true
			continue
		}
		outs = append(outs, o)
	}
	return outs, n, unrouted, true
}

func (r *Router[T]) readOutput(rd *reader, o *output) bool {
	n, ok := rd.array()
	if !ok {
		return false
	}
	layout := r.o.Layout.Output
	o.plain = true
	gotID := false
	for f := 0; f < n; f++ {
		kind := byte(FieldUnset) // a field this layout does not know: not plain
		if f < len(layout) {
			kind = layout[f]
		}
		switch kind {
		case FieldID:
			if o.id, gotID = rd.str(); !gotID {
				return false
			}
		case FieldTokens:
			if o.tokens, o.count, ok = readTokens(rd); !ok {
				if !rd.skip() {
					return false
				}
				o.plain = false
			}
		case FieldUnset, FieldExtra:
			if rd.nil() {
				continue
			}
			if kind == FieldUnset {
				o.plain = false
			} else {
				o.extra = true
			}
			if !rd.skip() {
				return false
			}
		default:
			if !rd.skip() {
				return false
			}
		}
	}
	if !gotID || n <= strings.IndexByte(layout, FieldTokens) {
		o.plain = false // no id, or no tokens: not an output this side knows
	}
	return gotID
}

// readTokens reads past an array of token ids (integers, none negative)
// and returns where it starts and its length; the item that carries them
// is made only for an output delivered (tokenItem), so an output no route
// takes costs no allocation. Not such an array: false, nothing read.
func readTokens(rd *reader) (int, int, bool) {
	start := rd.i
	n, ok := rd.array()
	if !ok {
		return 0, 0, false
	}
	for k := 0; k < n; k++ {
		if v, ok := rd.int(); !ok || v < 0 {
			rd.i = start
			return 0, 0, false
		}
	}
	return start, n, true
}

// tokenItem is the item that carries the token ids whose array readTokens
// read at start of m (no tokens: an item of none, as the host's own way
// sends it).
func tokenItem(m []byte, start int) []byte {
	rd := reader{b: m, i: start}
	n, _ := rd.array()
	item := make([]byte, 0, len(`{"token_ids":[]}`)+n*7)
	item = append(item, `{"token_ids":[`...)
	for k := 0; k < n; k++ {
		v, _ := rd.int()
		if k > 0 {
			item = append(item, ',')
		}
		item = strconv.AppendInt(item, v, 10)
	}
	return append(item, "]}"...)
}

// EncodeForward is the form in which a message goes to the host: the
// count of frames (u32), each frame's length (u32) and bytes, then the
// count of outputs flagged (u32) and a byte per output: 1 where its tokens
// were delivered here, 2 where they were and a FieldExtra field is set, 0
// where they were not. Little-endian. No flags (count 0) for a message
// not read.
func EncodeForward(frames [][]byte, flags []byte) []byte {
	size := 8 + len(flags)
	for _, f := range frames {
		size += 4 + len(f)
	}
	b := make([]byte, 0, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(frames)))
	for _, f := range frames {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(flags)))
	return append(b, flags...)
}

// DecodeForward reads EncodeForward's form back (for tests and tools).
func DecodeForward(b []byte) (frames [][]byte, flags []byte, err error) {
	bad := fmt.Errorf("engineout: a forwarded message cut short")
	if len(b) < 4 {
		return nil, nil, bad
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	for ; n > 0; n-- {
		if len(b) < 4 || uint64(len(b)-4) < uint64(binary.LittleEndian.Uint32(b)) {
			return nil, nil, bad
		}
		l := binary.LittleEndian.Uint32(b)
		frames = append(frames, b[4:4+l])
		b = b[4+l:]
	}
	if len(b) < 4 || uint64(len(b)-4) != uint64(binary.LittleEndian.Uint32(b)) {
		return nil, nil, bad
	}
	return frames, b[4:], nil
}
