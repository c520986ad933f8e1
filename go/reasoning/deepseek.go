package reasoning

import (
	"fmt"
	"strings"
)

const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// deepseekR1 is vLLM's deepseek_r1 reasoning parser: its <think>/</think>
// base parser, with output that never opened <think> read as reasoning
// until </think>.
type deepseekR1 struct {
	startID, endID int
	sawStart       bool // <think> among the ids before this piece
	sawEnd         bool // </think> among the ids before this piece
}

func newDeepseekR1(o Options) (*deepseekR1, error) {
	start, ok1 := lookup(o, thinkStart)
	end, ok2 := lookup(o, thinkEnd)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("reasoning: deepseek_r1: the vocabulary has no %s or %s token", thinkStart, thinkEnd)
	}
	return &deepseekR1{startID: start, endID: end}, nil
}

func (d *deepseekR1) extract(text string) (*string, *string) {
	if _, after, ok := strings.Cut(text, thinkStart); ok {
		text = after
	}
	reasoning, content, ok := strings.Cut(text, thinkEnd)
	if !ok {
		return &text, nil
	}
	return &reasoning, orNil(content)
}

func has(ids []int, id int) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func (d *deepseekR1) stream(text string, ids []int) (delta, bool) {
	defer func() {
		d.sawStart = d.sawStart || has(ids, d.startID)
		d.sawEnd = d.sawEnd || has(ids, d.endID)
	}()
	if len(ids) == 1 && (ids[0] == d.startID || ids[0] == d.endID) {
		return delta{}, false
	}
	inStart, inEnd := has(ids, d.startID), has(ids, d.endID)
	if inEnd && (d.sawStart || !inStart) {
		// The end in this piece: what comes before it is reasoning.
		at := pyFind(text, thinkEnd)
		return split(pySlice(text, 0, at, false), pySlice(text, at+runeLen(thinkEnd), 0, true)), true
	}
	switch {
	case d.sawStart && d.sawEnd:
		return contentDelta(text), true
	case d.sawStart:
		return reasoningDelta(text), true
	case inStart && inEnd:
		from := pyFind(text, thinkStart) + runeLen(thinkStart)
		at := pyFind(text, thinkEnd)
		return split(pySlice(text, from, at, false), pySlice(text, at+runeLen(thinkEnd), 0, true)), true
	case inStart:
		return reasoningDelta(text), true
	case d.sawEnd:
		return contentDelta(text), true
	}
	return reasoningDelta(text), true
}

// split is a delta that sets both keys, content null when empty.
func split(reasoning, content string) delta {
	return delta{reasoning: &reasoning, hasReasoning: true, content: orNil(content), hasContent: true}
}

func contentDelta(s string) delta   { return delta{content: &s, hasContent: true} }
func reasoningDelta(s string) delta { return delta{reasoning: &s, hasReasoning: true} }

func (d *deepseekR1) endedNow(ids []int) bool { return has(ids, d.endID) }

func (d *deepseekR1) finish() (delta, bool) { return delta{}, false }

func (d *deepseekR1) engineBased() bool { return false }

func (d *deepseekR1) isEnd(ids []int) bool {
	for i := len(ids) - 1; i >= 0; i-- {
		switch ids[i] {
		case d.startID:
			return false
		case d.endID:
			return true
		}
	}
	return false
}

func (d *deepseekR1) count(ids []int) int {
	n, depth := 0, 0
	for _, id := range ids {
		switch {
		case id == d.startID:
			depth++
		case id == d.endID:
			if depth > 0 {
				depth--
			}
		case depth > 0:
			n++
		}
	}
	return n
}
