// Package tracing is the library's OpenTelemetry tracing: one tracer
// provider per process, set up from the standard OTEL_* variables and
// exported over OTLP (HTTP, protobuf), and the spans of a request's hops
// (the frontend's HTTP request, each attempt, the worker's handler, the
// engine's generate) with the events of its cancellation. Every process's
// spans are made here, the Python engine's too (through the native
// module), so that every rule lives in one place.
//
// Off by default: without an OTLP endpoint in the environment there is no
// tracer provider and no goroutine, and every function here is a nil check
// (Enabled, a nil *Span). Exporting never blocks a request: spans go
// through a batch processor with a bounded queue, which drops what does not
// fit (counted and logged at shutdown), and OpenTelemetry's own errors go
// to the library's logger, never to stdout or stderr.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ShutdownTimeout bounds the flush of the spans still queued when the last
// user of the provider releases it.
const ShutdownTimeout = 5 * time.Second

// provider is the process's tracer provider while tracing is on.
type provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	stats  *counter
}

var (
	active atomic.Pointer[provider]  // nil: tracing is off (the fast path)
	mu     sync.Mutex                // serializes Acquire and release
	users  int                       // Acquire calls not yet released
	setup  func() (*provider, error) = fromEnv
)

// Enabled reports whether spans are being made.
func Enabled() bool { return active.Load() != nil }

// Acquire turns tracing on, if the environment asks for it (see Config),
// for as long as the returned release has not been called: the first
// Acquire of a process sets the provider up, the last release flushes it
// (within ShutdownTimeout) and shuts it down. release is idempotent. A
// configuration the library cannot honour is logged and leaves tracing off.
func Acquire() (release func()) {
	mu.Lock()
	defer mu.Unlock()
	users++
	if users == 1 {
		p, err := setup()
		if err != nil {
			slog.Warn("tracing off: the OTEL_* configuration cannot be used", "error", err)
		}
		if p != nil {
			active.Store(p)
		}
	}
	var once sync.Once
	return func() { once.Do(releaseOne) }
}

func releaseOne() {
	mu.Lock()
	defer mu.Unlock()
	users--
	if users > 0 {
		return
	}
	p := active.Swap(nil)
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := p.tp.Shutdown(ctx); err != nil {
		slog.Warn("tracing: spans not flushed at shutdown", "error", err)
	}
	if lost := p.stats.lost(); lost > 0 {
		slog.Warn("tracing: spans dropped (export queue full or exporter failing)", "spans", lost)
	}
}

// Config is what the environment asks for, read by fromEnv:
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: off.
//   - OTEL_TRACES_EXPORTER: otlp (the default) is the one exporter.
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT:
//     where to export; neither set: off (the library exports nothing to a
//     collector it was not told of).
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL:
//     http/protobuf (the default) is the one protocol.
//   - The exporter reads the other OTEL_EXPORTER_OTLP_* variables (headers,
//     timeout, compression, certificates); the SDK reads OTEL_SERVICE_NAME,
//     OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*.
type Config struct {
	Endpoint string // "" : off
}

// readConfig reads Config from the environment; an error for what the
// library cannot honour.
func readConfig() (Config, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return Config{}, nil
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return Config{}, nil
	default:
		return Config{}, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: only otlp or none", exp)
	}
	endpoint := firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		return Config{}, nil
	}
	if proto := firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); proto != "" && proto != "http/protobuf" {
		return Config{}, fmt.Errorf("OTLP protocol %q: only http/protobuf", proto)
	}
	return Config{Endpoint: endpoint}, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}

// fromEnv sets a provider up as the environment asks (nil: off).
func fromEnv() (*provider, error) {
	cfg, err := readConfig()
	if err != nil || cfg.Endpoint == "" {
		return nil, err
	}
	routeErrors()
	// The exporter reads the endpoint and the other OTEL_EXPORTER_OTLP_*
	// variables itself, by the specification's rules (a generic endpoint
	// gets /v1/traces appended, a signal's own is taken as it is).
	exp, err := otlptracehttp.New(context.Background())
	if err != nil {
		return nil, err
	}
	return newProvider(exp)
}

// newProvider makes the provider that exports to exp through a
// non-blocking batch processor (OTEL_BSP_* size its queue and batches).
func newProvider(exp sdktrace.SpanExporter) (*provider, error) {
	res, err := resource.New(context.Background(), resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithProcessPID())
	if err != nil && res == nil {
		return nil, err
	}
	stats := &counter{}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(stats), // counts the spans ended
		sdktrace.WithBatcher(&countingExporter{SpanExporter: exp, c: stats}),
	)
	return &provider{tp: tp, tracer: tp.Tracer("github.com/dynamo-ctx/dynamo-ctx"), stats: stats}, nil
}

// routeErrors sends OpenTelemetry's own errors and logs to the library's
// logger (slog's default, which the library points at its log queue): the
// library never writes to stdout or stderr.
func routeErrors() {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		slog.Warn("tracing: export error", "error", err)
	}))
	otel.SetLogger(logr.FromSlogHandler(quiet{slog.Default().Handler()}))
}

// quiet passes on only OpenTelemetry's warnings and errors: its info and
// debug records (one per batch) are noise in the library's log.
type quiet struct{ slog.Handler }

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && q.Handler.Enabled(ctx, l)
}

// counter counts the spans ended and exported, so that those dropped are
// known (the batch processor drops silently when its queue is full).
type counter struct {
	ended, exported, failed atomic.Uint64
}

func (c *counter) lost() uint64 {
	e, x := c.ended.Load(), c.exported.Load()
	if x >= e {
		return 0
	}
	return e - x
}

// Stats are the process's span counts since tracing was turned on.
type Stats struct {
	Ended, Exported, Failed uint64
}

// CurrentStats returns the counts (zero while tracing is off).
func CurrentStats() Stats {
	p := active.Load()
	if p == nil {
		return Stats{}
	}
	return Stats{Ended: p.stats.ended.Load(), Exported: p.stats.exported.Load(), Failed: p.stats.failed.Load()}
}

func (c *counter) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (c *counter) OnEnd(s sdktrace.ReadOnlySpan) {
	if s.SpanContext().IsSampled() {
		c.ended.Add(1)
	}
}
func (c *counter) Shutdown(context.Context) error   { return nil }
func (c *counter) ForceFlush(context.Context) error { return nil }

type countingExporter struct {
	sdktrace.SpanExporter
	c *counter
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		e.c.failed.Add(uint64(len(spans)))
		return err
	}
	e.c.exported.Add(uint64(len(spans)))
	return nil
}

// UseExporter turns tracing on, exporting to exp instead of what the
// environment names, until release (as Acquire does): for tests and
// benchmarks of the library and its users.
func UseExporter(exp sdktrace.SpanExporter) (release func()) {
	mu.Lock()
	saved := setup
	setup = func() (*provider, error) { return newProvider(exp) }
	mu.Unlock()
	release = Acquire()
	mu.Lock()
	setup = saved
	mu.Unlock()
	return release
}
