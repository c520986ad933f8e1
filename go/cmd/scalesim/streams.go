package main

// Streams: a kill that fans out, memory per stream and per connection, a
// kill storm.

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// watchStarts records the sub-requests of a trial that fail before they
// start, so that the trial does not wait for them.
func (s *sim) watchStarts(tr *trial, subs []*plane.Stream) {
	for _, st := range subs {
		if err := waitStarted(st, s.cfg.Wait); err != nil {
			tr.fail(err)
		}
	}
}

// waitStarted waits until the request of st reached its worker (nil) or
// failed before that (its error).
func waitStarted(st *plane.Stream, limit time.Duration) error {
	timeout := time.After(limit)
	for {
		err := st.Started()
		if !errors.Is(err, plane.ErrAgain) {
			return err
		}
		ch := make(chan struct{}, 1)
		st.Arm(func() {
			select {
			case ch <- struct{}{}:
			default:
			}
		})
		select {
		case <-ch:
		case <-timeout:
			return errors.New("timed out waiting for the request to start")
		}
	}
}

// killFanout: caller 0 sends a request to worker 0, whose handler sends a
// sub-request (a child of its request's context) to each of Fanout other
// workers; once every hop's handler runs, caller 0 kills its request. The
// kill reaches worker 0 over its stream, and from there each sub-request
// over its own. Measured from the kill: when each hop's context saw it, and
// when every caller had every hop's abort confirmation.
func (s *sim) killFanout(res *result) error {
	fan := s.cfg.Fanout
	if fan == 0 {
		fan = s.cfg.Workers - 1
	}
	targets := make([]uint64, fan)
	for i := range targets {
		targets[i] = s.workers[1+i].ep.InstanceID()
	}
	hops := fan + 1
	var last, all, confirm []float64
	before, err := s.cl.counts()
	if err != nil {
		return err
	}
	killed := 0
	for range s.cfg.KillTrials {
		id, tr := s.newTrial(hops)
		st, err := s.callers[0].client.Generate(mustJSON(job{Op: "fan", Trial: id, Targets: targets}), nil,
			plane.Direct, s.workers[0].ep.InstanceID())
		if err != nil {
			return err
		}
		if err := s.await(tr.startedCh, "every hop to start"); err != nil {
			st.Kill()
			return err
		}
		time.Sleep(20 * time.Millisecond) // let the start's traffic settle
		t0 := time.Now()
		st.Kill()
		if err := s.await(tr.killedCh, "every hop to see the kill"); err != nil {
			return err
		}
		if err := s.await(tr.confirmedCh, "every abort confirmation at its caller"); err != nil {
			return err
		}
		tr.mu.Lock()
		res.KillFailed += tr.failed
		if tr.firstErr != nil && res.FirstError == "" {
			res.FirstError = tr.firstErr.Error()
		}
		var hopMs []float64
		for _, k := range tr.kills {
			hopMs = append(hopMs, ms(k.Sub(t0)))
		}
		confirm = append(confirm, ms(tr.confirmedAt.Sub(t0)))
		tr.mu.Unlock()
		killed += len(hopMs)
		slices.Sort(hopMs)
		last = append(last, hopMs[len(hopMs)-1])
		all = append(all, hopMs...)
		s.endTrial(id)
	}
	res.KillHops = hops
	res.KillLastP50 = median(last)
	res.KillLastMax = slices.Max(last)
	res.KillHopP50 = median(all)
	res.AbortConfirmP50 = median(confirm)
	after, err := s.cl.counts()
	if err != nil {
		return err
	}
	d := after.minus(before)
	res.AbortDeliveries = float64(d.abortDeliv) / float64(killed)
	res.AbortRoute = float64(d.abortRoute) / float64(killed)
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	w := slices.Clone(v)
	slices.Sort(w)
	return w[len(w)/2]
}

// heldStreams measures what streams and connections hold: Go heap and
// goroutine stacks after a collection, goroutines and file descriptors.
// Both ends of each stream are in this process, so each figure is a
// caller's side plus a worker's side.
//
//  1. Per stream: each caller first sends one request to "its" worker
//     (caller i to worker i mod workers), so that a connection that
//     outlives a request is open; then Held streams are opened over those
//     pairs and held, and the difference is divided by Held.
//  2. Per connection: then one stream is held on each of up to Conns pairs
//     not used before (each caller to each other worker, in turn); the
//     difference, less a stream's share, is divided by their number.
//
// It runs before the request window, while no other pair is in use. Then
// every caller kills all its streams at once: the time until every handler
// saw its kill, and until every caller had every abort confirmation.
func (s *sim) heldStreams(res *result) error {
	C, W := len(s.callers), len(s.workers)
	home := func(i int) uint64 { return s.workers[i%W].ep.InstanceID() }
	warm := mustJSON(job{Op: "tokens", N: 1})
	for i, c := range s.callers {
		if _, err := s.oneRequest(c.client, warm, 1, plane.Direct, home(i)); err != nil {
			return fmt.Errorf("warming pair %d: %w", i, err)
		}
	}
	// How many new pairs: each caller's others, up to Conns in all.
	perCaller := min(W-1, (s.cfg.Conns+C-1)/C)
	pairs := C * perCaller
	id, tr := s.newTrial(s.cfg.Held + pairs)
	defer s.endTrial(id)
	payload := mustJSON(job{Op: "hold", Trial: id})
	streams := make([][]*plane.Stream, C)
	open := func(ci int, inst uint64) error {
		st, err := s.callers[ci].client.Generate(payload, nil, plane.Direct, inst)
		if err == nil {
			streams[ci] = append(streams[ci], st)
		}
		return err
	}
	waitAll := func(n int) error {
		deadline := time.Now().Add(s.cfg.Wait)
		for {
			tr.mu.Lock()
			started := tr.started + tr.failed
			tr.mu.Unlock()
			if started >= n {
				time.Sleep(100 * time.Millisecond) // the last streams' goroutines settle
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d held streams started", started, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	m0 := memNow()
	for i := range s.cfg.Held {
		if err := open(i%C, home(i%C)); err != nil {
			return err
		}
	}
	go s.watchStarts(tr, slices.Concat(streams...))
	if err := waitAll(s.cfg.Held); err != nil {
		return err
	}
	m1 := memNow()
	if s.cfg.MemProfile != "" {
		if err := writeHeapProfile(s.cfg.MemProfile); err != nil {
			return err
		}
	}
	perStream := m1.minus(m0).per(s.cfg.Held)
	res.Held = s.cfg.Held
	res.HeapPerStream, res.StackPerStream = perStream.heap, perStream.stack
	res.GorPerStream, res.FDsPerStream = perStream.goroutines, perStream.fds
	if pairs > 0 {
		for i := range C {
			for k := 1; k <= perCaller; k++ {
				if err := open(i, home(i+k)); err != nil {
					return err
				}
			}
		}
		var fresh []*plane.Stream
		for _, ss := range streams {
			fresh = append(fresh, ss[len(ss)-perCaller:]...)
		}
		go s.watchStarts(tr, fresh)
		if err := waitAll(s.cfg.Held + pairs); err != nil {
			return err
		}
		perConn := memNow().minus(m1).per(pairs)
		res.ConnPairs = pairs
		res.HeapPerConn = perConn.heap - perStream.heap
		res.StackPerConn = perConn.stack - perStream.stack
		res.GorPerConn = perConn.goroutines - perStream.goroutines
		res.FDsPerConn = perConn.fds - perStream.fds
	}

	t0 := time.Now()
	var wg sync.WaitGroup
	for _, ss := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, st := range ss {
				st.Kill()
			}
		}()
	}
	wg.Wait()
	if err := s.await(tr.killedCh, "every held stream's handler to see its kill"); err != nil {
		return err
	}
	if err := s.await(tr.confirmedCh, "every abort confirmation of the storm at its caller"); err != nil {
		return err
	}
	tr.mu.Lock()
	res.HeldFailed = tr.failed
	if tr.firstErr != nil {
		res.FirstError = tr.firstErr.Error()
	}
	res.StormStreams = tr.want
	res.StormLast = ms(slices.MaxFunc(tr.kills, func(a, b time.Time) int { return a.Compare(b) }).Sub(t0))
	res.StormConfirm = ms(tr.confirmedAt.Sub(t0))
	tr.mu.Unlock()
	return nil
}

// mem is what memNow reads.
type mem struct{ heap, stack, goroutines, fds float64 }

func (m mem) minus(o mem) mem {
	return mem{m.heap - o.heap, m.stack - o.stack, m.goroutines - o.goroutines, m.fds - o.fds}
}

func (m mem) per(n int) mem {
	d := float64(n)
	return mem{m.heap / d, m.stack / d, m.goroutines / d, m.fds / d}
}

// writeHeapProfile writes the heap profile (what is live at the last
// collection) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// memNow is the heap that a collection found live (not what was allocated
// since: under load that is megabytes of fresh garbage), the goroutine
// stacks, the number of goroutines, and of open file descriptors (Linux; 0
// elsewhere).
func memNow() mem {
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fds := 0
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	return mem{float64(live[0].Value.Uint64()), float64(m.StackInuse), float64(runtime.NumGoroutine()), float64(fds)}
}
