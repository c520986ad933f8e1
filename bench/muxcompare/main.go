// Command muxcompare measures ways to carry many response streams between
// one worker process and one caller process (issue 28, item 2): hashicorp/yamux,
// xtaci/smux and gRPC bidi streams, each over one long-lived TCP connection,
// against the project's own transport (today one TCP connection per stream).
//
// Everything runs in this one process over loopback TCP. The worker side and
// the caller side are separate groups of goroutines that share nothing but
// the machinery under test, a dispatch channel (standing in for NATS: the
// caller registers a stream's token, then "sends the request" that carries
// it) and, in the kill scenario, a stopwatch per stream. Each worker stream
// and each caller stream runs on its own goroutine, as in a deployment.
//
// Scenarios, the same for each machinery:
//
//  1. kill: -streams concurrent streams, each worker stream sending one
//     64-byte item per -step (one engine step for all streams); the caller
//     kills live streams one at a time at random moments and replaces each
//     with a new one. Measured: kill -> the worker stream observes it.
//  2. throughput: 64 streams x 200 items of 64 bytes as fast as possible,
//     repeated for -seconds: items/s and process CPU (user+sys) per item.
//  3. short: open, 2 items, end, 32 at a time for -seconds: streams/s and
//     the new TCP connections the kernel counted.
//
// Each adapter (the code written to give a machinery the project's stream
// contract: items in order, an end marker, stop, kill with "no item after
// kill", credit) lives in its own file; its lines of code are counted from
// the sources embedded in the binary.
package main

import (
	"bufio"
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

//go:embed *.go
var sources embed.FS

var (
	flagStreams = flag.Int("streams", 1000, "kill scenario: concurrent streams")
	flagKills   = flag.Int("kills", 500, "kill scenario: kills measured")
	flagStep    = flag.Duration("step", 10*time.Millisecond, "kill scenario: one item per stream per step")
	flagGap     = flag.Duration("killgap", 4*time.Millisecond, "kill scenario: mean gap between kills (uniform in [0, 2*gap])")
	flagSeconds = flag.Float64("seconds", 5, "throughput and short scenarios: duration of each")
	flagOnly    = flag.String("only", "", "comma-separated machineries to run (default: all)")
	flagCheck   = flag.Bool("check", true, "check each adapter's stop/kill/end semantics before measuring")
)

// The stream contract every adapter provides.

var (
	errKilled = errors.New("stream killed")
	errLost   = errors.New("stream lost")
)

// endErr is why a worker's stream already ended: killed, or else lost (or
// finished before).
func endErr(killed <-chan struct{}) error {
	select {
	case <-killed:
		return errKilled
	default:
		return errLost
	}
}

// A machinery carries streams from workers to callers. Expect is the caller's
// side (register a token before dispatching the request that carries it);
// Open is the worker's (open the stream the caller expects under token).
type machinery interface {
	Expect(token string) callerStream
	Open(ctx context.Context, token string) (workerStream, error)
	Close()
}

// callerStream is the caller's side of one stream. Recv is called from one
// goroutine; Stop and Kill from any.
type callerStream interface {
	// Recv returns the next item, io.EOF after the worker's Finish,
	// errKilled after Kill (at once: buffered items are dropped), or
	// another error if the stream broke.
	Recv() ([]byte, error)
	Stop()
	Kill()
}

// workerStream is the worker's side of one stream, used by one goroutine.
type workerStream interface {
	// Send sends one item; it fails with errKilled once the caller killed
	// the stream, with another error once the stream is otherwise gone.
	Send(item []byte) error
	Finish() error
	Stopped() <-chan struct{}
	Killed() <-chan struct{}
	// Close releases a stream that was killed or that the worker abandons.
	Close()
}

// entry describes one machinery.
type entry struct {
	name  string
	files []string // the adapter's sources, for the line count
	// kill: can a kill overtake data already queued on the connection? From
	// the library's documentation and write path, not measured here.
	kill  string
	start func() (machinery, error)
}

var machineries = []entry{
	{"yamux", []string{"yamux.go", "bytestream.go"}, yamuxKillNote, startYamux},
	{"smux", []string{"smux.go", "bytestream.go"}, smuxKillNote, startSmux},
	{"grpc", []string{"grpc.go"}, grpcKillNote, startGRPC},
	{"ours-conn", []string{"ours.go"}, oursKillNote, startOurs},
	{"ours-mux", []string{"ours.go"}, oursMuxKillNote, startOursMux},
}

var item64 = []byte(strings.Repeat("x", 64))

func main() {
	flag.Parse()
	var only map[string]bool
	if *flagOnly != "" {
		only = map[string]bool{}
		for _, n := range strings.Split(*flagOnly, ",") {
			only[strings.TrimSpace(n)] = true
		}
	}
	fmt.Printf("muxcompare: %s, GOMAXPROCS=%d, -streams %d -kills %d -step %v -killgap %v -seconds %g\n\n",
		runtime.Version(), runtime.GOMAXPROCS(0), *flagStreams, *flagKills, *flagStep, *flagGap, *flagSeconds)

	var kills []killResult
	var thrus []thruResult
	var shorts []shortResult
	var ran []entry
	for _, e := range machineries {
		if only != nil && !only[e.name] {
			continue
		}
		m, err := e.start()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: start: %v\n", e.name, err)
			os.Exit(1)
		}
		if *flagCheck {
			if err := check(m); err != nil {
				fmt.Fprintf(os.Stderr, "%s: check: %v\n", e.name, err)
				os.Exit(1)
			}
		}
		fmt.Fprintf(os.Stderr, "%s: kill scenario...\n", e.name)
		k := runKill(m)
		k.name = e.name
		fmt.Fprintf(os.Stderr, "%s: throughput scenario...\n", e.name)
		t := runThroughput(m)
		t.name = e.name
		fmt.Fprintf(os.Stderr, "%s: short-stream scenario...\n", e.name)
		s := runShort(m)
		s.name = e.name
		m.Close()
		kills, thrus, shorts, ran = append(kills, k), append(thrus, t), append(shorts, s), append(ran, e)
		runtime.GC()
		time.Sleep(200 * time.Millisecond) // let the previous machinery's goroutines wind down
	}
	printKill(kills)
	printThroughput(thrus)
	printShort(shorts)
	printAdapters(ran)
}

// check runs each part of the contract once: items then end, stop, kill.
func check(m machinery) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type opened struct {
		w   workerStream
		err error
	}
	open := func() (callerStream, workerStream, error) {
		tok := newToken()
		c := m.Expect(tok)
		ch := make(chan opened, 1)
		go func() { w, err := m.Open(ctx, tok); ch <- opened{w, err} }()
		o := <-ch
		return c, o.w, o.err
	}
	wait := func(ch <-chan struct{}, what string) error {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s: timed out", what)
		}
	}
	// Items in order, then the end.
	c, w, err := open()
	if err != nil {
		return err
	}
	for i := range 3 {
		if err := w.Send([]byte{byte(i)}); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	if err := w.Finish(); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	for i := range 3 {
		b, err := c.Recv()
		if err != nil || len(b) != 1 || b[0] != byte(i) {
			return fmt.Errorf("recv %d: %q %v", i, b, err)
		}
	}
	if _, err := c.Recv(); err != io.EOF {
		return fmt.Errorf("end: got %v, want io.EOF", err)
	}
	// Stop: the worker hears it, finishes, the caller gets the end.
	c, w, err = open()
	if err != nil {
		return err
	}
	if err := w.Send(item64); err != nil {
		return err
	}
	if _, err := c.Recv(); err != nil {
		return err
	}
	c.Stop()
	if err := wait(w.Stopped(), "stop"); err != nil {
		return err
	}
	if err := w.Finish(); err != nil {
		return fmt.Errorf("finish after stop: %w", err)
	}
	if _, err := c.Recv(); err != io.EOF {
		return fmt.Errorf("end after stop: got %v, want io.EOF", err)
	}
	// Kill: buffered items are dropped, the worker hears it, Send fails.
	c, w, err = open()
	if err != nil {
		return err
	}
	for range 4 {
		if err := w.Send(item64); err != nil {
			return err
		}
	}
	if _, err := c.Recv(); err != nil {
		return err
	}
	c.Kill()
	if _, err := c.Recv(); err != errKilled {
		return fmt.Errorf("recv after kill: got %v, want errKilled", err)
	}
	if err := wait(w.Killed(), "kill"); err != nil {
		return err
	}
	if err := w.Send(item64); err != errKilled {
		return fmt.Errorf("send after kill: got %v, want errKilled", err)
	}
	w.Close()
	return nil
}

// Scenario 1: kill latency at scale.

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

type job struct {
	token string
	ks    *killStream // the stopwatch; nil outside the kill scenario
}

func runKill(m machinery) killResult {
	n, want := *flagStreams, *flagKills
	base := time.Now()
	since := func() int64 { return int64(time.Since(base)) }
	ctx, cancel := context.WithCancel(context.Background())
	clk := startClock(ctx, *flagStep)
	lat := make(chan time.Duration, want+n)
	var items, errs atomic.Int64

	// Worker side: a dispatcher receives requests and runs each stream on
	// its own goroutine.
	jobs := make(chan job, n)
	var workers sync.WaitGroup
	workers.Add(1)
	go func() {
		defer workers.Done()
		for j := range jobs {
			workers.Add(1)
			go func() {
				defer workers.Done()
				w, err := m.Open(ctx, j.token)
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
					}
					return
				}
				observe := func() {
					if t := j.ks.killAt.Load(); t != 0 {
						lat <- time.Duration(since() - t)
					}
					w.Close()
				}
				for {
					select {
					case <-clk.next():
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
					case <-ctx.Done():
						_ = w.Finish()
						return
					}
				}
			}()
		}
	}()

	// Caller side: n slots, each a goroutine that keeps one stream open,
	// replacing it when it ends.
	slots := make([]atomic.Pointer[killStream], n)
	var callers sync.WaitGroup
	var live atomic.Int64
	for i := range slots {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for ctx.Err() == nil {
				tok := newToken()
				ks := &killStream{c: m.Expect(tok)}
				slots[i].Store(ks)
				jobs <- job{tok, ks}
				for {
					if _, err := ks.c.Recv(); err != nil {
						if err != errKilled && err != io.EOF && ctx.Err() == nil {
							errs.Add(1)
						}
						break
					}
					items.Add(1)
					if !ks.live.Load() {
						ks.live.Store(true)
						live.Add(1)
					}
				}
			}
		}()
	}

	// Ramp: wait until every slot has a live stream.
	for live.Load() < int64(n) && time.Since(base) < 30*time.Second {
		time.Sleep(time.Millisecond)
	}
	res := killResult{rampMs: float64(time.Since(base)) / 1e6}

	// Kill live streams one at a time at random moments.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 28))
	busy0, total0 := machineCPU()
	cpu0, t0, items0 := cpuTime(), time.Now(), items.Load()
	for k := 0; k < want; {
		time.Sleep(time.Duration(rng.Int64N(int64(2**flagGap) + 1)))
		for tries := 0; tries < 4*n; tries++ {
			ks := slots[rng.IntN(n)].Load()
			if ks == nil || !ks.live.Load() || ks.killAt.Load() != 0 {
				continue
			}
			ks.killAt.Store(since())
			ks.c.Kill()
			k++
			break
		}
	}
	res.lat = make([]time.Duration, 0, want)
	deadline := time.After(5 * time.Second)
collect:
	for len(res.lat) < want {
		select {
		case d := <-lat:
			res.lat = append(res.lat, d)
		case <-deadline:
			break collect
		}
	}
	el := time.Since(t0)
	res.itemsPerS = float64(items.Load()-items0) / el.Seconds()
	res.cores = (cpuTime() - cpu0).Seconds() / el.Seconds()
	if busy1, total1 := machineCPU(); total1 > total0 {
		res.busy = (busy1 - busy0) / (total1 - total0) * float64(runtime.NumCPU())
	}
	res.unobserved = want - len(res.lat)

	// Wind down: workers finish on ctx, callers see the end; a stream whose
	// worker has not opened yet is killed so its Recv returns.
	cancel()
	done := make(chan struct{})
	go func() { callers.Wait(); close(done) }()
	for stop := false; !stop; {
		for i := range slots {
			if ks := slots[i].Load(); ks != nil && !ks.live.Load() {
				ks.c.Kill()
			}
		}
		select {
		case <-done:
			stop = true
		case <-time.After(50 * time.Millisecond):
		}
	}
	close(jobs)
	workers.Wait()
	res.errs = errs.Load()
	return res
}

// Scenario 2: throughput.

type thruResult struct {
	name      string
	items     int64
	itemsPerS float64
	cpuPerIt  time.Duration
	errs      int64
}

func runThroughput(m machinery) thruResult {
	const streams, per = 64, 200
	var res thruResult
	var errs atomic.Int64
	dur := time.Duration(*flagSeconds * float64(time.Second))
	cpu0, t0 := cpuTime(), time.Now()
	for time.Since(t0) < dur {
		jobs := make(chan string, streams)
		var wg sync.WaitGroup
		// Worker side.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tok := range jobs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w, err := m.Open(context.Background(), tok)
					if err != nil {
						errs.Add(1)
						return
					}
					for range per {
						if err := w.Send(item64); err != nil {
							errs.Add(1)
							w.Close()
							return
						}
					}
					if err := w.Finish(); err != nil {
						errs.Add(1)
					}
				}()
			}
		}()
		// Caller side.
		var got atomic.Int64
		var callers sync.WaitGroup
		for range streams {
			callers.Add(1)
			go func() {
				defer callers.Done()
				tok := newToken()
				c := m.Expect(tok)
				jobs <- tok
				for {
					_, err := c.Recv()
					if err == io.EOF {
						return
					}
					if err != nil {
						errs.Add(1)
						return
					}
					got.Add(1)
				}
			}()
		}
		callers.Wait()
		close(jobs)
		wg.Wait()
		res.items += got.Load()
	}
	el := time.Since(t0)
	res.itemsPerS = float64(res.items) / el.Seconds()
	if res.items > 0 {
		res.cpuPerIt = (cpuTime() - cpu0) / time.Duration(res.items)
	}
	res.errs = errs.Load()
	return res
}

// Scenario 3: short streams.

type shortResult struct {
	name       string
	streams    int64
	perS       float64
	cpuPerS    time.Duration
	newConns   int64 // kernel TCP passive opens during the run (namespace-wide)
	activeOpen int64
	errs       int64
}

func runShort(m machinery) shortResult {
	const concurrency = 32
	var res shortResult
	var done, errs atomic.Int64
	dur := time.Duration(*flagSeconds * float64(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()

	jobs := make(chan string, concurrency)
	var workers sync.WaitGroup
	workers.Add(1)
	go func() {
		defer workers.Done()
		for tok := range jobs {
			workers.Add(1)
			go func() {
				defer workers.Done()
				w, err := m.Open(context.Background(), tok)
				if err != nil {
					errs.Add(1)
					return
				}
				for range 2 {
					if err := w.Send(item64); err != nil {
						errs.Add(1)
						w.Close()
						return
					}
				}
				if err := w.Finish(); err != nil {
					errs.Add(1)
				}
			}()
		}
	}()
	pass0, act0 := tcpOpens()
	cpu0, t0 := cpuTime(), time.Now()
	var callers sync.WaitGroup
	for range concurrency {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for ctx.Err() == nil {
				tok := newToken()
				c := m.Expect(tok)
				jobs <- tok
				for {
					_, err := c.Recv()
					if err == io.EOF {
						done.Add(1)
						break
					}
					if err != nil {
						errs.Add(1)
						break
					}
				}
			}
		}()
	}
	callers.Wait()
	el := time.Since(t0)
	cpu := cpuTime() - cpu0
	close(jobs)
	workers.Wait()
	pass1, act1 := tcpOpens()
	res.streams = done.Load()
	res.perS = float64(res.streams) / el.Seconds()
	if res.streams > 0 {
		res.cpuPerS = cpu / time.Duration(res.streams)
	}
	res.newConns, res.activeOpen = pass1-pass0, act1-act0
	res.errs = errs.Load()
	return res
}

// Measurement helpers.

func newToken() string {
	return strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU returns the machine's busy and total CPU time from /proc/stat,
// in clock ticks.
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// tcpOpens returns the kernel's TCP PassiveOpens and ActiveOpens counters
// (for the whole network namespace: other processes' connections count too).
func tcpOpens() (passive, active int64) {
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		return -1, -1
	}
	defer f.Close()
	var head []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Tcp:" {
			continue
		}
		if head == nil {
			head = fields
			continue
		}
		for i, h := range head {
			if i >= len(fields) {
				break
			}
			v, _ := strconv.ParseInt(fields[i], 10, 64)
			switch h {
			case "PassiveOpens":
				passive = v
			case "ActiveOpens":
				active = v
			}
		}
	}
	return passive, active
}

// adapterLines counts the non-blank lines of the named sources that are not
// only a comment.
func adapterLines(files []string) int {
	n := 0
	for _, f := range files {
		b, err := sources.ReadFile(f)
		if err != nil {
			return -1
		}
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if l != "" && !strings.HasPrefix(l, "//") {
				n++
			}
		}
	}
	return n
}

// Tables.

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

func printKill(rs []killResult) {
	fmt.Printf("### Kill -> worker observes it (%d streams, 1 item of 64 B per stream per %v, %d kills)\n\n",
		*flagStreams, *flagStep, *flagKills)
	fmt.Println("| machinery | kills seen | p50 ms | p99 ms | max ms | p99 <= 5 ms | items/s while killing | CPU cores: process / machine | open all streams ms | errors |")
	fmt.Println("|---|--:|--:|--:|--:|:-:|--:|--:|--:|--:|")
	for _, r := range rs {
		slices.Sort(r.lat)
		p50, p99, mx := pct(r.lat, 0.50), pct(r.lat, 0.99), pct(r.lat, 1)
		ok := "yes"
		if p99 > 5*time.Millisecond || r.unobserved > 0 {
			ok = "no"
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %.0f | %.2f / %.2f | %.0f | %d |\n",
			r.name, len(r.lat), ms(p50), ms(p99), ms(mx), ok, r.itemsPerS, r.cores, r.busy, r.rampMs, r.errs)
	}
	fmt.Println()
}

func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func printThroughput(rs []thruResult) {
	fmt.Printf("### Throughput (64 streams x 200 items of 64 B, one Send per item, repeated for %gs)\n\n", *flagSeconds)
	fmt.Println("| machinery | items | items/s | CPU us/item (both sides) | errors |")
	fmt.Println("|---|--:|--:|--:|--:|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %.0f | %.2f | %d |\n", r.name, r.items, r.itemsPerS, float64(r.cpuPerIt)/1e3, r.errs)
	}
	fmt.Println()
}

func printShort(rs []shortResult) {
	fmt.Printf("### Short streams (open, 2 items, end; 32 concurrent; %gs)\n\n", *flagSeconds)
	fmt.Println("| machinery | streams | streams/s | CPU us/stream | new TCP conns (kernel) | conns/stream | errors |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rs {
		per := 0.0
		if r.streams > 0 {
			per = float64(r.newConns) / float64(r.streams)
		}
		fmt.Printf("| %s | %d | %.0f | %.1f | %d | %.3f | %d |\n",
			r.name, r.streams, r.perS, float64(r.cpuPerS)/1e3, r.newConns, per, r.errs)
	}
	fmt.Println()
}

func printAdapters(es []entry) {
	fmt.Println("### Adapters (stop, kill with no item after it, end marker, credit)")
	fmt.Println()
	fmt.Println("| machinery | adapter lines | files | kill ahead of queued data? |")
	fmt.Println("|---|--:|---|---|")
	for _, e := range es {
		fmt.Printf("| %s | %d | %s | %s |\n", e.name, adapterLines(e.files), strings.Join(e.files, ", "), e.kill)
	}
	fmt.Println()
}
