package frame

import "runtime"

// bytesAllocated returns the bytes allocated on the heap while f ran.
func bytesAllocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}
