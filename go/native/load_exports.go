package main

// The exports of a worker's load (go/plane/workerload.go): the engine's own
// figures, which the endpoint publishes with its count, and the count
// itself, with the requests it refused as busy.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import "math"

// dc_endpoint_set_engine_load: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_set_engine_load
func dc_endpoint_set_engine_load(h C.uint64_t, waiting C.int64_t, kvUsage C.double) (rc C.int) {
	defer guard("dc_endpoint_set_engine_load", &rc)
	drainPosted() // a posted older figure must not land after this one (posted.go)
	kv := float64(kvUsage)
	if math.IsNaN(kv) || math.IsInf(kv, 0) {
		return fail(C.DC_EINVAL, "dc_endpoint_set_engine_load: kv_usage %v is not a finite number", kv)
	}
	ep, rc := get(endpoints, "dc_endpoint_set_engine_load", h)
	if rc != C.DC_OK {
		return rc
	}
	w := int(min(max(int64(waiting), -1), math.MaxInt32))
	ep.SetEngineLoad(w, min(kv, 1))
	return C.DC_OK
}

// dc_endpoint_load: see dynamo_ctx.h, the reference.
//
//export dc_endpoint_load
func dc_endpoint_load(h C.uint64_t, running, capacity *C.int64_t, refused *C.uint64_t) (rc C.int) {
	defer guard("dc_endpoint_load", &rc)
	if running == nil || capacity == nil || refused == nil {
		return fail(C.DC_EINVAL, "dc_endpoint_load: running, capacity and refused must not be NULL")
	}
	ep, rc := get(endpoints, "dc_endpoint_load", h)
	if rc != C.DC_OK {
		return rc
	}
	now, n, _ := ep.Load()
	*running, *capacity, *refused = C.int64_t(now.Running), C.int64_t(now.Capacity), C.uint64_t(n)
	return C.DC_OK
}
