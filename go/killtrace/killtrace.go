// Package killtrace records when a cancellation passes each hop of its way
// from the caller to the handler, for the benchmarks' breakdown of kill
// latency. It is off unless the environment variable DYNAMO_CTX_KILL_TRACE
// names a file when the process starts; then every Mark appends one line
// to it (within 50 ms, written by a goroutine of its own): "<unix time in
// ns> <hop> <request id>". Off, a Mark costs one
// atomic load. The library writes nowhere else: the file is the one the
// user named.
package killtrace

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Env names the file that turns tracing on.
const Env = "DYNAMO_CTX_KILL_TRACE"

var (
	once sync.Once
	on   atomic.Bool
	mu   sync.Mutex
	buf  []byte // marks not yet written: a goroutine writes them every flushEvery
)

// flushEvery is how often the marks are written out: off the kill's path, so
// that tracing adds no system call to the hops it times.
const flushEvery = 50 * time.Millisecond

func open() {
	path := os.Getenv(Env)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return // tracing is a diagnostic: without its file there is none
	}
	on.Store(true)
	go func() { // lives as long as the process: tracing is for benchmark runs
		for range time.Tick(flushEvery) {
			flush(f)
		}
	}()
}

func flush(f *os.File) {
	mu.Lock()
	out := buf
	buf = nil
	mu.Unlock()
	if len(out) > 0 {
		_, _ = f.Write(out)
	}
}

// Enabled reports whether marks are recorded.
func Enabled() bool {
	once.Do(open)
	return on.Load()
}

// Mark records that the cancellation of request id reached hop now. The
// line reaches the file within flushEvery.
func Mark(hop, id string) {
	if !Enabled() {
		return
	}
	t := time.Now().UnixNano()
	mu.Lock()
	buf = strconv.AppendInt(buf, t, 10)
	buf = append(buf, ' ')
	buf = append(buf, hop...)
	buf = append(buf, ' ')
	buf = append(buf, id...)
	buf = append(buf, '\n')
	mu.Unlock()
}
