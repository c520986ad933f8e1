package main

// Scenario 3: short streams.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

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
	workers := serveItems(m, jobs, 2, &errs)
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
				if _, finished := readAll(c); finished {
					done.Add(1)
				} else {
					errs.Add(1)
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
