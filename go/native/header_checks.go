package main

// The compile-time checks that the public header's enums and constants are
// the Go packages' values.

/*
#include <stddef.h>
#include <stdint.h>
#define DC_ENUMS_ONLY
#include "dynamo_ctx.h"
*/
import "C"

import (
	"time"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
	"github.com/dynamo-ctx/dynamo-ctx/go/status"
)

// The C enums are the Go packages' values, checked here at compile time, every
// value both ways (an index out of range does not compile): the ABI passes
// them through as they are.
var (
	_ = [1]int{}[ctxtree.Live-C.DC_LIVE]
	_ = [1]int{}[C.DC_LIVE-ctxtree.Live]
	_ = [1]int{}[ctxtree.Stopped-C.DC_STOPPED]
	_ = [1]int{}[C.DC_STOPPED-ctxtree.Stopped]
	_ = [1]int{}[ctxtree.Killed-C.DC_KILLED]
	_ = [1]int{}[C.DC_KILLED-ctxtree.Killed]
	_ = [1]int{}[ctxtree.StateMask-C.DC_STATE_MASK]
	_ = [1]int{}[C.DC_STATE_MASK-ctxtree.StateMask]
	_ = [1]int{}[ctxtree.ReasonShift-C.DC_REASON_SHIFT]
	_ = [1]int{}[C.DC_REASON_SHIFT-ctxtree.ReasonShift]
	_ = [1]int{}[ctxtree.CauseShift-C.DC_CAUSE_SHIFT]
	_ = [1]int{}[C.DC_CAUSE_SHIFT-ctxtree.CauseShift]
	_ = [1]int{}[ctxtree.FieldMask-C.DC_FIELD_MASK]
	_ = [1]int{}[C.DC_FIELD_MASK-ctxtree.FieldMask]
	_ = [1]int{}[ctxtree.ReasonNone-C.DC_REASON_NONE]
	_ = [1]int{}[C.DC_REASON_NONE-ctxtree.ReasonNone]
	_ = [1]int{}[ctxtree.ReasonStopGenerating-C.DC_REASON_STOP_GENERATING]
	_ = [1]int{}[C.DC_REASON_STOP_GENERATING-ctxtree.ReasonStopGenerating]
	_ = [1]int{}[ctxtree.ReasonKill-C.DC_REASON_KILL]
	_ = [1]int{}[C.DC_REASON_KILL-ctxtree.ReasonKill]
	_ = [1]int{}[ctxtree.ReasonClientDisconnected-C.DC_REASON_CLIENT_DISCONNECTED]
	_ = [1]int{}[C.DC_REASON_CLIENT_DISCONNECTED-ctxtree.ReasonClientDisconnected]
	_ = [1]int{}[ctxtree.ReasonParent-C.DC_REASON_PARENT]
	_ = [1]int{}[C.DC_REASON_PARENT-ctxtree.ReasonParent]
	_ = [1]int{}[ctxtree.ReasonDeadline-C.DC_REASON_DEADLINE]
	_ = [1]int{}[C.DC_REASON_DEADLINE-ctxtree.ReasonDeadline]
	_ = [1]int{}[ctxtree.ReasonConnectionLost-C.DC_REASON_CONNECTION_LOST]
	_ = [1]int{}[C.DC_REASON_CONNECTION_LOST-ctxtree.ReasonConnectionLost]
	_ = [1]int{}[ctxtree.ReasonShutdown-C.DC_REASON_SHUTDOWN]
	_ = [1]int{}[C.DC_REASON_SHUTDOWN-ctxtree.ReasonShutdown]
	_ = [1]int{}[ctxtree.NumReasons-C.DC_REASON_COUNT]
	_ = [1]int{}[C.DC_REASON_COUNT-ctxtree.NumReasons]
	_ = [1]int{}[ctxtree.MaxIDLen-C.DC_MAX_ID_LEN]
	_ = [1]int{}[C.DC_MAX_ID_LEN-ctxtree.MaxIDLen]
	_ = [1]int{}[int64(ctxtree.MaxTimeout/time.Second)-C.DC_MAX_TIMEOUT_SECONDS]
	_ = [1]int{}[C.DC_MAX_TIMEOUT_SECONDS-int64(ctxtree.MaxTimeout/time.Second)]
	_ = [1]int{}[int64(plane.HostTickInterval/time.Millisecond)-C.DC_HOST_TICK_MS]
	_ = [1]int{}[C.DC_HOST_TICK_MS-int64(plane.HostTickInterval/time.Millisecond)]
	_ = [1]int{}[status.MaxPathLen+1-C.DC_STATUS_PATH_MAX]
	_ = [1]int{}[C.DC_STATUS_PATH_MAX-status.MaxPathLen-1]
)

// The C route codes are plane's.
var (
	_ = [1]int{}[plane.RoundRobin-C.DC_ROUTE_ROUND_ROBIN]
	_ = [1]int{}[C.DC_ROUTE_ROUND_ROBIN-plane.RoundRobin]
	_ = [1]int{}[plane.Random-C.DC_ROUTE_RANDOM]
	_ = [1]int{}[C.DC_ROUTE_RANDOM-plane.Random]
	_ = [1]int{}[plane.Direct-C.DC_ROUTE_DIRECT]
	_ = [1]int{}[C.DC_ROUTE_DIRECT-plane.Direct]
)

// The model card's bound and the model directory's are modelcard's and
// hfmodel's.
var (
	_ = [1]int{}[modelcard.MaxBytes-C.DC_MODEL_CARD_MAX_BYTES]
	_ = [1]int{}[C.DC_MODEL_CARD_MAX_BYTES-modelcard.MaxBytes]
	_ = [1]int{}[hfmodel.MaxTokenizerBytes-C.DC_MODEL_MAX_TOKENIZER_BYTES]
	_ = [1]int{}[C.DC_MODEL_MAX_TOKENIZER_BYTES-hfmodel.MaxTokenizerBytes]
	_ = [1]int{}[hfmodel.MaxConfigBytes-C.DC_MODEL_MAX_CONFIG_BYTES]
	_ = [1]int{}[C.DC_MODEL_MAX_CONFIG_BYTES-hfmodel.MaxConfigBytes]
)
