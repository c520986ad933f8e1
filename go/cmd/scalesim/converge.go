package main

// Routing and discovery: the cost of picking an instance, and how fast the
// clients drop a worker that crashed or drained.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// snapshot times the pick of an instance a routed request pays (a round
// robin Client.Reserve and its Release), and what it allocates (the
// process's allocations over the calls, so a little of the background's
// too). It reads the client's view of the instances, rebuilt only when they
// change: neither should grow with the workers.
func (s *sim) snapshot(res *result) error {
	c := s.callers[0].client
	const calls = 3000
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t0 := time.Now()
	for range calls {
		r, err := c.Reserve()
		if err != nil {
			return fmt.Errorf("no instance picked: %w", err)
		}
		r.Release()
	}
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&m1)
	res.SnapshotUs = float64(elapsed.Microseconds()) / calls
	res.SnapshotBytes = float64(m1.TotalAlloc-m0.TotalAlloc) / calls
	return nil
}

// converge crashes Crash workers (their NATS connections close without a
// "down": a process death) and measures the time from each crash until
// every watcher stopped listing the worker. The crashes are spread over one
// heartbeat period, so that they fall at different points between two
// announcements of the worker, as real crashes do. Then Drain others leave
// on purpose, at once (their leases say "down"), likewise.
func (s *sim) converge(res *result) error {
	crashed := s.workers[len(s.workers)-s.cfg.Crash:]
	drained := s.workers[len(s.workers)-s.cfg.Crash-s.cfg.Drain : len(s.workers)-s.cfg.Crash]

	ids := make([]uint64, len(crashed))
	for i, w := range crashed {
		ids[i] = w.ep.InstanceID()
	}
	crashedAt := make([]time.Time, len(crashed))
	var (
		wg      sync.WaitGroup
		deadErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, w := range crashed {
			if i > 0 {
				time.Sleep(s.heartbeat() / time.Duration(len(crashed)))
			}
			crashedAt[i] = time.Now()
			w.rt.Bus().Conn().Close() // a crash: no "down" is ever sent
		}
		// A request to a crashed instance, sent straight to it before its
		// lease expires: the server answers at once that nobody listens,
		// once every node knows (a node that still thinks a peer has the
		// subscription forwards the request there, where it is dropped, and
		// the acknowledgement timeout ends it).
		time.Sleep(20 * time.Millisecond)
		r0 := time.Now()
		st, err := s.callers[0].client.Generate(mustJSON(job{Op: "tokens", N: 1}), nil, plane.Direct, ids[len(ids)-1])
		if err != nil {
			deadErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Wait)
		_, err = st.Next(ctx)
		cancel()
		switch {
		case errors.Is(err, plane.ErrNoResponders):
			res.DeadRequestErr = "no responders"
		case errors.Is(err, plane.ErrNotAcknowledged):
			res.DeadRequestErr = "not acknowledged"
		default:
			deadErr = fmt.Errorf("a request to a crashed instance: %v, want no responders", err)
			return
		}
		res.DeadRequest = ms(time.Since(r0))
	}()
	gone, err := s.waitGone(ids, 10*time.Millisecond)
	wg.Wait()
	if err != nil {
		return err
	}
	if deadErr != nil {
		return deadErr
	}
	secs := make([]float64, len(ids))
	for i := range ids {
		secs[i] = gone[i].Sub(crashedAt[i]).Seconds()
	}
	res.CrashMin, res.CrashMax = slices.Min(secs), slices.Max(secs)

	ids = ids[:0]
	for _, w := range drained {
		ids = append(ids, w.ep.InstanceID())
	}
	drain, err := s.drainConverge(drained, ids)
	if err != nil {
		return err
	}
	res.DrainMax = drain
	// The clients themselves no longer list them either.
	_, err = s.waitGone(ids, 10*time.Millisecond)
	return err
}

// drainConverge drains workers at once and returns the milliseconds until
// every watcher had the "down" of each. A Client tells no one when its list
// changes, and polling every client's list (a copy of it) at 1,000 workers
// takes longer than a "down" takes to arrive. So, for the moment of the
// drain, each watcher's NATS connection gets a plain subscription to the
// announcements as well: it receives each message on the same connection,
// from the same read of the socket, as the client's own subscription, whose
// watcher drops the instance the moment its "down" arrives (go/discovery).
func (s *sim) drainConverge(drained []*worker, ids []uint64) (float64, error) {
	if s.cfg.JetStream {
		return s.drainPolled(drained, ids)
	}
	conns := []*plane.Runtime{s.workers[0].rt}
	for _, c := range s.callers {
		conns = append(conns, c.rt)
	}
	var (
		mu   sync.Mutex
		seen = map[[2]uint64]bool{} // (watcher, instance)
		left = len(conns) * len(ids)
		last time.Time
		done = make(chan struct{})
	)
	subs := make([]*nats.Subscription, 0, len(conns))
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	for wi, rt := range conns {
		sub, err := rt.Bus().Conn().Subscribe(annPrefix+path, func(m *nats.Msg) {
			var a struct {
				Op string `json:"op"`
				ID uint64 `json:"id"`
			}
			if json.Unmarshal(m.Data, &a) != nil || a.Op != "down" || !slices.Contains(ids, a.ID) {
				return
			}
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			k := [2]uint64{uint64(wi), a.ID}
			if !seen[k] {
				seen[k] = true
				left--
				if left == 0 {
					last = now
					close(done)
				}
			}
		})
		if err != nil {
			return 0, err
		}
		subs = append(subs, sub)
	}
	for _, rt := range conns {
		if err := rt.Bus().Conn().Flush(); err != nil {
			return 0, err
		}
	}
	t0 := drainAll(drained)
	if err := s.await(done, "every watcher to have every drained worker's \"down\""); err != nil {
		return 0, err
	}
	mu.Lock()
	defer mu.Unlock()
	return ms(last.Sub(t0)), nil
}

// waitGone polls every watcher (one after the other, pausing every round)
// until none lists any of ids, and returns, per id, when the last watcher
// stopped listing it: the poll that first found it gone there, so the
// resolution is a round of polls.
func (s *sim) waitGone(ids []uint64, pause time.Duration) ([]time.Time, error) {
	ws := s.watchers()
	goneAt := make([][]time.Time, len(ids)) // per id, per watcher
	for i := range goneAt {
		goneAt[i] = make([]time.Time, len(ws))
	}
	left := len(ids) * len(ws)
	deadline := time.Now().Add(s.cfg.Wait)
	for left > 0 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d (instance, watcher) pairs still listed", left)
		}
		for wi, c := range ws {
			listed := c.InstanceIDs()
			now := time.Now()
			for i, id := range ids {
				if goneAt[i][wi].IsZero() && !slices.Contains(listed, id) {
					goneAt[i][wi] = now
					left--
				}
			}
		}
		if pause > 0 {
			time.Sleep(pause)
		} else {
			runtime.Gosched()
		}
	}
	out := make([]time.Time, len(ids))
	for i, ts := range goneAt {
		out[i] = slices.MaxFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	}
	return out, nil
}

// drainPolled is drainConverge for discovery by change, where the "down"
// reaches watchers through their consumers: polled (waitGone), so the
// figure includes a round of polls.
func (s *sim) drainPolled(drained []*worker, ids []uint64) (float64, error) {
	t0 := drainAll(drained)
	gone, err := s.waitGone(ids, time.Millisecond)
	if err != nil {
		return 0, err
	}
	return ms(slices.MaxFunc(gone, func(a, b time.Time) int { return a.Compare(b) }).Sub(t0)), nil
}

// drainAll drains the workers at once and returns when it started; each
// Drain returns once the server has the "down".
func drainAll(drained []*worker) time.Time {
	var wg sync.WaitGroup
	t0 := time.Now()
	for _, w := range drained {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.ep.Drain()
		}()
	}
	wg.Wait()
	return t0
}
