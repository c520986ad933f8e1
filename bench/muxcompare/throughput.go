package main

// Scenario 2: throughput.

import (
	"sync"
	"sync/atomic"
	"time"
)

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
		wg := serveItems(m, jobs, per, &errs)
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
				n, finished := readAll(c)
				got.Add(n)
				if !finished {
					errs.Add(1)
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
