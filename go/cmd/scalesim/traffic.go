package main

// What NATS carries: discovery while idle, and per request.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// idle measures the discovery traffic: in the idle window announcements
// are all there is, so every publish is one and their size is the bytes
// published per publish.
func (s *sim) idle(res *result) error {
	time.Sleep(s.heartbeat()) // every lease ticks once more after the watches' queries
	// Reading the counters of a large cluster takes a while: the window is
	// taken from the middle of one reading to the middle of the next.
	read := func() (counts, time.Time, error) {
		t := time.Now()
		c, err := s.cl.counts()
		return c, t.Add(time.Since(t) / 2), err
	}
	before, t0, err := read()
	if err != nil {
		return err
	}
	cpu0 := cpuTime()
	time.Sleep(s.cfg.Window)
	after, t1, err := read()
	if err != nil {
		return err
	}
	cpu := cpuTime() - cpu0
	d := after.minus(before)
	secs := t1.Sub(t0).Seconds()
	res.JetStream = s.cfg.JetStream
	res.IdleDelivSec = float64(d.deliv()) / secs
	res.IdleRouteSec = float64(d.route()) / secs
	res.IdlePubSec = float64(d.inClient) / secs
	if s.cfg.JetStream {
		// No announcement to anyone: the heartbeats go to the stream.
		s.upBytes = 0
		s.idleCPU = float64(cpu) / float64(t1.Sub(t0))
		res.IdleCPU = s.idleCPU
		return nil
	}
	if d.announcements == 0 || d.inClient == 0 {
		return errors.New("no announcement in the idle window")
	}
	periods := float64(t1.Sub(t0)) / float64(s.heartbeat())
	s.upBytes = float64(d.inClientB) / float64(d.inClient)
	res.UpBytes = s.upBytes
	res.DiscPubs = float64(d.announcements) / periods
	res.DiscDeliv = float64(d.annDeliv) / periods
	res.DiscRoute = float64(d.annRoute) / periods
	res.DiscBytesDeli = res.DiscDeliv * s.upBytes
	s.idleCPU = float64(cpu) / float64(t1.Sub(t0))
	res.IdleCPU = s.idleCPU
	// Everything the process did while idle, per announcement delivered
	// (the meter's copies included: it is a subscriber like the others).
	res.CPUPerDelivery = float64(cpu.Microseconds()) / float64(d.annDeliv+d.announcements)
	return nil
}

// requests measures the request window: the callers send requests for
// Window (load), the stream connections are sampled meanwhile
// (watchSockets), and the traffic per request is what NATS's counters grew
// by, less the window's announcements (requestResults).
func (s *sim) requests(res *result) error {
	settle := min(500*time.Millisecond, s.cfg.Window/4)
	time.Sleep(settle) // what the phase before sent has landed
	_, tw0, sockErr := streamSockets(s.ports)
	// Each caller sends its requests round robin over every worker, unless
	// the connections that would leave open do not fit in this process's
	// descriptors (each pair's connection outlives its requests, and both
	// its ends are here): then over a share of them of its own, its turn
	// taken after reading the client's list as every pick does.
	share := s.pairCap()
	res.PairCap = share
	before, err := s.cl.counts()
	if err != nil {
		return err
	}
	cpu0, t0 := cpuTime(), time.Now()
	l := s.startLoad(share)
	callerPorts := map[int]bool{}
	for _, c := range s.callers {
		callerPorts[c.port] = true
	}
	peak, peakCaller, sockErr := s.watchSockets(callerPorts, sockErr)
	l.stop.Store(true)
	l.wg.Wait()
	// The replies of the last requests land before the counters are read.
	time.Sleep(settle)
	cpu, elapsed := cpuTime()-cpu0, time.Since(t0)
	after, err := s.cl.counts()
	if err != nil {
		return err
	}
	est, tw1, err := streamSockets(s.ports)
	if sockErr == nil {
		sockErr = err
	}
	// What stays open once the requests are done: connections that
	// outlive their streams.
	left, leftCaller := 0, 0
	for p, n := range est {
		left += n
		if callerPorts[p] {
			leftCaller = max(leftCaller, n)
		}
	}
	n := len(l.lats)
	if n == 0 {
		return fmt.Errorf("no request completed (%d errors)", l.errs)
	}
	s.requestResults(res, after.minus(before), l, cpu, elapsed)
	if sockErr == nil {
		res.StreamConnPeak, res.StreamConnCall = peak, peakCaller
		res.StreamConnLeft, res.StreamConnLeftCall = left, leftCaller
		// Never below 0: TIME_WAIT sockets of earlier requests (60 s)
		// may expire during the window.
		res.TimeWaitPerReq = max(0, float64(tw1-tw0)/float64(n))
	} else {
		res.StreamConnPeak, res.StreamConnCall, res.StreamConnLeft, res.StreamConnLeftCall, res.TimeWaitPerReq = -1, -1, -1, -1, -1
	}
	return nil
}

// load is the request window's traffic: Concurrency goroutines per caller,
// each sending one request after another until stop, and what they
// measured.
type load struct {
	stop  atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	lats  []time.Duration
	errs  int
	pairs map[[2]uint64]bool // the (caller, worker) pairs that served a request
}

// startLoad starts the callers' requests, each caller over share workers
// of its own (every worker, round robin, when share is all of them).
func (s *sim) startLoad(share int) *load {
	l := &load{pairs: map[[2]uint64]bool{}}
	payload := mustJSON(job{Op: "tokens", N: s.cfg.Items})
	for _, c := range s.callers {
		var (
			mine []uint64
			turn atomic.Uint64
		)
		if share < len(s.workers) {
			for k := range share {
				mine = append(mine, s.workers[(c.idx*share+k)%len(s.workers)].ep.InstanceID())
			}
		}
		for range s.cfg.Concurrency {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for !l.stop.Load() {
					t0 := time.Now()
					route, to := plane.RoundRobin, uint64(0)
					if mine != nil {
						if r, err := c.client.Reserve(); err == nil { // the pick a routed request pays
							r.Release()
						}
						route, to = plane.Direct, mine[(turn.Add(1)-1)%uint64(len(mine))]
					}
					inst, err := s.oneRequest(c.client, payload, s.cfg.Items, route, to)
					lat := time.Since(t0)
					l.mu.Lock()
					if err != nil {
						l.errs++
					} else {
						l.lats = append(l.lats, lat)
						l.pairs[[2]uint64{uint64(c.idx), inst}] = true
					}
					l.mu.Unlock()
				}
			}()
		}
	}
	return l
}

// watchSockets samples the established stream connections for Window: the
// peak of them all, and of one caller's. Once a sample fails (sockErr), it
// only waits.
func (s *sim) watchSockets(callerPorts map[int]bool, sockErr error) (peak, peakCaller int, _ error) {
	end := time.Now().Add(s.cfg.Window)
	for time.Now().Before(end) {
		time.Sleep(min(250*time.Millisecond, s.cfg.Window/5))
		if sockErr != nil {
			continue
		}
		est, _, err := streamSockets(s.ports)
		if err != nil {
			sockErr = err
			continue
		}
		total := 0
		for p, n := range est {
			total += n
			if callerPorts[p] && n > peakCaller {
				peakCaller = n
			}
		}
		peak = max(peak, total)
	}
	return peak, peakCaller, sockErr
}

// requestResults fills res with the window's traffic per request (d: what
// the counters grew by), its CPU beyond idle, and the latencies.
func (s *sim) requestResults(res *result, d counts, l *load, cpu, elapsed time.Duration) {
	n := len(l.lats)
	// Publishes and bytes: the window's announcements taken out (the
	// meter counted them; their size is the idle window's).
	res.Requests, res.RequestErrors = n, l.errs
	res.ReqPerSec = float64(n) / s.cfg.Window.Seconds()
	res.MsgsPub = float64(d.inClient-d.announcements) / float64(n)
	res.MsgsDeliv = float64(d.reqDeliv+d.replyDeliv) / float64(n)
	res.MsgsRoute = float64(d.reqRoute+d.replyRoute) / float64(n)
	res.BytesPub = (float64(d.inClientB) - float64(d.announcements)*s.upBytes) / float64(n)
	res.CPUPerRequest = (float64(cpu) - s.idleCPU*float64(elapsed)) / float64(n) / float64(time.Microsecond)
	slices.Sort(l.lats)
	res.ReqP50 = ms(l.lats[n/2])
	res.ReqP99 = ms(l.lats[n*99/100])
	res.Pairs = len(l.pairs)
}

// pairCap is how many workers each caller may send to in the request
// window: all of them, unless the connections would not fit in the file
// descriptors left (see requests).
func (s *sim) pairCap() int {
	runtimes := len(s.workers) + len(s.callers)
	// Each runtime: its NATS connection (both ends) and its listener; the
	// connections of the held streams and of the kill fan-out, which stay
	// open; a margin.
	used := 3*runtimes + 2*(s.cfg.Conns+len(s.callers)) + 2*len(s.workers) + 1000
	free := fdLimit()*9/10 - used
	return max(1, min(len(s.workers), free/2/len(s.callers)))
}

// oneRequest sends payload (by route), reads its want items to the end, and returns
// the instance that served it.
func (s *sim) oneRequest(c *plane.Client, payload []byte, want int, route plane.Route, inst uint64) (uint64, error) {
	st, err := c.Generate(payload, nil, route, inst)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Wait)
	defer cancel()
	got := 0
	for {
		_, err := st.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			st.Kill()
			return 0, err
		}
		got++
	}
	if got != want {
		return 0, fmt.Errorf("%d items, want %d", got, want)
	}
	return st.Instance(), nil
}
