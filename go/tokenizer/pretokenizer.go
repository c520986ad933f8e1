package tokenizer

import "encoding/json"

// piece is a stretch of normalized text on its way to the model: s, or b
// when b is not nil (b is only valid until the sink it is given to
// returns). lead is the length of its leading bytes that stem from the
// first character of the input (0: the piece does not start the input),
// what Metaspace's "first" prepend scheme consults.
type piece struct {
	s    string
	b    []byte
	lead int
}

func (p piece) text() string {
	if p.b != nil {
		return string(p.b)
	}
	return p.s
}

// sub is the piece of p at [start, end) (p.s only).
func (p piece) sub(start, end int) piece {
	q := piece{s: p.s[start:end]}
	if start < p.lead {
		q.lead = min(p.lead-start, end-start)
	}
	return q
}

// sink receives the pieces a pre-tokenizer produces.
type sink interface {
	put(p piece) error
}

type sinkFunc func(piece) error

func (f sinkFunc) put(p piece) error { return f(p) }

// preTokenizer splits a piece into the pieces the model tokenizes
// separately, giving each non-empty one to out, in order.
type preTokenizer interface {
	split(p piece, out sink) error
}

// emitRanges adapts out to the ranges of p a split produces, dropping
// empty ones.
func emitRanges(p piece, out sink) func(start, end int) error {
	return func(start, end int) error {
		if start == end {
			return nil
		}
		return out.put(p.sub(start, end))
	}
}

// textOf makes p's text a string, for stages that split it.
func textOf(p piece) piece {
	if p.b != nil {
		p.s, p.b = string(p.b), nil
	}
	return p
}

type sequencePre []preTokenizer

// parseSequencePre parses a "Sequence" of pre-tokenizers.
func parseSequencePre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		PreTokenizers *[]json.RawMessage `json:"pretokenizers"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.PreTokenizers == nil {
		return nil, orMissing(err, kind, "pretokenizers")
	}
	return parseSequence[sequencePre](kind, *v.PreTokenizers, parsePreTokenizer)
}

// stageSink feeds a stage of a sequence, which gives its pieces to next.
type stageSink struct {
	stage preTokenizer
	next  sink
}

func (s *stageSink) put(p piece) error { return s.stage.split(p, s.next) }

func (t sequencePre) split(p piece, out sink) error {
	if len(t) == 0 {
		return out.put(p)
	}
	// The chain of stages after the first, built once per piece given.
	for i := len(t) - 1; i >= 1; i-- {
		out = &stageSink{t[i], out}
	}
	return t[0].split(p, out)
}
