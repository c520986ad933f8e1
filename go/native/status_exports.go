package main

// The exports of the status listener (go/status): a process's status
// endpoints over HTTP, answered by the host through the queue and dc_arm.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"errors"
	"strings"
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/status"
)

// dc_status_start: see dynamo_ctx.h, the reference.
//
//export dc_status_start
func dc_status_start(fd C.int, paths *C.char, pathsLen C.size_t, readTimeout C.double, maxConnections C.int,
	answerTimeout C.double, out *C.uint64_t) (rc C.int) {
	defer guard("dc_status_start", &rc)
	if out == nil || paths == nil {
		return fail(C.DC_EINVAL, "dc_status_start: paths and out must not be NULL")
	}
	opts := status.Options{Paths: strings.Split(string(goBytes(paths, pathsLen)), "\n"), MaxConnections: int(maxConnections)}
	for _, t := range []struct {
		name    string
		seconds C.double
		d       *time.Duration
	}{{"read_timeout", readTimeout, &opts.ReadTimeout}, {"answer_timeout", answerTimeout, &opts.AnswerTimeout}} {
		s := float64(t.seconds)
		if err := ctxtree.TimeoutError(s); err != nil {
			return fail(C.DC_EINVAL, "dc_status_start: %s %v: want a number of seconds, 0 (the default) or more, below a year", t.name, s)
		}
		*t.d = time.Duration(s * float64(time.Second))
	}
	ln, err := status.FileListener(int(fd))
	if err == nil {
		opts.Listener = ln
		var s *status.Server
		if s, err = status.New(opts); err == nil {
			*out = C.uint64_t(statuses.Insert(s))
			return C.DC_OK
		}
		_ = ln.Close()
	}
	if errors.Is(err, status.ErrBadOptions) {
		return fail(C.DC_EINVAL, "dc_status_start: %v", err)
	}
	return fail(C.DC_EIO, "dc_status_start: %v", err)
}

// dc_status_addr: see dynamo_ctx.h, the reference.
//
//export dc_status_addr
func dc_status_addr(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_status_addr", &rc)
	s, rc := get(statuses, "dc_status_addr", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_status_addr", s.Addr(), buf, bufLen, n)
}

// dc_status_next: see dynamo_ctx.h, the reference.
//
//export dc_status_next
func dc_status_next(h C.uint64_t, id *C.uint64_t, path *C.char, pathCap C.size_t, pathLen *C.size_t) (rc C.int) {
	defer guard("dc_status_next", &rc)
	if id == nil || path == nil || pathLen == nil {
		return fail(C.DC_EINVAL, "dc_status_next: id, path and len must not be NULL")
	}
	if pathCap < C.DC_STATUS_PATH_MAX {
		return fail(C.DC_EINVAL, "dc_status_next: a path buffer of %d bytes: at least DC_STATUS_PATH_MAX (%d)", pathCap, C.DC_STATUS_PATH_MAX)
	}
	s, rc := get(statuses, "dc_status_next", h)
	if rc != C.DC_OK {
		return rc
	}
	a, err := s.Next()
	switch {
	case errors.Is(err, status.ErrAgain):
		return fail(C.DC_EAGAIN, "dc_status_next: %v", err)
	case errors.Is(err, status.ErrClosed):
		return fail(C.DC_ECLOSED, "dc_status_next: %v", err)
	case err != nil:
		return fail(C.DC_EIO, "dc_status_next: %v", err)
	}
	*id = C.uint64_t(a.ID)
	return writeString("dc_status_next", a.Path, path, pathCap, pathLen) // fits: status.MaxPathLen
}

// dc_status_answer: see dynamo_ctx.h, the reference.
//
//export dc_status_answer
func dc_status_answer(h C.uint64_t, id C.uint64_t, code C.int, contentType *C.char, ctLen C.size_t, body *C.char, bodyLen C.size_t) (rc C.int) {
	defer guard("dc_status_answer", &rc)
	if (contentType == nil && ctLen > 0) || (body == nil && bodyLen > 0) {
		return fail(C.DC_EINVAL, "dc_status_answer: content_type and body must not be NULL")
	}
	s, rc := get(statuses, "dc_status_answer", h)
	if rc != C.DC_OK {
		return rc
	}
	if bodyLen > status.MaxBodyBytes {
		return fail(C.DC_EINVAL, "dc_status_answer: a body of %d bytes: at most %d", bodyLen, status.MaxBodyBytes)
	}
	err := s.Answer(uint64(id), status.Answer{Code: int(code), ContentType: string(goBytes(contentType, ctLen)), Body: goBytes(body, bodyLen)})
	switch {
	case err == nil:
		return C.DC_OK
	case errors.Is(err, status.ErrNotWaiting):
		return fail(C.DC_ENOENT, "dc_status_answer: %v", err)
	case errors.Is(err, status.ErrBadAnswer):
		return fail(C.DC_EINVAL, "dc_status_answer: %v", err)
	case errors.Is(err, status.ErrClosed):
		return fail(C.DC_ECLOSED, "dc_status_answer: %v", err)
	}
	return fail(C.DC_EIO, "dc_status_answer: %v", err)
}

// dc_status_free: see dynamo_ctx.h, the reference.
//
//export dc_status_free
func dc_status_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_status_free", &rc)
	s, err := statuses.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_status_free: %v", err)
	}
	_ = s.Close()
	return C.DC_OK
}
