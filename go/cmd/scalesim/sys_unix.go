//go:build unix

package main

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used (user and system): the
// whole simulated deployment, NATS nodes included, runs in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fdLimit is how many files this process may open (the Go runtime raised
// the soft limit to the hard one at start).
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 20
	}
	return int(rl.Cur)
}
