package planetest

import (
	"syscall"
	"time"
)

// CPUTime is this process's user + system time: benchmarks that run caller
// and worker runtimes in one process divide it by what they moved.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
