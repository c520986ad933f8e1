package main

// Measurement helpers: tokens, CPU time, the machine's CPU, TCP opens, adapter lines.

import (
	"bufio"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func newToken() string {
	return strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU returns the machine's busy and total CPU time from /proc/stat,
// in clock ticks.
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// tcpOpens returns the kernel's TCP PassiveOpens and ActiveOpens counters
// (for the whole network namespace: other processes' connections count too).
func tcpOpens() (passive, active int64) {
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		return -1, -1
	}
	defer f.Close()
	var head []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Tcp:" {
			continue
		}
		if head == nil {
			head = fields
			continue
		}
		for i, h := range head {
			if i >= len(fields) {
				break
			}
			v, _ := strconv.ParseInt(fields[i], 10, 64)
			switch h {
			case "PassiveOpens":
				passive = v
			case "ActiveOpens":
				active = v
			}
		}
	}
	return passive, active
}

// adapterLines counts the non-blank lines of the named sources that are not
// only a comment.
func adapterLines(files []string) int {
	n := 0
	for _, f := range files {
		b, err := sources.ReadFile(f)
		if err != nil {
			return -1
		}
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if l != "" && !strings.HasPrefix(l, "//") {
				n++
			}
		}
	}
	return n
}
