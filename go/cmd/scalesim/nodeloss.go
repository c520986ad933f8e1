package main

// Node loss: one NATS node of the cluster dies (the discovery stream's
// leader, or a node that is not); the burst that follows, second by
// second, how long until every client's view is whole again, and whether
// any live worker ever left any client's view.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// discoveryStream is go/discovery's stream (its name is unexported there).
const discoveryStream = "DC_DISCOVERY"

// Which node a node-loss point kills.
const (
	lossFollower = "follower" // a node that does not lead the discovery stream
	lossLeader   = "leader"   // the discovery stream's leader
)

// nodeLoss is what one node loss measured.
type nodeLoss struct {
	Kind string `json:"kind"` // lossFollower or lossLeader
	// Clients connected to the node killed: they move to the others.
	Moved        int `json:"clients_moved"`
	MovedCallers int `json:"watchers_moved"`
	// Second by second from the kill (the first BaselineSecs are before it).
	Seconds      []burstSecond `json:"seconds"`
	BaselineSecs int           `json:"baseline_seconds"`
	// The burst: the busiest second and the sum over the seconds after the
	// kill of what was delivered beyond the idle rate before it.
	PeakDeliv   int64 `json:"peak_deliveries_per_s"`
	ExtraDeliv  int64 `json:"extra_deliveries"`
	ExtraFeed   int64 `json:"extra_stream_reads"`
	ExtraPuts   int64 `json:"extra_state_puts"`
	ExtraRearms int64 `json:"extra_rearms"`
	Consumers   int64 `json:"consumer_creations"`
	ExtraAPI    int64 `json:"extra_js_api_requests"`
	// SteadyS: from the kill until the deliveries are back to the idle rate
	// (within 20% + 10 a second, either way) for good: the end of the last
	// second that was not (the run ends after three that are).
	SteadyS float64 `json:"steady_after_s"`
	// A worker crashed half a second after the kill (connected to a node
	// that lives): from its crash until every client dropped it. A worker
	// started then: from its start until every client listed it.
	CrashedDroppedS float64 `json:"crashed_dropped_after_s"`
	NewListedS      float64 `json:"new_listed_after_s"`
	// WholeS: from the kill until every client's view was whole again: the
	// crashed one gone, the new one there, nothing missing.
	WholeS float64 `json:"views_whole_after_s"`
	// FalseDrops: (client, live worker) pairs in which the client stopped
	// listing a worker that was alive, at any time (polled every 2 ms);
	// the clients that did, and when the first and the last drop were seen
	// (seconds after the kill).
	FalseDrops       int     `json:"false_drops"`
	FalseDropClients int     `json:"false_drop_clients"`
	FalseDropFirst   float64 `json:"false_drop_first_s,omitempty"`
	FalseDropLast    float64 `json:"false_drop_last_s,omitempty"`
}

// burstSecond is what one second carried (a rate a second, should the
// sample come late). Deliveries are the simulated
// clients' own counts of messages received (kept across reconnections);
// publishes and JetStream API requests are what a subscriber on a node
// that lives saw.
type burstSecond struct {
	T           float64 `json:"t_s"`  // its end, seconds after the kill
	Dt          float64 `json:"dt_s"` // its length
	Deliv       int64   `json:"delivered"`
	Feed        int64   `json:"delivered_to_watchers"` // stream reads, consumer heartbeats, their API replies
	ToWorkers   int64   `json:"delivered_to_workers"`  // acknowledgements of the leases' publishes
	StatePuts   int64   `json:"state_puts"`            // "up" and "down" published by leases
	Rearms      int64   `json:"rearms"`                // schedules re-armed by leases
	ConsCreates int64   `json:"consumer_creations"`
	StreamInfo  int64   `json:"stream_infos"`
	OtherAPI    int64   `json:"other_js_api"`
}

// lossMeter subscribes, on a node that lives, to what the leases publish
// to the discovery stream and to the JetStream API.
type lossMeter struct {
	nc                                     *nats.Conn
	puts, rearms, creates, infos, otherAPI atomic.Int64
}

func newLossMeter(url string) (*lossMeter, error) {
	m := &lossMeter{}
	nc, err := nats.Connect(url, nats.Name("scalesim-lossmeter"))
	if err != nil {
		return nil, err
	}
	m.nc = nc
	subs := map[string]func(*nats.Msg){
		"dc.disc.s.>": func(*nats.Msg) { m.puts.Add(1) },
		"dc.disc.t.>": func(*nats.Msg) { m.rearms.Add(1) },
		"$JS.API.>": func(msg *nats.Msg) {
			switch s := strings.TrimPrefix(msg.Subject, "$JS.API."); {
			case strings.HasPrefix(s, "CONSUMER.CREATE."):
				m.creates.Add(1)
			case strings.HasPrefix(s, "STREAM.INFO."):
				m.infos.Add(1)
			default:
				m.otherAPI.Add(1)
			}
		},
	}
	for subj, f := range subs {
		if _, err := nc.Subscribe(subj, f); err != nil {
			nc.Close()
			return nil, err
		}
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return m, nil
}

// lossCounts are cumulative counts at one moment.
type lossCounts struct {
	feed, workers                        int64
	puts, rearms, creates, infos, others int64
}

func (s *sim) lossCounts(m *lossMeter) lossCounts {
	c := lossCounts{puts: m.puts.Load(), rearms: m.rearms.Load(), creates: m.creates.Load(),
		infos: m.infos.Load(), others: m.otherAPI.Load()}
	for _, w := range s.workers {
		if w != nil {
			c.workers += int64(w.rt.Bus().Conn().Stats().InMsgs)
		}
	}
	for _, cl := range s.callers {
		c.feed += int64(cl.rt.Bus().Conn().Stats().InMsgs)
	}
	return c
}

// second is what was counted since o, dt ago, as a rate a second: a
// sample that came late (a busy machine) covers more than a second.
func (c lossCounts) second(o lossCounts, t float64, dt time.Duration) burstSecond {
	r := func(n int64) int64 { return int64(float64(n)/dt.Seconds() + 0.5) }
	return burstSecond{T: t, Dt: dt.Seconds(),
		Deliv: r(c.feed - o.feed + c.workers - o.workers), Feed: r(c.feed - o.feed), ToWorkers: r(c.workers - o.workers),
		StatePuts: r(c.puts - o.puts), Rearms: r(c.rearms - o.rearms),
		ConsCreates: r(c.creates - o.creates), StreamInfo: r(c.infos - o.infos), OtherAPI: r(c.others - o.others)}
}

// victim is the index of the node a point of kind kills.
func (s *sim) victim(kind string) (int, error) {
	leader := -1
	for i, srv := range s.cl.srvs {
		if srv.JetStreamIsStreamLeader("$G", discoveryStream) {
			leader = i
		}
	}
	if leader < 0 {
		return 0, errors.New("no node leads the discovery stream")
	}
	if kind == lossLeader {
		return leader, nil
	}
	for i, srv := range s.cl.srvs {
		if i != leader && !srv.JetStreamIsLeader() {
			return i, nil // neither the stream's leader nor the meta leader
		}
	}
	return (leader + 1) % len(s.cl.srvs), nil
}

// nodeLoss kills one node (s.cfg.NodeLoss says which) and follows the
// cluster and the clients until they are steady again.
func (s *sim) nodeLoss(res *result) error {
	if !s.cfg.JetStream || len(s.cl.srvs) < 3 {
		return errors.New("node loss needs JetStream and at least 3 nodes")
	}
	vi, err := s.victim(s.cfg.NodeLoss)
	if err != nil {
		return err
	}
	victimURL := "nats://" + s.cl.srvs[vi].Addr().String()
	lm, err := newLossMeter("nats://" + s.cl.srvs[(vi+1)%len(s.cl.srvs)].Addr().String())
	if err != nil {
		return err
	}
	defer lm.nc.Close()
	nl := &nodeLoss{Kind: s.cfg.NodeLoss, BaselineSecs: 3}
	// The worker that crashes during the loss is connected to a node that
	// lives: its death is a crash, not a move.
	crash := -1
	for i := len(s.workers) - 1; i > 0; i-- {
		if u := s.workers[i].rt.Bus().Conn().ConnectedUrl(); u != victimURL {
			crash = i
			break
		}
	}
	for _, w := range s.workers {
		if w.rt.Bus().Conn().ConnectedUrl() == victimURL {
			nl.Moved++
		}
	}
	for _, c := range s.callers {
		if c.rt.Bus().Conn().ConnectedUrl() == victimURL {
			nl.Moved++
			nl.MovedCallers++
		}
	}
	if crash < 0 {
		return errors.New("no worker on a node that lives")
	}
	mon := newViewMonitor(s.watchers(), s.workers)
	monDone := make(chan struct{})
	go mon.run(monDone)
	defer func() { close(monDone); mon.wait() }()

	prev, at := s.lossCounts(lm), time.Now()
	for range nl.BaselineSecs {
		time.Sleep(time.Second)
		cur, now := s.lossCounts(lm), time.Now()
		nl.Seconds = append(nl.Seconds, cur.second(prev, float64(len(nl.Seconds)-nl.BaselineSecs+1), now.Sub(at)))
		prev, at = cur, now
	}
	t0 := time.Now()
	s.cl.crash(vi)
	events := s.lossEvents(mon, crash, t0)
	err = s.followLoss(nl, lm, mon, prev, t0, events)
	res.NodeLoss = append(res.NodeLoss, nl)
	return err
}

// lossEvents crashes worker crash and starts a new worker half a second
// after t0, in the background; the channel yields the start's error.
func (s *sim) lossEvents(mon *viewMonitor, crash int, t0 time.Time) <-chan error {
	out := make(chan error, 1)
	go func() {
		time.Sleep(time.Until(t0.Add(500 * time.Millisecond)))
		w := s.workers[crash]
		mon.crashed(w.ep.InstanceID(), time.Now())
		w.rt.Bus().Conn().Close() // a crash: no "down" is ever sent
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Wait)
		defer cancel()
		started := time.Now()
		rt, port, err := s.newRuntime(ctx, s.quiet)
		if err != nil {
			out <- err
			return
		}
		nw := &worker{rt: rt, port: port, done: make(chan struct{})}
		if nw.ep, err = rt.Serve(path, meta); err != nil {
			close(nw.done)
			rt.Close()
			out <- err
			return
		}
		go s.serve(nw)
		s.mu.Lock()
		s.extra = append(s.extra, nw)
		s.mu.Unlock()
		mon.started(nw.ep.InstanceID(), started)
		out <- nil
	}()
	return out
}

// followLoss samples every second until the views are whole and the
// traffic is steady again, then sums the burst up.
func (s *sim) followLoss(nl *nodeLoss, lm *lossMeter, mon *viewMonitor, prev lossCounts, t0 time.Time, events <-chan error) error {
	base := nl.Seconds[:nl.BaselineSecs]
	var idle burstSecond
	for _, b := range base {
		idle.Deliv += b.Deliv / int64(len(base))
		idle.Feed += b.Feed / int64(len(base))
		idle.StatePuts += b.StatePuts / int64(len(base))
		idle.Rearms += b.Rearms / int64(len(base))
		idle.StreamInfo += b.StreamInfo / int64(len(base))
		idle.OtherAPI += b.OtherAPI / int64(len(base))
		idle.ConsCreates += b.ConsCreates / int64(len(base))
	}
	steadyRun, at := 0, t0
	var evErr error
	evDone := false
	deadline := t0.Add(s.cfg.Wait)
	for {
		time.Sleep(time.Until(t0.Add(time.Duration(len(nl.Seconds)-nl.BaselineSecs+1) * time.Second)))
		cur, now := s.lossCounts(lm), time.Now()
		sec := cur.second(prev, now.Sub(t0).Seconds(), now.Sub(at))
		prev, at = cur, now
		nl.Seconds = append(nl.Seconds, sec)
		nl.PeakDeliv = max(nl.PeakDeliv, sec.Deliv)
		// The sums are counts: each rate over its sample's length.
		n := func(rate, idle int64) int64 { return int64(float64(rate-idle)*sec.Dt + 0.5) }
		nl.ExtraDeliv += n(sec.Deliv, idle.Deliv)
		nl.ExtraFeed += n(sec.Feed, idle.Feed)
		nl.ExtraPuts += n(sec.StatePuts, idle.StatePuts)
		nl.ExtraRearms += n(sec.Rearms, idle.Rearms)
		nl.Consumers += n(sec.ConsCreates, 0)
		nl.ExtraAPI += n(sec.ConsCreates+sec.StreamInfo+sec.OtherAPI, idle.ConsCreates+idle.StreamInfo+idle.OtherAPI)
		// Steady: within 20% (and 10 a second) of the idle rate, neither
		// above (a burst) nor below (an outage: the leases cannot publish).
		if math.Abs(float64(sec.Deliv-idle.Deliv)) <= 0.2*float64(idle.Deliv)+10 {
			steadyRun++
		} else {
			steadyRun = 0
			nl.SteadyS = sec.T // steady, if ever, after this second
		}
		if !evDone {
			select {
			case evErr = <-events:
				evDone = true
			default:
			}
		}
		whole, crashedAt, newAt := mon.whole()
		if evDone && whole && steadyRun >= 3 {
			crash, start := mon.times()
			nl.CrashedDroppedS = crashedAt.Sub(crash).Seconds()
			nl.NewListedS = newAt.Sub(start).Seconds()
			nl.WholeS = max(crashedAt.Sub(t0), newAt.Sub(t0)).Seconds()
			mon.report(nl, t0)
			return evErr
		}
		if time.Now().After(deadline) {
			mon.report(nl, t0)
			if evErr != nil {
				return evErr
			}
			return fmt.Errorf("not steady and whole %v after the node's loss (whole: %v)", s.cfg.Wait, whole)
		}
	}
}

// viewMonitor watches every client's view of the instances: a live worker
// missing from one is a false drop.
type viewMonitor struct {
	clients []*plane.Client
	done    chan struct{}

	mu      sync.Mutex
	live    map[uint64]bool   // workers alive (crashed ones are not)
	crashID uint64            // the worker crashed during the loss
	crashAt time.Time         // when
	newID   uint64            // the worker started during the loss
	startAt time.Time         // when it started
	listed  []map[uint64]bool // per client: the ids of its current view
	missing map[[2]uint64]bool
	drops   int
	// dropClients are the clients that dropped a live worker; firstDrop
	// and lastDrop when the first and last such drop was seen.
	dropClients         map[int]bool
	firstDrop, lastDrop time.Time
	goneAt              []time.Time // per client: when it stopped listing crashID
	seenAt              []time.Time // per client: when it first listed newID
}

func newViewMonitor(clients []*plane.Client, workers []*worker) *viewMonitor {
	m := &viewMonitor{clients: clients, done: make(chan struct{}), live: map[uint64]bool{},
		missing: map[[2]uint64]bool{}, dropClients: map[int]bool{}, listed: make([]map[uint64]bool, len(clients)),
		goneAt: make([]time.Time, len(clients)), seenAt: make([]time.Time, len(clients))}
	for _, w := range workers {
		m.live[w.ep.InstanceID()] = true
	}
	return m
}

func (m *viewMonitor) crashed(id uint64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, id)
	m.crashID, m.crashAt = id, at
}

func (m *viewMonitor) started(id uint64, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.newID, m.live[id], m.startAt = id, true, at
}

// times are when the worker crashed and when the new one started.
func (m *viewMonitor) times() (crash, start time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashAt, m.startAt
}

// run polls every client's view every 2 ms; a view is walked only when it
// changed (plane.InstanceSet.Same).
func (m *viewMonitor) run(stop <-chan struct{}) {
	defer close(m.done)
	prev := make([]plane.InstanceSet, len(m.clients))
	for {
		select {
		case <-stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		for i, c := range m.clients {
			cur := c.Current()
			if cur.Same(prev[i]) && m.listed[i] != nil {
				m.check(i, nil, time.Now())
				continue
			}
			prev[i] = cur
			ids := make(map[uint64]bool, len(cur.Instances()))
			for _, in := range cur.Instances() {
				ids[in.ID] = true
			}
			m.check(i, ids, time.Now())
		}
	}
}

// check records client i's view (ids; nil: unchanged) at now.
func (m *viewMonitor) check(i int, ids map[uint64]bool, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := ids != nil
	if changed {
		m.listed[i] = ids
	}
	ids = m.listed[i]
	for id := range m.live {
		if !changed {
			break // an unchanged view lost nothing
		}
		k := [2]uint64{uint64(i), id}
		switch {
		case !ids[id] && !m.missing[k] && (id != m.newID || !m.seenAt[i].IsZero()):
			m.missing[k] = true
			m.drops++
			m.dropClients[i] = true
			if m.firstDrop.IsZero() {
				m.firstDrop = now
			}
			m.lastDrop = now
		case ids[id] && m.missing[k]:
			delete(m.missing, k)
		}
	}
	if m.crashID != 0 && m.goneAt[i].IsZero() && !ids[m.crashID] {
		m.goneAt[i] = now
	}
	if m.newID != 0 && m.seenAt[i].IsZero() && ids[m.newID] {
		m.seenAt[i] = now
	}
}

// whole reports whether every client's view is whole (the crashed worker
// gone, the new one listed, no live one missing), and when the last client
// dropped the crashed worker and listed the new one.
func (m *viewMonitor) whole() (bool, time.Time, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashID == 0 || m.newID == 0 || len(m.missing) > 0 ||
		slices.ContainsFunc(m.goneAt, time.Time.IsZero) || slices.ContainsFunc(m.seenAt, time.Time.IsZero) {
		return false, time.Time{}, time.Time{}
	}
	last := func(ts []time.Time) time.Time { return slices.MaxFunc(ts, time.Time.Compare) }
	return true, last(m.goneAt), last(m.seenAt)
}

// report puts the false drops in nl, times counted from t0.
func (m *viewMonitor) report(nl *nodeLoss, t0 time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	nl.FalseDrops, nl.FalseDropClients = m.drops, len(m.dropClients)
	if m.drops > 0 {
		nl.FalseDropFirst, nl.FalseDropLast = m.firstDrop.Sub(t0).Seconds(), m.lastDrop.Sub(t0).Seconds()
	}
}

func (m *viewMonitor) wait() { <-m.done }
