package main

// The model card: what a worker publishes with its instance, built and
// checked by go/modelcard (the one definition the frontend reads too).

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

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

// dc_model_card: see dynamo_ctx.h, the reference.
//
//export dc_model_card
func dc_model_card(model *C.char, modelLen C.size_t, mode *C.char, modeLen C.size_t, migrationLimit, maxNumSeqs, maxModelLen C.int64_t,
	modelPath *C.char, pathLen C.size_t, supports *C.char, supportsLen C.size_t, toolCallParser *C.char, toolCallParserLen C.size_t,
	reasoningParser *C.char, reasoningParserLen C.size_t, buf *C.char, bufLen C.size_t, n *C.size_t) (rc C.int) {
	defer guard("dc_model_card", &rc)
	if model == nil || mode == nil {
		return fail(C.DC_EINVAL, "dc_model_card: model and mode must not be NULL")
	}
	card := modelcard.Card{
		Model:           string(goBytes(model, modelLen)),
		Mode:            modelcard.Mode(goBytes(mode, modeLen)),
		MigrationLimit:  int(migrationLimit),
		MaxNumSeqs:      int(maxNumSeqs),
		MaxModelLen:     int(maxModelLen),
		ModelPath:       string(goBytes(modelPath, pathLen)),
		ToolCallParser:  string(goBytes(toolCallParser, toolCallParserLen)),
		ReasoningParser: string(goBytes(reasoningParser, reasoningParserLen)),
	}
	if list := string(goBytes(supports, supportsLen)); list != "" {
		card.Supports = strings.Split(list, ",")
	}
	_, b, err := modelcard.Build(card)
	if errors.Is(err, modelcard.ErrInvalid) {
		return fail(C.DC_EINVAL, "dc_model_card: %v", err)
	}
	if err != nil {
		return fail(C.DC_EIO, "dc_model_card: %v", err)
	}
	return writeString("dc_model_card", string(b), buf, bufLen, n)
}
