package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"
)

type fixedLengthPre struct{ n int }

// parseFixedLengthPre parses a "FixedLength" pre-tokenizer.
func parseFixedLengthPre(kind string, raw json.RawMessage) (preTokenizer, error) {
	var v struct {
		Length *uint64 `json:"length"`
	}
	if err := decodeInto(kind, raw, &v); err != nil {
		return nil, err
	}
	n := uint64(5)
	if v.Length != nil {
		n = *v.Length
	}
	if n == 0 || n > math.MaxInt32 {
		return nil, fmt.Errorf("%s: length must be in 1..%d", kind, math.MaxInt32)
	}
	return fixedLengthPre{int(n)}, nil
}

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
