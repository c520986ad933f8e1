package main

// The exports of logging: the library's log records (slog, and the standard
// log package), queued for the host; the fd, the level and the records the
// host reads.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"log/slog"

	"github.com/dynamo-ctx/dynamo-ctx/go/logqueue"
)

// logs receives every log record of the library (slog, and the standard log
// package, which slog.SetDefault redirects); nil if its pipe could not be
// made, and then records are dropped.
var logs *logqueue.Queue

func init() {
	if l, err := logqueue.New(); err == nil {
		logs = l
	}
	slog.SetDefault(slog.New(logs.Handler()))
	slog.Debug("dynamo_ctx native library loaded", "version", version)
}

// dc_log_fd: see dynamo_ctx.h, the reference.
//
//export dc_log_fd
func dc_log_fd(fd *C.int) (rc C.int) {
	defer guard("dc_log_fd", &rc)
	if fd == nil {
		return fail(C.DC_EINVAL, "dc_log_fd: fd must not be NULL")
	}
	if logs == nil {
		return fail(C.DC_EIO, "dc_log_fd: the log queue could not be created")
	}
	*fd = C.int(logs.Fd())
	return C.DC_OK
}

// dc_log_set_level: see dynamo_ctx.h, the reference.
//
//export dc_log_set_level
func dc_log_set_level(level C.int) (rc C.int) {
	defer guard("dc_log_set_level", &rc)
	if logs != nil {
		logs.SetLevel(int(level))
	}
	return C.DC_OK
}

// dc_log_next: see dynamo_ctx.h, the reference.
//
//export dc_log_next
func dc_log_next(level *C.int, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_log_next", &rc)
	if level == nil || n == nil {
		return fail(C.DC_EINVAL, "dc_log_next: level and len must not be NULL")
	}
	code := C.int(C.DC_OK)
	// On DC_ERANGE the record stays queued, so the fd stays readable.
	if !logs.Next(func(r logqueue.Record) bool {
		*level = C.int(r.Level)
		code = writeString("dc_log_next", r.Msg, buf, bufLen, n)
		return code == C.DC_OK
	}) {
		return fail(C.DC_EAGAIN, "dc_log_next: no record")
	}
	return code
}
