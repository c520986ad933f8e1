package main

// Scenario 3: short streams.

import (
	"context"
	"io"
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
	var workers sync.WaitGroup
	workers.Add(1)
	go func() {
		defer workers.Done()
		for tok := range jobs {
			workers.Add(1)
			go func() {
				defer workers.Done()
				w, err := m.Open(context.Background(), tok)
				if err != nil {
					errs.Add(1)
					return
				}
				for range 2 {
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
				for {
					_, err := c.Recv()
					if err == io.EOF {
						done.Add(1)
						break
					}
					if err != nil {
						errs.Add(1)
						break
					}
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
