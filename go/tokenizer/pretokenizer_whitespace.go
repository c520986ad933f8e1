package tokenizer

type whitespacePre struct{}

func (whitespacePre) split(p piece, out sink) error {
	p = textOf(p)
	return whitespaceSplit(p.s, emitRanges(p, out))
}
