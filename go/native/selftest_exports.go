//go:build dc_selftest

package main

// The self-test hook, built only into the test library (go build -tags
// dc_selftest: build.py --selftest). The shipped library has neither this
// export nor the extension module's selftest_panic, which the CFLAGS below
// turn on in py_module.c; its public header does not declare it.

/*
#cgo CFLAGS: -DDC_SELFTEST
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

// dc_selftest_panic panics inside the library on purpose, to test that every
// export recovers: it always returns DC_EINTERNAL with a message naming it,
// and logs an error record.
//
//	int dc_selftest_panic(void);
//
//export dc_selftest_panic
func dc_selftest_panic() (rc C.int) {
	defer guard("dc_selftest_panic", &rc)
	var m map[string]int
	m["boom"]++ // a real runtime panic (nil map write), not just panic("...")
	return C.DC_OK
}
