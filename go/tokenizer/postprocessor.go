package tokenizer

import "encoding/json"

// postProcessor adds the special tokens of a single sequence.
type postProcessor interface {
	process(ids []int, addSpecial bool) []int
	// added is how many tokens process adds with addSpecial.
	added() int
}

type sequencePost []postProcessor

// parseSequencePost parses a "Sequence" of post-processors.
func parseSequencePost(kind string, raw json.RawMessage) (postProcessor, error) {
	var v struct {
		Processors *[]json.RawMessage `json:"processors"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Processors == nil {
		return nil, orMissing(err, kind, "processors")
	}
	return parseSequence[sequencePost](kind, *v.Processors, parsePostProcessor)
}

func (s sequencePost) process(ids []int, addSpecial bool) []int {
	for _, p := range s {
		ids = p.process(ids, addSpecial)
	}
	return ids
}

func (s sequencePost) added() int {
	n := 0
	for _, p := range s {
		n += p.added()
	}
	return n
}
