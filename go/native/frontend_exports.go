package main

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
#include <stdlib.h>
*/
import "C"

import (
	"context"
	"errors"
	"unsafe"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
)

// dc_frontend_start: see dynamo_ctx.h, the reference.
//
//export dc_frontend_start
func dc_frontend_start(rtH C.uint64_t, addr *C.char, addrLen C.size_t, namespace *C.char, nsLen C.size_t, migrationLimit C.int, out *C.uint64_t) (rc C.int) {
	defer guard("dc_frontend_start", &rc)
	if out == nil || addr == nil {
		return fail(C.DC_EINVAL, "dc_frontend_start: addr and out must not be NULL")
	}
	rt, rc := get(runtimes, "dc_frontend_start", rtH)
	if rc != C.DC_OK {
		return rc
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	f, err := frontend.New(ctx, rt, frontend.Options{
		Addr:           string(goBytes(addr, addrLen)),
		Namespace:      string(goBytes(namespace, nsLen)),
		MigrationLimit: int(migrationLimit),
		Getenv:         cGetenv, // the frontend's variables, as the host's environment is now
	})
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
func dc_frontend_check_settings() (rc C.int) {
	defer guard("dc_frontend_check_settings", &rc)
	if err := frontend.CheckSettings(cGetenv); err != nil {
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
	f, err := frontends.Remove(uint64(h))
	if err != nil {
		return fail(C.DC_EBADF, "dc_frontend_free: %v", err)
	}
	_ = f.Close()
	return C.DC_OK
}

// cGetenv reads the C environment as it is now: Go's os.Getenv sees a copy
// taken when the library was loaded.
func cGetenv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	v := C.getenv(cs)
	if v == nil {
		return ""
	}
	return C.GoString(v)
}
