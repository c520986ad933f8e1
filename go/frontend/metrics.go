package frontend

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
)

// Histogram buckets of disconnect -> confirmed abort, in seconds: the target
// is milliseconds, so the resolution is finest there.
var abortBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type histogram struct {
	counts []uint64 // per bucket, cumulative at render time
	sum    float64
	count  uint64
}

type metrics struct {
	mu            sync.Mutex
	requests      map[string]uint64
	cancellations map[string]uint64
	confirmed     map[string]uint64
	latency       map[string]*histogram
	outcomes      map[string]map[string]uint64 // model -> outcome -> count (outcome.go)
	busyRequeues  map[string]uint64            // worker requests every worker refused as busy, queued again (resend.go)
}

func newMetrics() *metrics {
	return &metrics{
		requests: map[string]uint64{}, cancellations: map[string]uint64{},
		confirmed: map[string]uint64{}, latency: map[string]*histogram{}, outcomes: map[string]map[string]uint64{},
		busyRequeues: map[string]uint64{},
	}
}

func (m *metrics) outcome(model, outcome string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	byOutcome := m.outcomes[model]
	if byOutcome == nil {
		byOutcome = map[string]uint64{}
		m.outcomes[model] = byOutcome
	}
	byOutcome[outcome]++
}

func (m *metrics) request(model string) {
	m.mu.Lock()
	m.requests[model]++
	m.mu.Unlock()
}

func (m *metrics) busyRequeue(model string) {
	m.mu.Lock()
	m.busyRequeues[model]++
	m.mu.Unlock()
}

func (m *metrics) cancellation(model string) {
	m.mu.Lock()
	m.cancellations[model]++
	m.mu.Unlock()
}

func (m *metrics) abortConfirmed(model string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.confirmed[model]++
	h := m.latency[model]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(abortBuckets))}
		m.latency[model] = h
	}
	sec := d.Seconds()
	for i, b := range abortBuckets {
		if sec <= b {
			h.counts[i]++
			break
		}
	}
	h.sum += sec
	h.count++
}

func label(model string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `model="` + r.Replace(model) + `"`
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (m *metrics) write(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	counter := func(name, help string, values map[string]uint64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n", name, help, name)
		for _, k := range sortedKeys(values) {
			fmt.Fprintf(w, "%s{%s} %d\n", name, label(k), values[k])
		}
	}
	counter("dynamo_ctx_frontend_requests_total", "Requests received.", m.requests)
	counter("dynamo_ctx_frontend_cancellations_total", "Requests killed because the client disconnected before the worker had finished them (signalled).", m.cancellations)
	counter("dynamo_ctx_frontend_aborts_confirmed_total", "Cancellations whose abort a worker confirmed.", m.confirmed)
	counter("dynamo_ctx_frontend_busy_requeues_total", "Worker requests every worker refused as busy, queued again for a free place.", m.busyRequeues)
	name := "dynamo_ctx_frontend_outcomes_total"
	fmt.Fprintf(w, "# HELP %s Requests by how they ended: %s (each exactly once).\n# TYPE %s counter\n", name, strings.Join(outcomes, ", "), name)
	for _, k := range sortedKeys(m.outcomes) {
		for _, o := range outcomes { // every outcome of a model, 0 too: the sum is checkable
			fmt.Fprintf(w, "%s{%s,outcome=%q} %d\n", name, label(k), o, m.outcomes[k][o])
		}
	}
	name = "dynamo_ctx_frontend_disconnect_to_abort_seconds"
	fmt.Fprintf(w, "# HELP %s Time from client disconnect to the worker's confirmed abort.\n# TYPE %s histogram\n", name, name)
	for _, k := range sortedKeys(m.latency) {
		h := m.latency[k]
		var cum uint64
		for i, b := range abortBuckets {
			cum += h.counts[i]
			fmt.Fprintf(w, "%s_bucket{%s,le=\"%g\"} %d\n", name, label(k), b, cum)
		}
		fmt.Fprintf(w, "%s_bucket{%s,le=\"+Inf\"} %d\n", name, label(k), h.count)
		fmt.Fprintf(w, "%s_sum{%s} %g\n", name, label(k), h.sum)
		fmt.Fprintf(w, "%s_count{%s} %d\n", name, label(k), h.count)
	}
	// The process's Go runtime, under the names Prometheus's Go client uses,
	// so that a leak of goroutines or heap shows (make soak reads them).
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(w, "# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines %d\n", runtime.NumGoroutine())
	fmt.Fprintf(w, "# HELP go_sched_gomaxprocs_threads The current runtime.GOMAXPROCS setting.\n# TYPE go_sched_gomaxprocs_threads gauge\ngo_sched_gomaxprocs_threads %d\n", runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "# HELP go_memstats_heap_inuse_bytes Number of heap bytes that are in use.\n# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes %d\n", ms.HeapInuse)
}
