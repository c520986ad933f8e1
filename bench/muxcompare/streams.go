package main

// The stream traffic the throughput and short-stream scenarios share: a
// worker side that answers each expected stream with a number of items, and
// a caller side that reads one stream to its end.

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
)

// serveItems runs the worker side until jobs is closed: for each token, a
// goroutine opens its stream, sends n copies of item64 and finishes it; each
// failure counts in errs. Wait on the returned group after closing jobs.
func serveItems(m machinery, jobs <-chan string, n int, errs *atomic.Int64) *sync.WaitGroup {
	wg := new(sync.WaitGroup)
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
				for range n {
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
	return wg
}

// readAll receives from c until its stream ends: the items it got, and
// whether the stream ended with the worker's Finish (io.EOF).
func readAll(c callerStream) (items int64, finished bool) {
	for {
		if _, err := c.Recv(); err != nil {
			return items, err == io.EOF
		}
		items++
	}
}
