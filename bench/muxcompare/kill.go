package main

// Scenario 1: kill latency at scale.

import (
	"context"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

type killResult struct {
	name       string
	lat        []time.Duration
	rampMs     float64 // time to open the first -streams streams
	itemsPerS  float64 // items received per second while killing
	cores      float64 // process CPU while killing, in cores
	busy       float64 // the whole machine's busy CPU meanwhile, in cores
	errs       int64
	unobserved int // kills whose observation never arrived
}

// clock is the engine's step: every stream's goroutine waits for the same
// tick, so one step's items are produced together. next takes no lock, so
// a thousand goroutines reading it make no convoy of their own.
type clock struct {
	ch atomic.Pointer[chan struct{}]
}

func startClock(ctx context.Context, step time.Duration) *clock {
	c := &clock{}
	ch := make(chan struct{})
	c.ch.Store(&ch)
	go func() {
		t := time.NewTicker(step)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				next := make(chan struct{})
				close(*c.ch.Swap(&next))
			case <-ctx.Done():
				return
			}
		}
	}()
	return c
}

func (c *clock) next() <-chan struct{} { return *c.ch.Load() }

// killStream is one stream of the kill scenario as the harness sees it.
type killStream struct {
	c      callerStream
	live   atomic.Bool  // the caller received an item
	killAt atomic.Int64 // stopwatch: ns since base when the kill was issued, 0 if none
}

// runKill runs the kill scenario on m: streams on both sides (killRun's
// worker and caller slots), a ramp until every slot has a live stream, the
// kills and their observations, then the wind-down.
func runKill(m machinery) killResult {
	k := newKillRun(m)
	k.startWorkers()
	k.startCallers()
	// Ramp: wait until every slot has a live stream.
	for k.live.Load() < int64(k.n) && time.Since(k.base) < 30*time.Second {
		time.Sleep(time.Millisecond)
	}
	res := killResult{rampMs: float64(time.Since(k.base)) / 1e6}
	k.measure(&res)
	k.windDown()
	res.errs = k.errs.Load()
	return res
}

// killRun is one run of the kill scenario: what its worker side, its
// caller side and the harness share.
type killRun struct {
	m       machinery
	n, want int // streams, kills measured
	base    time.Time
	ctx     context.Context
	cancel  context.CancelFunc
	clk     *clock
	lat     chan time.Duration // kill -> observed, from the worker side
	items   atomic.Int64
	errs    atomic.Int64
	jobs    chan job // the dispatch channel (standing in for NATS)
	workers sync.WaitGroup
	slots   []atomic.Pointer[killStream] // each caller slot's current stream
	callers sync.WaitGroup
	live    atomic.Int64 // slots whose stream received an item
}

func newKillRun(m machinery) *killRun {
	n, want := *flagStreams, *flagKills
	ctx, cancel := context.WithCancel(context.Background())
	return &killRun{
		m: m, n: n, want: want, base: time.Now(), ctx: ctx, cancel: cancel, clk: startClock(ctx, *flagStep),
		lat: make(chan time.Duration, want+n), jobs: make(chan job, n), slots: make([]atomic.Pointer[killStream], n),
	}
}

// since is the stopwatch: ns since base.
func (k *killRun) since() int64 { return int64(time.Since(k.base)) }

// startWorkers starts the worker side: a dispatcher receives requests and
// runs each stream on its own goroutine (workerStream).
func (k *killRun) startWorkers() {
	k.workers.Add(1)
	go func() {
		defer k.workers.Done()
		for j := range k.jobs {
			k.workers.Add(1)
			go func() {
				defer k.workers.Done()
				k.workerStream(j)
			}()
		}
	}()
}

// workerStream opens j's stream and sends an item per clock step until the
// caller kills it (observed: the latency is sent on lat) or the run ends.
func (k *killRun) workerStream(j job) {
	w, err := k.m.Open(k.ctx, j.token)
	if err != nil {
		if k.ctx.Err() == nil {
			k.errs.Add(1)
		}
		return
	}
	observe := func() {
		if t := j.ks.killAt.Load(); t != 0 {
			k.lat <- time.Duration(k.since() - t)
		}
		w.Close()
	}
	for {
		select {
		case <-k.clk.next():
			if err := w.Send(item64); err != nil {
				if err == errKilled {
					observe()
				} else {
					w.Close()
				}
				return
			}
		case <-w.Killed():
			observe()
			return
		case <-k.ctx.Done():
			_ = w.Finish()
			return
		}
	}
}

// startCallers starts the caller side: n slots, each a goroutine that keeps
// one stream open, replacing it when it ends.
func (k *killRun) startCallers() {
	for i := range k.slots {
		k.callers.Add(1)
		go func() {
			defer k.callers.Done()
			for k.ctx.Err() == nil {
				tok := newToken()
				ks := &killStream{c: k.m.Expect(tok)}
				k.slots[i].Store(ks)
				k.jobs <- job{tok, ks}
				for {
					if _, err := ks.c.Recv(); err != nil {
						if err != errKilled && err != io.EOF && k.ctx.Err() == nil {
							k.errs.Add(1)
						}
						break
					}
					k.items.Add(1)
					if !ks.live.Load() {
						ks.live.Store(true)
						k.live.Add(1)
					}
				}
			}
		}()
	}
}

// measure kills live streams one at a time at random moments, collects
// the observations (for up to 5 s after the last kill), and the rates and
// CPU meanwhile.
func (k *killRun) measure(res *killResult) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 28))
	busy0, total0 := machineCPU()
	cpu0, t0, items0 := cpuTime(), time.Now(), k.items.Load()
	for killed := 0; killed < k.want; {
		time.Sleep(time.Duration(rng.Int64N(int64(2**flagGap) + 1)))
		for tries := 0; tries < 4*k.n; tries++ {
			ks := k.slots[rng.IntN(k.n)].Load()
			if ks == nil || !ks.live.Load() || ks.killAt.Load() != 0 {
				continue
			}
			ks.killAt.Store(k.since())
			ks.c.Kill()
			killed++
			break
		}
	}
	res.lat = make([]time.Duration, 0, k.want)
	deadline := time.After(5 * time.Second)
collect:
	for len(res.lat) < k.want {
		select {
		case d := <-k.lat:
			res.lat = append(res.lat, d)
		case <-deadline:
			break collect
		}
	}
	el := time.Since(t0)
	res.itemsPerS = float64(k.items.Load()-items0) / el.Seconds()
	res.cores = (cpuTime() - cpu0).Seconds() / el.Seconds()
	if busy1, total1 := machineCPU(); total1 > total0 {
		res.busy = (busy1 - busy0) / (total1 - total0) * float64(runtime.NumCPU())
	}
	res.unobserved = k.want - len(res.lat)
}

// windDown ends the run: workers finish on ctx, callers see the end; a
// stream whose worker has not opened yet is killed so its Recv returns.
func (k *killRun) windDown() {
	k.cancel()
	done := make(chan struct{})
	go func() { k.callers.Wait(); close(done) }()
	for stop := false; !stop; {
		for i := range k.slots {
			if ks := k.slots[i].Load(); ks != nil && !ks.live.Load() {
				ks.c.Kill()
			}
		}
		select {
		case <-done:
			stop = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	close(k.jobs)
	k.workers.Wait()
}

type job struct {
	token string
	ks    *killStream // the stopwatch; nil outside the kill scenario
}
