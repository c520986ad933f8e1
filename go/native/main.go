// Command native is the c-shared library of dynamo-ctx: a thin layer of
// exported C functions over the Go packages, plus the py_*.c files, which make
// the same library the CPython extension module dynamo_ctx._native. Each export
// checks its arguments, calls one function of a Go package and maps the
// error to a code (handles, guard, fail); no logic lives here that a Go
// package could hold.
//
// Build it with build.py (go build -buildmode=c-shared). dynamo_ctx.h, the
// hand-written public header, is the contract of the exported functions;
// build.py checks its prototypes against the ones cgo generates.
package main

// The interpreter provides the Python symbols at import time, so the link
// must not insist on resolving them. The C files of the extension module
// (py_*.c) call each other through py_native.h: a function used without its
// declaration there is an error, not a guess at its type.

// #cgo LDFLAGS: -Wl,--unresolved-symbols=ignore-all
// #cgo CFLAGS: -Werror=implicit-function-declaration
import "C"

func main() {}
