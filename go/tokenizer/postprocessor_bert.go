package tokenizer

import (
	"encoding/json"
	"fmt"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// clsSepPost is Bert and Roberta processing: [cls] sequence [sep].
type clsSepPost struct{ cls, sep int }

// parseBertPost parses a "BertProcessing" or "RobertaProcessing"
// post-processor.
func parseBertPost(kind string, raw json.RawMessage) (postProcessor, error) {
	var v struct {
		Sep json.RawMessage `json:"sep"`
		Cls json.RawMessage `json:"cls"`
	}
	if err := decodeInto(kind, raw, &v); err != nil {
		return nil, err
	}
	sep, err := tokenAndID(kind, "sep", v.Sep)
	if err != nil {
		return nil, err
	}
	cls, err := tokenAndID(kind, "cls", v.Cls)
	if err != nil {
		return nil, err
	}
	return clsSepPost{cls: cls, sep: sep}, nil
}

// tokenAndID is the ["token", id] pair of Bert/Roberta processing.
func tokenAndID(kind, field string, raw json.RawMessage) (int, error) {
	var pair []json.RawMessage
	if jsonscan.IsNull(raw) {
		return 0, missing(kind, field)
	}
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return 0, fmt.Errorf("%s: %q must be [token, id]", kind, field)
	}
	var tok string
	var id uint32
	if json.Unmarshal(pair[0], &tok) != nil || json.Unmarshal(pair[1], &id) != nil {
		return 0, fmt.Errorf("%s: %q must be [token, id]", kind, field)
	}
	return int(id), nil
}

func (p clsSepPost) process(ids []int, addSpecial bool) []int {
	if !addSpecial {
		return ids
	}
	out := make([]int, 0, len(ids)+2)
	out = append(out, p.cls)
	out = append(out, ids...)
	return append(out, p.sep)
}

func (clsSepPost) added() int { return 2 }
