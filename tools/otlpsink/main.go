// Command otlpsink is a real OTLP trace receiver for the tests: the
// OpenTelemetry Collector's own otlpreceiver component (OTLP over HTTP,
// protobuf or JSON, on an ephemeral port of 127.0.0.1), whose consumer
// writes each span it receives as one JSON line to a file.
//
// It prints one line, "listening http://127.0.0.1:PORT", on stdout once the
// receiver is up, then runs until SIGTERM or SIGINT (or its stdin closes,
// so that it never outlives the test that started it). It is its own Go
// module so that the Collector's dependencies stay out of the library's.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
)

// span is one received span, as written to the output file.
type span struct {
	TraceID       string         `json:"trace_id"`
	SpanID        string         `json:"span_id"`
	ParentSpanID  string         `json:"parent_span_id"`
	Name          string         `json:"name"`
	Kind          string         `json:"kind"`
	Service       string         `json:"service"`
	StartNs       uint64         `json:"start_ns"`
	EndNs         uint64         `json:"end_ns"`
	StatusCode    string         `json:"status_code"`
	StatusMessage string         `json:"status_message,omitempty"`
	Attributes    map[string]any `json:"attributes"`
	Events        []event        `json:"events"`
}

type event struct {
	Name       string         `json:"name"`
	TimeNs     uint64         `json:"time_ns"`
	Attributes map[string]any `json:"attributes"`
}

func main() {
	out := flag.String("out", "", "the file to append one JSON line per span to")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "otlpsink: -out is required")
		os.Exit(2)
	}
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "otlpsink:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var mu sync.Mutex
	w := bufio.NewWriter(f)
	sink, err := consumer.NewTraces(func(_ context.Context, td ptrace.Traces) error {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range flatten(td) {
			b, err := json.Marshal(s)
			if err != nil {
				return err
			}
			_, _ = w.Write(append(b, '\n'))
		}
		return w.Flush() // a line is in the file before the exporter hears OK
	})
	if err != nil {
		return err
	}
	rcv, addr, err := start(sink)
	if err != nil {
		return err
	}
	fmt.Printf("listening http://%s\n", addr)
	_ = os.Stdout.Sync()

	done := make(chan os.Signal, 1)
	signal.Notify(done, syscall.SIGTERM, syscall.SIGINT)
	go func() { // stdin closed: the test that started us is gone
		_, _ = io.Copy(io.Discard, os.Stdin)
		done <- syscall.SIGTERM
	}()
	<-done
	return rcv.Shutdown(context.Background())
}

// start starts the receiver on a free port of 127.0.0.1 (a few tries: the
// port is found free, then bound by the receiver).
func start(next consumer.Traces) (receiver.Traces, string, error) {
	factory := otlpreceiver.NewFactory()
	var lastErr error
	for range 10 {
		addr, err := freeAddr()
		if err != nil {
			return nil, "", err
		}
		cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
		cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
		httpCfg := cfg.Protocols.HTTP.GetOrInsertDefault() // enabled, with its defaults
		httpCfg.ServerConfig.NetAddr.Endpoint = addr
		rcv, err := factory.CreateTraces(context.Background(), receivertest.NewNopSettings(factory.Type()), cfg, next)
		if err != nil {
			return nil, "", err
		}
		if lastErr = rcv.Start(context.Background(), componenttest.NewNopHost()); lastErr == nil {
			return rcv, addr, nil
		}
		_ = rcv.Shutdown(context.Background())
	}
	return nil, "", lastErr
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// flatten turns the received batch into spans.
func flatten(td ptrace.Traces) []span {
	var out []span
	for _, rs := range td.ResourceSpans().All() {
		service := ""
		if v, ok := rs.Resource().Attributes().Get("service.name"); ok {
			service = v.AsString()
		}
		for _, ss := range rs.ScopeSpans().All() {
			for _, s := range ss.Spans().All() {
				sp := span{
					TraceID: s.TraceID().String(), SpanID: s.SpanID().String(), ParentSpanID: s.ParentSpanID().String(), Name: s.Name(), Kind: s.Kind().String(),
					Service: service, StartNs: uint64(s.StartTimestamp()), EndNs: uint64(s.EndTimestamp()),
					StatusCode: s.Status().Code().String(), StatusMessage: s.Status().Message(),
					Attributes: s.Attributes().AsRaw(), Events: []event{},
				}
				for _, e := range s.Events().All() {
					sp.Events = append(sp.Events, event{Name: e.Name(), TimeNs: uint64(e.Timestamp()), Attributes: e.Attributes().AsRaw()})
				}
				out = append(out, sp)
			}
		}
	}
	return out
}
