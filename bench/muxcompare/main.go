// Command muxcompare measures ways to carry many response streams between
// one worker process and one caller process, to choose by measurement the
// machinery of the multiplexed transport: hashicorp/yamux, xtaci/smux and
// gRPC bidi streams, each over one long-lived TCP connection, against the
// project's own transport (today one TCP connection per stream).
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
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
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
