// Command scalesim checks the cost model of docs/scale.md on one machine.
//
// For each number of workers it starts a real 3-node NATS cluster (the
// nats-server library, as natsbus embeds it, the nodes joined by route
// connections over loopback) and, in this process, that many workers and a
// tenth as many callers (at least 3): each a plane.Runtime of its own, with
// its own NATS connection and its own stream server, using the plane's API
// as a worker and a frontend do (Serve and an accept loop; Client, Generate
// and OnAbortConfirmed). Then, in turn:
//
//   - idle: the discovery traffic, announcements published, delivered and
//     copied between nodes per heartbeat period;
//   - held streams: memory per stream (many streams over pairs that already
//     have a connection) and per connection (one stream on each of many new
//     caller-worker pairs): Go heap found live, stacks, goroutines and
//     descriptors, both ends of each being in this process; then every
//     caller kills its streams at once (a kill storm);
//   - kill fan-out: a request whose handler sends a sub-request (a child
//     context) to every other worker is killed; the time until every hop's
//     context saw it, and until every caller had every abort confirmation;
//   - requests: NATS messages and bytes per request while the callers send
//     requests, the stream connections open (/proc/net/tcp) and the
//     TIME_WAIT sockets left per request, CPU per request;
//   - the cost of one pick of an instance (Client.Reserve);
//   - convergence: workers crash (their NATS connections close without a
//     "down") or drain (their leases say "down"); the time until every
//     client stopped listing them, and what a request sent to a crashed one
//     gets.
//
// NATS messages are read from the servers' count of messages per
// subscription, sorted by subject, so the requests' are told apart from the
// announcements' exactly at any load.
//
// Usage:
//
//	go run ./go/cmd/scalesim [-workers 10,100,500,1000] [-json out.json]
//
// It prints one table; -json writes every figure, which
// python/benchmarks/scale_sim.py turns into the tables and plot of
// docs/scale.md; -memprofile writes a heap profile while the held streams
// are open. A phase that fails at some point (a wait that ran out on a
// machine too small for it) is reported and the run goes on; the exit
// status is then 1.
//
// Everything runs in one process: both ends of every connection, the NATS
// nodes and the clients share this machine's CPUs. The message and
// connection counts are the design's at any size; the latencies are this
// machine's, and mean little once it is saturated (see the idle CPU
// figure).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("scalesim", flag.ContinueOnError)
	fl.SetOutput(stderr)
	workers := fl.String("workers", "10,100,500,1000", "comma-separated numbers of workers, one point each")
	callerRatio := fl.Int("worker-per-caller", 10, "workers per caller (a deployment of 1,000 workers has 100 frontends)")
	minCallers := fl.Int("min-callers", 3, "at least this many callers")
	cfg := config{}
	fl.IntVar(&cfg.Servers, "servers", 3, "NATS cluster nodes")
	fl.IntVar(&cfg.Concurrency, "concurrency", 4, "requests each caller keeps in flight in the request window")
	fl.IntVar(&cfg.Items, "items", 8, "items per request in the request window")
	fl.DurationVar(&cfg.Heartbeat, "heartbeat", 0, "lease heartbeat (0: the default, 1s)")
	fl.DurationVar(&cfg.TTL, "ttl", 0, "lease TTL (0: the default, 3s)")
	fl.DurationVar(&cfg.Window, "window", 3*time.Second, "length of the idle window and of the request window")
	fl.IntVar(&cfg.KillTrials, "kill-trials", 5, "fan-out kills per point")
	fl.IntVar(&cfg.Fanout, "fanout", 0, "sub-requests of a fan-out kill (0: one to every other worker)")
	fl.IntVar(&cfg.Held, "held", 2000, "streams held open at once over warm pairs (memory per stream, kill storm)")
	fl.IntVar(&cfg.Conns, "conns", 1000, "new caller-worker pairs opened at once (memory per connection)")
	fl.IntVar(&cfg.Crash, "crash", 4, "workers that crash, spread over one heartbeat period")
	fl.IntVar(&cfg.Drain, "drain", 3, "workers that drain at once")
	fl.DurationVar(&cfg.Wait, "wait", 60*time.Second, "bound of every wait")
	fl.StringVar(&cfg.MemProfile, "memprofile", "", "write a heap profile to this file while the held streams are open (of the last point)")
	fl.IntVar(&cfg.FrontendRequests, "frontend-requests", 3000, "completions timed through the frontend (CPU and allocations per request)")
	fl.BoolVar(&cfg.JetStream, "jetstream", true, "run JetStream on the nodes: discovery by change (false: by heartbeat to every watcher)")
	nodeLoss := fl.String("nodeloss", "", "instead of the phases, the idle window then the loss of one node: "+
		"\"follower\" (a node that does not lead the discovery stream), \"leader\" (the one that does), or both, comma-separated, a fresh cluster each")
	jsonOut := fl.String("json", "", "write the results as JSON to this file")
	verbose := fl.Bool("v", false, "log the runtimes' warnings and the progress to stderr")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	var points []int
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "scalesim: -workers: %q is not a number of workers\n", f)
			return 2
		}
		points = append(points, n)
	}

	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	progress := func(string) {}
	if *verbose {
		progress = func(s string) { fmt.Fprintf(stderr, "%s %s\n", time.Now().Format("15:04:05.000"), s) }
	}

	kinds := []string{""}
	if *nodeLoss != "" {
		kinds = strings.Split(*nodeLoss, ",")
	}
	var results []*result
	status := 0
	for _, n := range points {
		for _, kind := range kinds {
			c := cfg
			c.Workers = n
			c.Callers = max(*minCallers, n / *callerRatio)
			c.NodeLoss = strings.TrimSpace(kind)
			res, err := simulate(c, quiet, progress)
			if err != nil {
				// The points measured so far are still printed.
				fmt.Fprintf(stderr, "scalesim: %d workers: %v\n", n, err)
				status = 1
				continue
			}
			for _, e := range res.Errors {
				fmt.Fprintf(stderr, "scalesim: %d workers: %s\n", n, e)
				status = 1
			}
			results = append(results, res)
		}
	}
	if *nodeLoss != "" {
		printNodeLoss(stdout, results)
	} else {
		printTable(stdout, results)
	}
	if *jsonOut != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "scalesim: %v\n", err)
			return 1
		}
	}
	return status
}

// printTable writes the main figures, one row per point.
func printTable(w io.Writer, rs []*result) {
	rows := [][]string{{
		"workers", "callers", "js", "idle dlv/s", "idle route/s", "disc pub/s", "disc dlv/s", "msgs/req", "route/req", "req/s",
		"conns/caller", "TW/req", "kill hops", "kill last ms", "confirm ms",
		"KiB/stream", "storm ms", "crash s", "drain ms", "snapshot us",
	}}
	for _, r := range rs {
		per := r.Heartbeat
		rows = append(rows, []string{
			strconv.Itoa(r.Workers), strconv.Itoa(r.Callers), strconv.FormatBool(r.JetStream),
			f0(r.IdleDelivSec), f0(r.IdleRouteSec),
			f0(r.DiscPubs / per), f0(r.DiscDeliv / per),
			f2(r.MsgsPub + r.MsgsDeliv), f2(r.MsgsRoute), f0(r.ReqPerSec),
			strconv.Itoa(r.StreamConnCall), f2(r.TimeWaitPerReq),
			strconv.Itoa(r.KillHops), f1(r.KillLastP50), f1(r.AbortConfirmP50),
			f1((r.HeapPerStream + r.StackPerStream) / 1024), f0(r.StormLast),
			f2(r.CrashMin) + "-" + f2(r.CrashMax), f1(r.DrainMax), f1(r.SnapshotUs),
		})
	}
	printRows(w, rows)
}

// printRows writes rows as right-aligned columns.
func printRows(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range rows {
		for i, c := range row {
			if i > 0 {
				fmt.Fprint(w, "  ")
			}
			fmt.Fprintf(w, "%*s", widths[i], c)
		}
		fmt.Fprintln(w)
	}
}

// printNodeLoss writes each node loss: its summary, then its seconds.
func printNodeLoss(w io.Writer, rs []*result) {
	for _, r := range rs {
		for _, nl := range r.NodeLoss {
			fmt.Fprintf(w, "%d workers, %d callers: %s lost (%d clients moved, %d of them watchers); idle %.0f delivered/s\n",
				r.Workers, r.Callers, nl.Kind, nl.Moved, nl.MovedCallers, r.IdleDelivSec)
			fmt.Fprintf(w, "  burst: peak %d delivered/s, %d delivered beyond idle (%d to watchers), %d state puts, %d re-arms, "+
				"%d consumers created, %d JetStream API requests beyond idle; steady after %.0f s\n",
				nl.PeakDeliv, nl.ExtraDeliv, nl.ExtraFeed, nl.ExtraPuts, nl.ExtraRearms, nl.Consumers, nl.ExtraAPI, nl.SteadyS)
			fmt.Fprintf(w, "  crashed worker dropped by all %.2f s after its crash, new worker listed by all %.2f s after its start; "+
				"views whole %.2f s after the loss; false drops: %d (by %d clients, %.2f-%.2f s after the loss)\n",
				nl.CrashedDroppedS, nl.NewListedS, nl.WholeS, nl.FalseDrops, nl.FalseDropClients, nl.FalseDropFirst, nl.FalseDropLast)
			rows := [][]string{{"t s", "delivered", "to watchers", "to workers", "state puts", "re-arms", "cons creates", "stream infos", "other API"}}
			for _, sec := range nl.Seconds {
				rows = append(rows, []string{f1(sec.T), i64(sec.Deliv), i64(sec.Feed), i64(sec.ToWorkers), i64(sec.StatePuts),
					i64(sec.Rearms), i64(sec.ConsCreates), i64(sec.StreamInfo), i64(sec.OtherAPI)})
			}
			printRows(w, rows)
		}
	}
}

func i64(v int64) string { return strconv.FormatInt(v, 10) }

func f0(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
