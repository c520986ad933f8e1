package tokenizer

import (
	"strings"
	"sync"
	"unicode/utf8"
)

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

type splitPre struct {
	m      matcher
	b      behavior
	invert bool
}

func (t splitPre) split(p piece, out sink) error {
	p = textOf(p)
	return splitWith(p.s, t.m, t.invert, t.b, emitRanges(p, out))
}

type byteLevelPre struct{ addPrefixSpace, useRegex bool }

var gpt2Scanner = scanMatcher{gpt2Next}

var byteLevelBufs = sync.Pool{New: func() any { return new([]byte) }}

func (t byteLevelPre) split(p piece, out sink) error {
	p = textOf(p)
	if t.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
		if p.lead > 0 {
			p.lead++
		}
	}
	if !t.useRegex {
		if p.s == "" {
			return nil
		}
		return putByteLevel(p, out)
	}
	return splitWith(p.s, gpt2Scanner, false, behIsolated, func(start, end int) error {
		return putByteLevel(p.sub(start, end), out)
	})
}

// putByteLevel gives out p spelled in the byte-level alphabet.
func putByteLevel(p piece, out sink) error {
	bp := byteLevelBufs.Get().(*[]byte)
	defer func() {
		if cap(*bp) <= 1<<16 { // huge buffers are not kept
			byteLevelBufs.Put(bp)
		}
	}()
	if p.lead > 0 {
		p.lead = byteLevelLen(p.s[:p.lead])
	}
	*bp = appendByteLevel((*bp)[:0], p.s)
	p.b, p.s = *bp, ""
	return out.put(p)
}

type prependScheme uint8

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

type metaspacePre struct {
	rep         rune
	repStr      string
	scheme      prependScheme
	splitPieces bool
}

func (t metaspacePre) split(p piece, out sink) error {
	p = textOf(p)
	if strings.IndexByte(p.s, ' ') >= 0 {
		if p.lead > 0 {
			p.lead = len(strings.ReplaceAll(p.s[:p.lead], " ", t.repStr))
		}
		p.s = strings.ReplaceAll(p.s, " ", t.repStr)
	}
	if !strings.HasPrefix(p.s, t.repStr) && (t.scheme == prependAlways || t.scheme == prependFirst && p.lead > 0) {
		p.s = t.repStr + p.s
		if p.lead > 0 {
			p.lead += len(t.repStr)
		}
	}
	if !t.splitPieces {
		if p.s == "" {
			return nil
		}
		return out.put(p)
	}
	rep := t.rep
	return splitWith(p.s, charMatcher{func(r rune) bool { return r == rep }}, false, behMergedWithNext, emitRanges(p, out))
}

type whitespacePre struct{}

func (whitespacePre) split(p piece, out sink) error {
	p = textOf(p)
	return whitespaceSplit(p.s, emitRanges(p, out))
}

// charSplitPre splits on the characters pred accepts.
type charSplitPre struct {
	pred func(rune) bool
	b    behavior
}

func (t charSplitPre) split(p piece, out sink) error {
	p = textOf(p)
	return splitWith(p.s, charMatcher{t.pred}, false, t.b, emitRanges(p, out))
}

type fixedLengthPre struct{ n int }

func (t fixedLengthPre) split(p piece, out sink) error {
	p = textOf(p)
	start, count := 0, 0
	for i := 0; i < len(p.s); {
		_, w := utf8.DecodeRuneInString(p.s[i:])
		i += w
		count++
		if count == t.n || i == len(p.s) {
			if err := out.put(p.sub(start, i)); err != nil {
				return err
			}
			start, count = i, 0
		}
	}
	return nil
}

type sequencePre []preTokenizer

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
