package tokenizer

import "unicode/utf8"

// seqWidth is the length of the UTF-8 sequence a lead byte starts (0: not
// a lead byte), and validSecond the range its second byte must fall in.
func seqWidth(b byte) int {
	switch {
	case b < 0x80:
		return 1
	case b >= 0xC2 && b <= 0xDF:
		return 2
	case b >= 0xE0 && b <= 0xEF:
		return 3
	case b >= 0xF0 && b <= 0xF4:
		return 4
	}
	return 0
}

func validSecond(lead, b byte) bool {
	lo, hi := byte(0x80), byte(0xBF)
	switch lead {
	case 0xE0:
		lo = 0xA0
	case 0xED:
		hi = 0x9F
	case 0xF0:
		lo = 0x90
	case 0xF4:
		hi = 0x8F
	}
	return b >= lo && b <= hi
}

// appendLossy appends b to dst as valid UTF-8, each maximal ill-formed
// subsequence replaced by one U+FFFD (the Unicode "maximal subpart"
// practice, which is what the format's decoders do).
func appendLossy(dst, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		w := seqWidth(c)
		if w == 0 {
			dst = append(dst, "\uFFFD"...)
			i++
			continue
		}
		j := i + 1
		ok := true
		for k := 1; k < w; k++ {
			if j >= len(b) {
				ok = false
				break
			}
			if k == 1 && !validSecond(c, b[j]) || k > 1 && (b[j] < 0x80 || b[j] > 0xBF) {
				ok = false
				break
			}
			j++
		}
		if ok {
			dst = append(dst, b[i:j]...)
		} else {
			dst = append(dst, "\uFFFD"...)
		}
		i = j
	}
	return dst
}

// lossyString is string(appendLossy(nil, []byte(s))), without copying
// when s is already valid.
func lossyString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(appendLossy(make([]byte, 0, len(s)+8), []byte(s)))
}

// incompleteTail reports whether b ends with a proper prefix of a
// well-formed UTF-8 sequence: bytes that more bytes could complete.
func incompleteTail(b []byte) bool {
	for back := 1; back <= 3 && back <= len(b); back++ {
		i := len(b) - back
		c := b[i]
		if c >= 0x80 && c < 0xC0 {
			continue // continuation byte: the lead is further back
		}
		w := seqWidth(c)
		if w <= back {
			return false
		}
		for k := 1; k < back; k++ {
			if k == 1 && !validSecond(c, b[i+1]) || k > 1 && (b[i+k] < 0x80 || b[i+k] > 0xBF) {
				return false
			}
		}
		return true
	}
	return false
}

// validUpToIncompleteTail reports whether b is valid UTF-8 but for an
// incomplete sequence at its end.
func validUpToIncompleteTail(b []byte) bool {
	if !incompleteTail(b) {
		return false
	}
	i := len(b) - 1
	for i > 0 && b[i] >= 0x80 && b[i] < 0xC0 {
		i--
	}
	return utf8.Valid(b[:i])
}
