package main

// Tables: the scenarios' results as printed.

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

func printKill(rs []killResult) {
	fmt.Printf("### Kill -> worker observes it (%d streams, 1 item of 64 B per stream per %v, %d kills)\n\n",
		*flagStreams, *flagStep, *flagKills)
	fmt.Println("| machinery | kills seen | p50 ms | p99 ms | max ms | p99 <= 5 ms | items/s while killing | CPU cores: process / machine | open all streams ms | errors |")
	fmt.Println("|---|--:|--:|--:|--:|:-:|--:|--:|--:|--:|")
	for _, r := range rs {
		slices.Sort(r.lat)
		p50, p99, mx := pct(r.lat, 0.50), pct(r.lat, 0.99), pct(r.lat, 1)
		ok := "yes"
		if p99 > 5*time.Millisecond || r.unobserved > 0 {
			ok = "no"
		}
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %.0f | %.2f / %.2f | %.0f | %d |\n",
			r.name, len(r.lat), ms(p50), ms(p99), ms(mx), ok, r.itemsPerS, r.cores, r.busy, r.rampMs, r.errs)
	}
	fmt.Println()
}

func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func printThroughput(rs []thruResult) {
	fmt.Printf("### Throughput (64 streams x 200 items of 64 B, one Send per item, repeated for %gs)\n\n", *flagSeconds)
	fmt.Println("| machinery | items | items/s | CPU us/item (both sides) | errors |")
	fmt.Println("|---|--:|--:|--:|--:|")
	for _, r := range rs {
		fmt.Printf("| %s | %d | %.0f | %.2f | %d |\n", r.name, r.items, r.itemsPerS, float64(r.cpuPerIt)/1e3, r.errs)
	}
	fmt.Println()
}

func printShort(rs []shortResult) {
	fmt.Printf("### Short streams (open, 2 items, end; 32 concurrent; %gs)\n\n", *flagSeconds)
	fmt.Println("| machinery | streams | streams/s | CPU us/stream | new TCP conns (kernel) | conns/stream | errors |")
	fmt.Println("|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rs {
		per := 0.0
		if r.streams > 0 {
			per = float64(r.newConns) / float64(r.streams)
		}
		fmt.Printf("| %s | %d | %.0f | %.1f | %d | %.3f | %d |\n",
			r.name, r.streams, r.perS, float64(r.cpuPerS)/1e3, r.newConns, per, r.errs)
	}
	fmt.Println()
}

func printAdapters(es []entry) {
	fmt.Println("### Adapters (stop, kill with no item after it, end marker, credit)")
	fmt.Println()
	fmt.Println("| machinery | adapter lines | files | kill ahead of queued data? |")
	fmt.Println("|---|--:|---|---|")
	for _, e := range es {
		fmt.Printf("| %s | %d | %s | %s |\n", e.name, adapterLines(e.files), strings.Join(e.files, ", "), e.kill)
	}
	fmt.Println()
}
