package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/fakeengine"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/natsbus"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// config is one point of the simulation.
type config struct {
	Servers     int           // NATS cluster nodes
	Workers     int           // worker processes (runtimes serving the endpoint)
	Callers     int           // caller processes (frontends: a client and an abort subscription each)
	Concurrency int           // requests each caller keeps in flight in the request window
	Items       int           // items per request in the request window
	Heartbeat   time.Duration // lease heartbeat (0: discovery's default)
	TTL         time.Duration // lease TTL (0: discovery's default)
	Window      time.Duration // length of the idle window and of the request window
	KillTrials  int           // fan-out kills
	Fanout      int           // sub-requests of a fan-out kill (0: one to every other worker)
	Held        int           // streams held open at once over warm pairs: memory per stream, kill storm
	Conns       int           // new (caller, worker) pairs opened at once: memory per connection
	Crash       int           // workers that crash at once
	Drain       int           // workers that leave on purpose at once
	Wait        time.Duration // bound of every wait
	MemProfile  string        // where to write a heap profile while the Held streams are open ("": nowhere)
	JetStream   bool          // JetStream on the nodes: discovery by change (else by heartbeat)
	// FrontendRequests: completions timed through the frontend (frontendCost).
	FrontendRequests int
	// NodeLoss, when set, runs the idle window then kills one node
	// (lossFollower or lossLeader) instead of the other phases.
	NodeLoss string
}

func (c config) check() error {
	switch {
	case c.Servers < 1, c.Callers < 1, c.Concurrency < 1, c.Items < 1, c.Window <= 0, c.Wait <= 0, c.FrontendRequests < 1:
		return errors.New("servers, callers, concurrency, items, window, wait and frontend requests must be positive")
	case c.Workers < 2+c.Crash+c.Drain:
		return fmt.Errorf("%d workers: need at least 2 + crash (%d) + drain (%d)", c.Workers, c.Crash, c.Drain)
	case c.Crash < 1, c.Drain < 1, c.KillTrials < 1, c.Held < c.Callers, c.Conns < 0:
		return errors.New("crash, drain and kill trials must be at least 1, held at least one per caller, conns not negative")
	case c.NodeLoss != "" && c.NodeLoss != lossFollower && c.NodeLoss != lossLeader:
		return fmt.Errorf("node loss %q: %q or %q", c.NodeLoss, lossFollower, lossLeader)
	case c.Fanout < 0 || c.Fanout > c.Workers-1:
		return fmt.Errorf("fanout %d: at most workers-1 (%d)", c.Fanout, c.Workers-1)
	}
	return nil
}

// result is what one point measured. Times in milliseconds unless the name
// says otherwise; "per period" is per lease heartbeat interval.
type result struct {
	Servers int `json:"servers"`
	Workers int `json:"workers"`
	Callers int `json:"callers"`
	// Watchers: clients watching the endpoint (the callers and worker 0's).
	Watchers  int     `json:"watchers"`
	Heartbeat float64 `json:"heartbeat_s"`
	TTL       float64 `json:"ttl_s"`

	// Connections, at the end of the run.
	NATSClients      []int   `json:"nats_clients_per_server"`
	NATSRoutes       []int   `json:"nats_route_conns_per_server"`
	NATSConnsPerProc float64 `json:"nats_conns_per_process"`

	// Discovery, idle: per heartbeat period, and the size of one "up".
	DiscPubs      float64 `json:"discovery_pubs_per_period"`
	DiscDeliv     float64 `json:"discovery_deliveries_per_period"`
	DiscRoute     float64 `json:"discovery_route_msgs_per_period"`
	DiscBytesDeli float64 `json:"discovery_bytes_delivered_per_period"`
	UpBytes       float64 `json:"up_bytes"`
	// The CPU the whole simulation used while idle (in CPUs), and per
	// announcement delivered: NATS nodes, clients and watchers together.
	IdleCPU        float64 `json:"idle_cpus"`
	CPUPerDelivery float64 `json:"cpu_us_per_announcement_delivered"`
	// Everything delivered to clients (and forwarded between nodes) per
	// second while idle, whatever the subject: announcements, consumer
	// deliveries and heartbeats, acknowledgements of the stream.
	JetStream    bool    `json:"jetstream"`
	IdleDelivSec float64 `json:"idle_deliveries_per_s"`
	IdleRouteSec float64 `json:"idle_route_msgs_per_s"`
	IdlePubSec   float64 `json:"idle_client_pubs_per_s"`

	// Requests (Items items each) in the request window.
	Requests      int     `json:"requests"`
	RequestErrors int     `json:"request_errors"`
	ReqPerSec     float64 `json:"requests_per_s"`
	ReqP50        float64 `json:"request_p50_ms"`
	ReqP99        float64 `json:"request_p99_ms"`
	MsgsPub       float64 `json:"nats_pubs_per_request"`
	MsgsDeliv     float64 `json:"nats_deliveries_per_request"`
	MsgsRoute     float64 `json:"nats_route_msgs_per_request"`
	BytesPub      float64 `json:"nats_bytes_published_per_request"`
	// CPU per request, the idle CPU taken out: caller, worker and NATS.
	CPUPerRequest  float64 `json:"cpu_us_per_request"`
	Pairs          int     `json:"caller_worker_pairs_used"`
	PairCap        int     `json:"workers_per_caller_cap"` // see sim.pairCap
	StreamConnPeak int     `json:"stream_conns_peak"`
	StreamConnCall int     `json:"stream_conns_peak_per_caller"`
	// Open once every request of the window ended.
	StreamConnLeft     int     `json:"stream_conns_after"`
	StreamConnLeftCall int     `json:"stream_conns_after_per_caller"`
	TimeWaitPerReq     float64 `json:"time_wait_per_request"`

	// Kill fan-out: a request to worker 0 that fans out to KillHops-1 others.
	KillHops        int     `json:"kill_hops"`
	KillFailed      int     `json:"kill_subrequests_failed"` // never started, in all trials
	KillLastP50     float64 `json:"kill_last_hop_p50_ms"`
	KillLastMax     float64 `json:"kill_last_hop_max_ms"`
	KillHopP50      float64 `json:"kill_hop_p50_ms"`
	AbortConfirmP50 float64 `json:"abort_confirmations_all_callers_p50_ms"`
	// Per hop killed: its abort confirmation's deliveries and copies
	// between nodes.
	AbortDeliveries float64 `json:"abort_confirmation_deliveries_per_hop"`
	AbortRoute      float64 `json:"abort_confirmation_route_msgs_per_hop"`

	// Held streams: memory per stream and per connection (see
	// heldStreams), then all killed at once.
	Held           int     `json:"held_streams"`
	HeapPerStream  float64 `json:"heap_bytes_per_stream"`
	StackPerStream float64 `json:"stack_bytes_per_stream"`
	GorPerStream   float64 `json:"goroutines_per_stream"`
	FDsPerStream   float64 `json:"fds_per_stream"`
	ConnPairs      int     `json:"conn_pairs_measured"`
	HeapPerConn    float64 `json:"heap_bytes_per_connection"`
	StackPerConn   float64 `json:"stack_bytes_per_connection"`
	GorPerConn     float64 `json:"goroutines_per_connection"`
	FDsPerConn     float64 `json:"fds_per_connection"`
	HeldFailed     int     `json:"held_streams_failed"` // never started
	StormStreams   int     `json:"storm_streams"`
	StormLast      float64 `json:"storm_last_handler_ms"`
	StormConfirm   float64 `json:"storm_confirmations_all_callers_ms"`

	// Discovery convergence: time until every watcher stopped listing the
	// instance, after a crash (no "down") and after a drain ("down").
	CrashMin       float64 `json:"crash_converge_min_s"`
	CrashMax       float64 `json:"crash_converge_max_s"`
	DeadRequest    float64 `json:"request_to_crashed_ms"`
	DeadRequestErr string  `json:"request_to_crashed_error"`
	DrainMax       float64 `json:"drain_converge_max_ms"`

	// The frontend (go/frontend) in front of the workers: per completion,
	// the process's CPU and allocations less the idle rates (frontendCost).
	FrontendReqPerSec float64 `json:"frontend_requests_per_s"`
	FrontendCPUus     float64 `json:"frontend_cpu_us_per_request"`
	FrontendAllocs    float64 `json:"frontend_allocs_per_request"`
	FrontendBytes     float64 `json:"frontend_bytes_per_request"`
	FrontendIdleCPU   float64 `json:"frontend_idle_cpus"`

	// Routing: one pick of an instance (Client.Reserve, round robin).
	SnapshotUs    float64 `json:"instances_snapshot_us"`
	SnapshotBytes float64 `json:"instances_snapshot_bytes"`

	// NodeLoss: one node killed (config.NodeLoss), what followed.
	NodeLoss []*nodeLoss `json:"node_loss,omitempty"`

	// FirstError is the first error of a request that failed to start in
	// the kill fan-out or the held streams ("": none).
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"run_s"`
	// Errors are the phases that failed (their figures are missing).
	Errors []string `json:"errors,omitempty"`
}

const path = "sim.backend.generate"

// meta is a worker's instance metadata: a model card (go/modelcard) of the
// size a real worker announces (python/dynamo_ctx/cli/worker.py builds its
// card through the library), the checksum of its text files (simTokenizer)
// included.
var meta = cardJSON(modelcard.Card{
	Model: "sim-model", Mode: modelcard.Agg, MaxNumSeqs: 256, MaxModelLen: 8192, ModelPath: "/models/sim-model",
	TextChecksum: modelcard.Checksum(hfmodel.Files{hfmodel.TokenizerFile: simTokenizer}),
})

// cardJSON is a card's encoding; a card that breaks a rule is a bug here.
func cardJSON(c modelcard.Card) []byte {
	b, err := c.JSON()
	if err != nil {
		panic(err)
	}
	return b
}

// job is a request's payload: what the worker's handler does.
type job struct {
	Op      string   `json:"op"`                // "tokens", "hold" or "fan"
	N       int      `json:"n,omitempty"`       // tokens: items to send
	Trial   int      `json:"trial,omitempty"`   // hold, fan: the trial it belongs to
	Targets []uint64 `json:"targets,omitempty"` // fan: a sub-request to each
}

var tokenItem = []byte(`{"token_ids":[42],"text":" x"}`)

type worker struct {
	rt     *plane.Runtime
	ep     *plane.Endpoint
	client *plane.Client // worker 0 only: its fan-out requests
	port   int
	done   chan struct{} // the accept loop returned
}

type caller struct {
	idx    int
	rt     *plane.Runtime
	client *plane.Client
	unsub  func()
	port   int
}

type sim struct {
	cfg     config
	cl      *cluster
	m       *meter
	workers []*worker
	callers []*caller
	extra   []*worker    // started during the run (node loss), torn down with the others
	ports   map[int]bool // every stream server's port
	quiet   *slog.Logger // the runtimes' logger
	// upBytes is the size of an announcement, idleCPU the CPU this
	// process used while idle (in CPUs): see idle.
	upBytes, idleCPU float64

	mu     sync.Mutex
	trials map[int]*trial
	byKey  map[string]*trial // request key -> its trial, for abort confirmations
	next   int
}

// trial follows a set of held requests: when each handler started, when its
// context saw the kill, and when every hop's abort confirmation had reached
// the caller that sent it (the only one it goes to).
type trial struct {
	want int // handlers

	mu          sync.Mutex
	failed      int   // requests that never started (fail)
	firstErr    error // the first one's error
	keys        []string
	started     int
	startedCh   chan struct{}
	kills       []time.Time
	killedCh    chan struct{}
	confirms    int
	confirmedAt time.Time
	confirmedCh chan struct{}
}

func (s *sim) newTrial(want int) (int, *trial) {
	tr := &trial{want: want, startedCh: make(chan struct{}), killedCh: make(chan struct{}), confirmedCh: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.trials[s.next] = tr
	return s.next, tr
}

func (s *sim) endTrial(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if tr := s.trials[id]; tr != nil {
		tr.mu.Lock()
		for _, k := range tr.keys {
			delete(s.byKey, k)
		}
		tr.mu.Unlock()
	}
	delete(s.trials, id)
}

func (s *sim) trial(id int) *trial {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.trials[id]
}

// hold serves a request of a trial: it records the start, then holds the
// request, without a goroutine, until its context is killed, and records
// when that happened.
func (s *sim) hold(req *plane.Request, tr *trial) {
	s.mu.Lock()
	s.byKey[req.Key] = tr
	s.mu.Unlock()
	tr.mu.Lock()
	tr.keys = append(tr.keys, req.Key)
	tr.started++
	if tr.started == tr.want {
		close(tr.startedCh)
	}
	tr.mu.Unlock()
	req.Ctx.Notify(ctxtree.Killed, func() {
		now := time.Now()
		tr.mu.Lock()
		tr.kills = append(tr.kills, now)
		if len(tr.kills) == tr.want {
			close(tr.killedCh)
		}
		tr.mu.Unlock()
		req.Complete() // the handler returns: the worker confirms the abort
	})
}

// fail counts a request of the trial that never started: the trial waits
// for one handler less.
func (tr *trial) fail(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.failed++
	if tr.firstErr == nil {
		tr.firstErr = err
	}
	tr.want--
	if tr.started == tr.want {
		close(tr.startedCh)
	}
}

// confirmed counts an abort confirmation that reached a caller (idx: a
// caller's index; -1: worker 0, the caller of the fan-out's hops).
func (s *sim) confirmed(idx int, a plane.AbortConfirmation) {
	s.mu.Lock()
	tr := s.byKey[a.Key]
	s.mu.Unlock()
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.confirms++
	if tr.confirms == tr.want {
		tr.confirmedAt = time.Now()
		close(tr.confirmedCh)
	}
}

// serve is a worker's accept loop. Every handler is non-blocking, so it
// runs on the loop itself: no goroutine per request.
func (s *sim) serve(w *worker) {
	defer close(w.done)
	for {
		req, err := w.ep.Next(context.Background())
		if err != nil { // the endpoint closed
			return
		}
		var j job
		if err := json.Unmarshal(req.Payload, &j); err != nil {
			req.Fail("ValueError: " + err.Error())
			continue
		}
		switch j.Op {
		case "": // a token request, from the frontend: answered as the tests' engine does
			items, err := fakeengine.Answer(req.Payload)
			if err != nil {
				req.Fail("ValueError: " + err.Error())
				continue
			}
			_, _ = req.SendMany(items) // a few tokens: below the send buffer
			req.Complete()
		case "tokens":
			items := make([][]byte, j.N)
			for i := range items {
				items[i] = tokenItem
			}
			_, _ = req.SendMany(items) // N is below the send buffer: all taken
			req.Complete()
		case "hold", "fan":
			tr := s.trial(j.Trial)
			if tr == nil {
				req.Fail("KeyError: no trial " + strconv.Itoa(j.Trial))
				continue
			}
			if j.Op == "fan" {
				// Each sub-request's context is a child of this one: a kill
				// of this request reaches every one of them.
				sub := mustJSON(job{Op: "hold", Trial: j.Trial})
				subs := make([]*plane.Stream, 0, len(j.Targets))
				for _, id := range j.Targets {
					st, err := w.client.Generate(sub, req.Ctx, plane.Direct, id)
					if err != nil {
						tr.fail(err)
						continue
					}
					subs = append(subs, st)
				}
				go s.watchStarts(tr, subs)
			}
			s.hold(req, tr)
		default:
			req.Fail("ValueError: unknown op " + j.Op)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// newRuntime starts one simulated process: its own NATS connection to the
// cluster, its own stream server on a port we know.
func (s *sim) newRuntime(ctx context.Context, quiet *slog.Logger) (*plane.Runtime, int, error) {
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, 0, err
		}
		rt, err := plane.New(ctx, plane.Options{
			NATS:       natsbus.Options{URL: s.cl.urls, Name: "scalesim", Logger: quiet},
			StreamAddr: "127.0.0.1:" + strconv.Itoa(port),
			Heartbeat:  s.cfg.Heartbeat,
			TTL:        s.cfg.TTL,
		})
		if err == nil {
			return rt, port, nil
		}
		last = err // most likely the port was taken meanwhile: another
	}
	return nil, 0, last
}

// parallel runs f(0..n-1) on at most 8 goroutines and returns the first error.
func parallel(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first error
		mu    sync.Mutex
	)
	for range min(n, 8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// simulate runs one point: start the cluster and the processes, measure
// each phase in turn, tear everything down.
func simulate(cfg config, quiet *slog.Logger, progress func(string)) (res *result, err error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	begin := time.Now()
	cl, err := startCluster(cfg.Servers, cfg.JetStream, cfg.NodeLoss != "")
	if err != nil {
		return nil, err
	}
	s := &sim{cfg: cfg, cl: cl, quiet: quiet, ports: map[int]bool{}, trials: map[int]*trial{}, byKey: map[string]*trial{}}
	defer s.teardown()
	if s.m, err = newMeter(cl.urls); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Wait)
	defer cancel()

	progress(fmt.Sprintf("%d workers, %d callers: starting", cfg.Workers, cfg.Callers))
	s.workers = make([]*worker, cfg.Workers)
	err = parallel(cfg.Workers, func(i int) error {
		rt, port, err := s.newRuntime(ctx, quiet)
		if err != nil {
			return err
		}
		w := &worker{rt: rt, port: port, done: make(chan struct{})}
		s.workers[i] = w
		if w.ep, err = rt.Serve(path, meta); err != nil {
			close(w.done)
			return err
		}
		go s.serve(w)
		if i == 0 {
			if w.client, err = rt.Client(ctx, path); err == nil {
				// The caller of the fan-out's hops hears their confirmations
				// (unsubscribed when its runtime closes).
				_, err = rt.OnAbortConfirmed(func(a plane.AbortConfirmation) { s.confirmed(-1, a) })
			}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting workers: %w", err)
	}
	s.callers = make([]*caller, cfg.Callers)
	err = parallel(cfg.Callers, func(i int) error {
		rt, port, err := s.newRuntime(ctx, quiet)
		if err != nil {
			return err
		}
		c := &caller{idx: i, rt: rt, port: port}
		s.callers[i] = c
		if c.client, err = rt.Client(ctx, path); err != nil {
			return err
		}
		// As the frontend does (go/frontend): a caller hears the abort
		// confirmations of its requests.
		c.unsub, err = rt.OnAbortConfirmed(func(a plane.AbortConfirmation) { s.confirmed(i, a) })
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("starting callers: %w", err)
	}
	for _, w := range s.workers {
		s.ports[w.port] = true
	}
	for _, c := range s.callers {
		s.ports[c.port] = true
	}
	if err := s.waitListed(cfg.Workers); err != nil {
		return nil, err
	}

	res = &result{Servers: cfg.Servers, Workers: cfg.Workers, Callers: cfg.Callers, Watchers: len(s.watchers()),
		Heartbeat: s.heartbeat().Seconds(), TTL: s.ttl().Seconds()}
	steps := []struct {
		name string
		f    func(*result) error
	}{
		{"idle window", s.idle},
		{"held streams", s.heldStreams},
		{"kill fan-out", s.killFanout},
		{"request window", s.requests},
		{"routing snapshot", s.snapshot},
		{"frontend", s.frontendCost},
		{"crash and drain", s.converge},
	}
	if cfg.NodeLoss != "" {
		steps = steps[:1]
		steps = append(steps, struct {
			name string
			f    func(*result) error
		}{"node loss (" + cfg.NodeLoss + ")", s.nodeLoss})
	}
	// A phase that fails (a wait that ran out on a machine too small for the
	// point) is reported, and the next phases still run: their figures do
	// not depend on it.
	for _, st := range steps {
		progress(fmt.Sprintf("%d workers: %s", cfg.Workers, st.name))
		if err := st.f(res); err != nil {
			res.Errors = append(res.Errors, st.name+": "+err.Error())
		}
	}
	// Connections per node: the crashed workers' are gone, the drained
	// ones' are still there.
	res.NATSClients, res.NATSRoutes = cl.conns()
	total := 0
	for _, n := range res.NATSClients {
		total += n
	}
	// Every simulated process, crashed ones aside, plus the meter.
	res.NATSConnsPerProc = float64(total-1) / float64(cfg.Workers-cfg.Crash+cfg.Callers)
	res.Seconds = time.Since(begin).Seconds()
	return res, nil
}

func (s *sim) heartbeat() time.Duration {
	if s.cfg.Heartbeat > 0 {
		return s.cfg.Heartbeat
	}
	return time.Second // discovery.DefaultHeartbeat
}

func (s *sim) ttl() time.Duration {
	if s.cfg.TTL > 0 {
		return s.cfg.TTL
	}
	return 3 * time.Second // discovery.DefaultTTL
}

// watchers are the clients that route to the endpoint: every caller's and
// worker 0's.
func (s *sim) watchers() []*plane.Client {
	out := []*plane.Client{s.workers[0].client}
	for _, c := range s.callers {
		out = append(out, c.client)
	}
	return out
}

// waitListed waits until every watcher lists n instances.
func (s *sim) waitListed(n int) error {
	deadline := time.Now().Add(s.cfg.Wait)
	for _, c := range s.watchers() {
		for len(c.InstanceIDs()) != n {
			if time.Now().After(deadline) {
				return fmt.Errorf("a client lists %d instances, want %d", len(c.InstanceIDs()), n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func (s *sim) teardown() {
	// Callers first: the workers' "down" announcements then reach nobody.
	_ = parallel(len(s.callers), func(i int) error {
		if c := s.callers[i]; c != nil {
			if c.unsub != nil {
				c.unsub()
			}
			c.rt.Close()
		}
		return nil
	})
	s.mu.Lock()
	all := append(slices.Clone(s.workers), s.extra...)
	s.mu.Unlock()
	_ = parallel(len(all), func(i int) error {
		if w := all[i]; w != nil {
			w.rt.Close()
			<-w.done
		}
		return nil
	})
	if s.m != nil {
		s.m.close()
	}
	s.cl.shutdown()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (s *sim) await(ch <-chan struct{}, what string) error {
	select {
	case <-ch:
		return nil
	case <-time.After(s.cfg.Wait):
		return fmt.Errorf("timed out waiting for %s", what)
	}
}
