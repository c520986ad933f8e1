package tokenizer

type byteLevelNormalizer struct{}

func (byteLevelNormalizer) normalize(s string) (string, error) { return byteLevelMap(s), nil }
