package main

// Scenario 2: throughput.

import (
	"context"
	"io"
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
