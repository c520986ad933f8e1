package main

// The frontend in front of the fleet: a real go/frontend.Frontend, its
// HTTP on loopback, routing completions to the simulated workers; what
// one request costs it as the fleet grows.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// simTokenizer is the text of the simulated model: a word-level tokenizer
// of a few words, whose checksum the workers' card carries. The frontend
// reads it from the model host (serveModelFiles), as a frontend that
// cannot read a model's directory reads it from a worker.
var simTokenizer = []byte(`{"version":"1.0","added_tokens":[],"normalizer":null,` +
	`"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":null,` +
	`"model":{"type":"WordLevel","vocab":{"<unk>":0,"hi":1,"x":2,"y":3,"z":4,"w":5},"unk_token":"<unk>"}}`)

// frontendClients is how many keep-alive HTTP clients send the timed
// completions at once: a request rate high enough that the requests' CPU,
// not the background's, is most of what the process spends.
const frontendClients = 8

// frontendCost measures what one completion (a one-word prompt, 2 tokens)
// costs the process with a real frontend routing it to one of the
// workers, sent by frontendClients keep-alive HTTP clients, each one
// request after another, once the frontend has a stream session to every
// worker: the process's CPU less what it spends idle over as long (the
// leases, the NATS nodes; the mean of 2 s before and 2 s after), and the
// allocations (runtime.MemStats) less the idle rates over as long. Both
// include the serving worker's share and NATS's, which do not depend on
// the fleet's size; what grows with it is the frontend's.
func (s *sim) frontendCost(res *result) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Wait)
	defer cancel()
	host, _, err := s.newRuntime(ctx, s.quiet)
	if err != nil {
		return err
	}
	defer host.Close()
	ep, err := host.Serve(modelFilesPath, meta)
	if err != nil {
		return err
	}
	go serveModelFiles(ep)
	rt, _, err := s.newRuntime(ctx, s.quiet)
	if err != nil {
		return err
	}
	defer rt.Close()
	fe, err := frontend.New(ctx, rt, frontend.Options{Addr: "127.0.0.1:0", Namespace: "sim", MigrationLimit: -1})
	if err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: frontendClients}
	defer func() {
		tr.CloseIdleConnections()
		_ = fe.Close()
		ep.Close()
	}()
	hc := &http.Client{Transport: tr, Timeout: s.cfg.Wait}
	url := "http://" + fe.Addr() + "/v1/completions"
	body := `{"model":"sim-model","prompt":"hi","max_tokens":2}`
	post := func() error {
		r, err := hc.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if r.StatusCode != http.StatusOK {
			return fmt.Errorf("the frontend answered %d: %s", r.StatusCode, b)
		}
		return nil
	}
	deadline := time.Now().Add(s.cfg.Wait)
	for post() != nil { // until the frontend lists the model and has its text
		if time.Now().After(deadline) {
			return post()
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range max(min(200, s.cfg.FrontendRequests), 3*s.cfg.Workers) {
		if err := post(); err != nil { // warm: a stream session to each worker
			return err
		}
	}
	// The idle rates, before and after the timed requests: the background
	// (the leases' heartbeats, the NATS nodes) is most of the process's
	// CPU at 1,000 workers, so its error weighs on the difference.
	idleCPU, idleAllocs, idleBytes := idleRates(2 * time.Second)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, t0 := cpuTime(), time.Now()
	if err := parallel(frontendClients, func(int) error {
		for range s.cfg.FrontendRequests / frontendClients {
			if err := post(); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	elapsed := time.Since(t0)
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&m1)
	c2, a2, b2 := idleRates(2 * time.Second)
	idleCPU, idleAllocs, idleBytes = (idleCPU+c2)/2, (idleAllocs+a2)/2, (idleBytes+b2)/2
	n := float64(s.cfg.FrontendRequests / frontendClients * frontendClients)
	res.FrontendIdleCPU = idleCPU
	res.FrontendReqPerSec = n / elapsed.Seconds()
	res.FrontendCPUus = (float64(cpu) - idleCPU*float64(elapsed)) / 1e3 / n
	res.FrontendAllocs = (float64(m1.Mallocs-m0.Mallocs) - idleAllocs*elapsed.Seconds()) / n
	res.FrontendBytes = (float64(m1.TotalAlloc-m0.TotalAlloc) - idleBytes*elapsed.Seconds()) / n
	return nil
}

// idleRates are the process's CPU (in CPUs), allocations and bytes
// allocated a second over d, with nothing but the background running.
func idleRates(d time.Duration) (cpus, allocs, bytes float64) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0, t0 := cpuTime(), time.Now()
	time.Sleep(d)
	el := time.Since(t0)
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&m1)
	return float64(cpu) / float64(el), float64(m1.Mallocs-m0.Mallocs) / el.Seconds(),
		float64(m1.TotalAlloc-m0.TotalAlloc) / el.Seconds()
}

// modelFilesPath is the model host's endpoint (frontend.ModelFilesEndpoint
// under the simulation's namespace).
const modelFilesPath = "sim." + frontend.ModelFilesEndpoint

// serveModelFiles answers the frontend's reads of the model's text files
// (go/frontend/modelfiles.go): the tokenizer, and no other file.
func serveModelFiles(ep *plane.Endpoint) {
	for {
		req, err := ep.Next(context.Background())
		if err != nil {
			return
		}
		var ask struct {
			Files []string `json:"files"`
		}
		if err := json.Unmarshal(req.Payload, &ask); err != nil {
			req.Fail("ValueError: " + err.Error())
			continue
		}
		var items [][]byte
		for _, name := range ask.Files {
			if name != hfmodel.TokenizerFile {
				items = append(items, mustJSON(map[string]any{"name": name, "missing": true}))
				continue
			}
			items = append(items, mustJSON(map[string]any{"name": name, "data": string(simTokenizer)}),
				mustJSON(map[string]any{"name": name, "end": true}))
		}
		_, _ = req.SendMany(items) // a handful: below the send buffer
		req.Complete()
	}
}
