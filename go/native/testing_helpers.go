package main

// #include <stdint.h>
import "C"

import "github.com/dynamo-ctx/dynamo-ctx/go/wake"

// Helpers for native_test.go, which cannot use cgo itself.

func dcU64(v uint64) C.uint64_t { return C.uint64_t(v) }

func newTestQueue() *eventQueue {
	q, err := wake.New[uint64]()
	if err != nil {
		panic(err)
	}
	return &eventQueue{q: q, watches: map[uint64]*watch{}}
}
