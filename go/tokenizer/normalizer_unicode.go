package tokenizer

import "golang.org/x/text/unicode/norm"

type unicodeNormalizer struct{ form norm.Form }

func (n unicodeNormalizer) normalize(s string) (string, error) { return n.form.String(s), nil }
