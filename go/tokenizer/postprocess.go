package tokenizer

// postProcessor adds the special tokens of a single sequence.
type postProcessor interface {
	process(ids []int, addSpecial bool) []int
	// added is how many tokens process adds with addSpecial.
	added() int
}

type byteLevelPost struct{}

func (byteLevelPost) process(ids []int, _ bool) []int { return ids }
func (byteLevelPost) added() int                      { return 0 }

type templatePiece struct {
	seq bool  // the sequence itself
	ids []int // else a special token's ids
}

type templatePost []templatePiece

func (t templatePost) process(ids []int, addSpecial bool) []int {
	if len(t) == 1 && t[0].seq {
		return ids
	}
	out := make([]int, 0, len(ids)+t.added())
	for _, p := range t {
		switch {
		case p.seq:
			out = append(out, ids...)
		case addSpecial:
			out = append(out, p.ids...)
		}
	}
	return out
}

func (t templatePost) added() int {
	n := 0
	for _, p := range t {
		n += len(p.ids)
	}
	return n
}

// clsSepPost is Bert and Roberta processing: [cls] sequence [sep].
type clsSepPost struct{ cls, sep int }

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

type sequencePost []postProcessor

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
