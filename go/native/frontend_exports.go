package main

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"context"
	"errors"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
)

// dc_frontend_start: see dynamo_ctx.h, the reference.
//
//export dc_frontend_start
func dc_frontend_start(rtH C.uint64_t, settings *C.char, settingsLen C.size_t, out *C.uint64_t) (rc C.int) {
	defer guard("dc_frontend_start", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	if out == nil || settings == nil {
		return fail(C.DC_EINVAL, "dc_frontend_start: settings and out must not be NULL")
	}
	s, err := frontend.DecodeSettings(goBytes(settings, settingsLen))
	if err != nil {
		return fail(C.DC_EINVAL, "dc_frontend_start: %v", err)
	}
	rt, rc := get(runtimes, "dc_frontend_start", rtH)
	if rc != C.DC_OK {
		return rc
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	f, err := frontend.Start(ctx, rt, s)
	var bad *frontend.SettingError
	if errors.As(err, &bad) {
		return fail(C.DC_EINVAL, "dc_frontend_start: %v", err)
	}
	if err != nil {
		return fail(C.DC_EIO, "dc_frontend_start: %v", err)
	}
	*out = C.uint64_t(frontends.Insert(f))
	return C.DC_OK
}

// dc_frontend_check_settings: see dynamo_ctx.h, the reference.
//
//export dc_frontend_check_settings
func dc_frontend_check_settings(settings *C.char, settingsLen C.size_t) (rc C.int) {
	defer guard("dc_frontend_check_settings", &rc)
	if settings == nil {
		return fail(C.DC_EINVAL, "dc_frontend_check_settings: settings must not be NULL")
	}
	s, err := frontend.DecodeSettings(goBytes(settings, settingsLen))
	if err == nil {
		err = s.Check()
	}
	if err != nil {
		return fail(C.DC_EINVAL, "dc_frontend_check_settings: %v", err)
	}
	return C.DC_OK
}

// dc_frontend_addr: see dynamo_ctx.h, the reference.
//
//export dc_frontend_addr
func dc_frontend_addr(h C.uint64_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_frontend_addr", &rc)
	f, rc := get(frontends, "dc_frontend_addr", h)
	if rc != C.DC_OK {
		return rc
	}
	return writeString("dc_frontend_addr", f.Addr(), buf, bufLen, n)
}

// dc_frontend_drain: see dynamo_ctx.h, the reference.
//
//export dc_frontend_drain
func dc_frontend_drain(h C.uint64_t, seconds C.double) (rc C.int) {
	defer guard("dc_frontend_drain", &rc)
	d, err := ctxtree.Timeout(float64(seconds))
	if err != nil {
		return fail(C.DC_EINVAL, "dc_frontend_drain: %v", err)
	}
	f, rc := get(frontends, "dc_frontend_drain", h)
	if rc != C.DC_OK {
		return rc
	}
	_ = f.Drain(d)
	return C.DC_OK
}

// dc_frontend_free: see dynamo_ctx.h, the reference.
//
//export dc_frontend_free
func dc_frontend_free(h C.uint64_t) (rc C.int) {
	defer guard("dc_frontend_free", &rc)
	runAllHeld() // a call that waits: see held_exports.go
	f, err := frontends.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_frontend_free: %v", err)
	}
	_ = f.Close()
	return C.DC_OK
}
