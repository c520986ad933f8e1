// Command native is the c-shared library of dynamo-ctx: a thin layer of
// exported C functions over the Go packages (handle table, error codes,
// recover), plus pymodule.c, which makes the same library the CPython
// extension module dynamo_ctx._native. No logic lives here that a Go package
// could hold.
//
// Build it with build.py (go build -buildmode=c-shared); docs/c-abi.md is the
// contract of the exported functions.
package main

// The interpreter provides the Python symbols at import time, so the link
// must not insist on resolving them.

// #cgo LDFLAGS: -Wl,--unresolved-symbols=ignore-all
import "C"

func main() {}
