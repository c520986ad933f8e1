package frontend_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
)

// BenchmarkRequestByFleet measures what one request costs the frontend as
// the fleet grows: workers workers (each a runtime of its own in this
// process) serve model "m" with a model card, and one op is a completion of
// 2 tokens, sent by one keep-alive client, after enough requests that the
// frontend has its stream connection to every worker. Reported: the process's CPU per
// request (cpu-us/op, getrusage; less what the fleet costs the process when
// no request runs, idle-cpu-%, its leases' heartbeats) and allocations
// (allocs/op, the background's included), both the frontend's and the
// serving worker's; the worker's share does not depend on the fleet, so
// what grows is the frontend's. docs/scale.md's figures
// come from
//
//	go test -run '^$' -bench RequestByFleet -benchtime 3000x ./go/frontend
func BenchmarkRequestByFleet(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) { benchRequestByFleet(b, n) })
	}
}

func benchRequestByFleet(b *testing.B, workers int) {
	e := newEnv(b)
	for i := range workers {
		e.worker(fmt.Sprintf("w%d", i), "dynamo", "m", 1, planetest.Tokens)
	}
	e.startWith(frontend.Options{Addr: "127.0.0.1:0", MigrationLimit: -1})
	require.Eventually(b, func() bool { return healthInstances(e) == workers }, time.Minute, 20*time.Millisecond)
	hc := &http.Client{Timeout: 10 * time.Second}
	body := completion("m", "hi", 2, false)
	post := func() {
		r, err := hc.Post(e.base+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(b, err)
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
		require.Equal(b, http.StatusOK, r.StatusCode)
	}
	for range max(200, 3*workers) {
		post() // warm: the model's text, and a stream connection to each worker
	}
	// What the fleet costs the process with no request (its leases'
	// heartbeats), taken out of the requests' CPU.
	idle0, t0 := planetest.CPUTime(), time.Now()
	time.Sleep(time.Second)
	idle := float64(planetest.CPUTime()-idle0) / float64(time.Since(t0))
	b.ReportAllocs()
	cpu0, start := planetest.CPUTime(), time.Now()
	b.ResetTimer()
	for b.Loop() {
		post()
	}
	b.StopTimer()
	busy := float64(planetest.CPUTime()-cpu0) - idle*float64(time.Since(start))
	b.ReportMetric(busy/1e3/float64(b.N), "cpu-us/op")
	b.ReportMetric(idle*100, "idle-cpu-%")
}

// healthInstances is the number of instances the frontend's /health counts.
func healthInstances(e *env) int {
	r, err := e.hc.Get(e.base + "/health")
	if err != nil {
		return -1
	}
	defer r.Body.Close()
	var h struct {
		Instances int `json:"instances"`
	}
	if json.NewDecoder(r.Body).Decode(&h) != nil {
		return -1
	}
	return h.Instances
}
