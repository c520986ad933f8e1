package discovery

// A watcher's feed from the discovery stream: the instances' states, read
// once in full, then their changes; read afresh after any gap or silence.

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// feedHeartbeat is the consumer's idle heartbeat: a watcher that hears
	// nothing, not even this, for feedSilence reads the stream afresh (its
	// consumer may have been on a node that died).
	feedHeartbeat = time.Second
	feedSilence   = 3 * feedHeartbeat
	// lateSlack is how much later than its schedule an "expired" may be
	// written and still be trusted at once: the scheduler rounds to the
	// second and fires at least 250 ms apart. A later one was held back by
	// an outage of the stream, during which live leases could not re-arm:
	// the instance is dropped only if it does not put "up" again within a
	// TTL.
	lateSlack = 1500 * time.Millisecond
)

// feed keeps a Watcher's stream-announced instances (entries with kv set)
// up to date. Lock order: feed.mu, then Watcher.mu.
type feed struct {
	w      *Watcher
	nc     *nats.Conn
	filter string
	kick   chan struct{} // buffered(1): read the stream afresh
	done   chan struct{} // closed when run returns

	// terms is the stream leader's term as last read (term.go).
	terms termCache

	mu      sync.Mutex
	gen     uint64 // the current consumer; messages of an older one are dropped
	sub     *nats.Subscription
	cseq    uint64    // last consumer sequence applied
	heard   time.Time // last message or heartbeat of the current consumer
	syncing []stateMsg
	synced  chan struct{} // closed once the current read in full is applied
}

// stateMsg is one message of a state subject and when the stream stored it.
type stateMsg struct {
	a  announcement
	at time.Time
}

func newFeed(w *Watcher, nc *nats.Conn, path string) *feed {
	return &feed{
		w: w, nc: nc, filter: statePrefix + path + ".*",
		kick: make(chan struct{}, 1), done: make(chan struct{}),
	}
}

// resync replaces the consumer with one that delivers the last message of
// every state subject, then the changes, and returns once the new
// consumer exists; synced is closed when its first part is applied.
func (f *feed) resync(ctx context.Context) (synced <-chan struct{}, err error) {
	f.mu.Lock()
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
	}
	f.gen++
	gen := f.gen
	f.sub, f.cseq, f.heard = nil, 0, time.Now()
	f.syncing = []stateMsg{}
	ch := make(chan struct{})
	f.synced = ch
	f.mu.Unlock()

	inbox := f.nc.NewInbox()
	sub, err := f.nc.Subscribe(inbox, func(m *nats.Msg) { f.receive(gen, m) })
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	if f.gen != gen {
		f.mu.Unlock()
		_ = sub.Unsubscribe()
		return nil, ErrClosed
	}
	f.sub = sub
	f.mu.Unlock()

	js, err := jetstream.New(f.nc)
	if err != nil {
		return nil, err
	}
	if err := ensureStream(ctx, f.nc); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, jsTimeout)
	defer cancel()
	cons, err := js.CreatePushConsumer(rctx, streamName, jetstream.ConsumerConfig{
		DeliverSubject:    inbox,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     f.filter,
		FlowControl:       true,
		IdleHeartbeat:     feedHeartbeat,
		MemoryStorage:     true,
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 && info.Delivered.Consumer == 0 {
		f.mu.Lock()
		if f.gen == gen {
			f.finishLocked()
		}
		f.mu.Unlock()
	}
	return ch, nil
}

// receive handles one message of consumer gen. An "expired" and a read in
// full are applied once the stream's leader's term is known (term), which
// may take a request to the stream: f.mu is not held meanwhile, and the
// subscription delivers nothing else until receive returns, so the
// messages are still applied in order.
func (f *feed) receive(gen uint64, m *nats.Msg) {
	expired, full := f.take(gen, m)
	if expired == nil && full == nil {
		return
	}
	msgs := full
	if expired != nil {
		msgs = []stateMsg{*expired}
	}
	t := f.termOf(msgs)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return
	}
	if expired != nil {
		f.w.apply(expired.a, expired.at, t)
		return
	}
	f.w.applyFull(full, t)
	close(f.synced)
}

// take handles one message of consumer gen with f.mu held: it applies a
// change at once, or returns the "expired" to apply, or the read in full
// that it completes.
func (f *feed) take(gen uint64, m *nats.Msg) (expired *stateMsg, full []stateMsg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return nil, nil
	}
	f.heard = time.Now()
	if m.Header.Get("Status") == "100" && len(m.Data) == 0 {
		// An idle heartbeat or a flow control request.
		if m.Reply != "" {
			_ = f.nc.Publish(m.Reply, nil)
		}
		if s := m.Header.Get(hdrStalled); s != "" {
			_ = f.nc.Publish(s, nil)
		}
		if last := m.Header.Get(hdrLastConsumer); last != "" && last != strconv.FormatUint(f.cseq, 10) {
			f.again()
		}
		return nil, nil
	}
	md, err := m.Metadata()
	if err != nil {
		return nil, nil
	}
	if md.Sequence.Consumer != f.cseq+1 {
		f.again() // a gap: messages were lost on the way
		return nil, nil
	}
	f.cseq = md.Sequence.Consumer
	var a announcement
	switch err := json.Unmarshal(m.Data, &a); {
	case err != nil || a.ID == 0 || (a.Op != opUp && a.Op != opDown && a.Op != opExpired):
		f.w.log.Debug("ignoring a malformed state", "subject", m.Subject, "error", err)
	case f.syncing != nil:
		f.syncing = append(f.syncing, stateMsg{a: a, at: md.Timestamp})
	case a.Op == opExpired && f.w.lists(a.ID, a.Lease):
		expired = &stateMsg{a: a, at: md.Timestamp}
	default:
		f.w.apply(a, md.Timestamp, term{})
	}
	if f.syncing != nil && md.NumPending == 0 {
		full = f.syncing
		f.syncing = nil
	}
	return expired, full
}

// again asks run to read the stream afresh.
func (f *feed) again() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// finishLocked applies a read in full: its states, and, for the instances
// it no longer has, a TTL to come back (a replacement server's stream is
// empty until the leases put "up" again). Once per read: the consumer's
// first message may finish it before resync sees that it started empty.
func (f *feed) finishLocked() {
	if f.syncing == nil {
		return // finished already
	}
	msgs := f.syncing
	f.syncing = nil
	f.w.applyFull(msgs, term{})
	close(f.synced)
}

// run reads the stream afresh when asked to (a gap, a heartbeat that
// counts otherwise than the watcher, Resync) or when the consumer falls
// silent, until the Watcher closes.
func (f *feed) run() {
	defer close(f.done)
	t := time.NewTicker(feedHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-f.w.stop:
			return
		case <-f.kick:
		case <-t.C:
			if !f.silent() {
				continue
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
		go func() {
			select {
			case <-f.w.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		if _, err := f.resync(ctx); err != nil && !errors.Is(err, ErrClosed) {
			f.w.log.Debug("could not read the discovery stream", "error", err)
		}
		cancel()
	}
}

// silent reports a consumer not heard from for feedSilence, with nothing
// waiting to be read (a watcher that is merely busy is not silent).
func (f *feed) silent() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sub == nil {
		return true
	}
	if n, _, err := f.sub.Pending(); err == nil && n > 0 {
		return false
	}
	return time.Since(f.heard) > feedSilence
}

// stop ends the feed: no message is applied after it returns.
func (f *feed) stop() {
	f.mu.Lock()
	f.gen++
	if f.sub != nil {
		_ = f.sub.Unsubscribe()
		f.sub = nil
	}
	f.mu.Unlock()
	<-f.done
}

// apply applies one state read in the discovery stream, stored at "at";
// t is the stream leader's term, for an "expired".
func (w *Watcher) apply(a announcement, at time.Time, t term) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.applyStateLocked(a, at, time.Now(), t)
	}
}

// lists reports whether the instance id of lease is listed.
func (w *Watcher) lists(id, lease uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.instances[id]
	return ok && e.lease == lease
}

func (w *Watcher) applyStateLocked(a announcement, at, now time.Time, t term) {
	if a.Op != opExpired {
		w.applyLocked(a, now, true)
		return
	}
	e, ok := w.instances[a.ID]
	if !ok || e.lease != a.Lease {
		return // already gone, or an older lease of the id
	}
	ttl := time.Duration(a.TTL) * time.Second
	due := time.Unix(0, a.At).Add(ttl + lateSlack)
	if at.After(due) || t.doubts(at, ttl) {
		// Written late: the stream was out, and so were the heartbeats.
		// Or written early in a new leader's term: the election may have
		// kept a live lease from re-arming in time (term).
		// A live lease puts "up" again at its next one.
		if e.deadline.IsZero() {
			e.kv, e.deadline = true, now.Add(max(time.Duration(a.TTL)*time.Second, w.ttl))
		}
		return
	}
	delete(w.instances, a.ID)
	w.notifyLocked()
}

// applyFull applies a read of the stream in full, in order; instances of
// the stream it does not mention get a TTL to come back.
func (w *Watcher) applyFull(msgs []stateMsg, t term) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	now := time.Now()
	seen := make(map[uint64]bool, len(msgs))
	for _, m := range msgs {
		seen[m.a.ID] = true
		w.applyStateLocked(m.a, m.at, now, t)
	}
	for id, e := range w.instances {
		if e.kv && !seen[id] && e.deadline.IsZero() {
			e.deadline = now.Add(w.ttl)
		}
	}
}
