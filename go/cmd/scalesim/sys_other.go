//go:build !unix

package main

import "time"

// cpuTime is unknown here: the CPU figures read 0.
func cpuTime() time.Duration { return 0 }

// fdLimit is unknown here: assume plenty.
func fdLimit() int { return 1 << 20 }
