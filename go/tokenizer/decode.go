package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// decoder turns the tokens of ids back into text pieces; Decode joins
// what the decoder chain returns. A decoder that reassembles bytes sets
// *pending when the text ends with bytes of a character that more tokens
// could complete (they are decoded as U+FFFD meanwhile).
type decoder interface {
	decodeChain(toks []string, pending *bool) []string
}

type byteLevelDecoder struct{}

func (byteLevelDecoder) decodeChain(toks []string, pending *bool) []string {
	n := 0
	for _, t := range toks {
		n += len(t)
	}
	b := make([]byte, 0, n)
	for _, t := range toks {
		mark := len(b)
		ok := true
		for _, r := range t {
			c, in := byteOf(r)
			if !in {
				ok = false
				break
			}
			b = append(b, c)
		}
		if !ok { // not byte-level text: taken as it is
			b = append(b[:mark], t...)
		}
	}
	*pending = incompleteTail(b)
	if utf8.Valid(b) {
		return []string{string(b)}
	}
	return []string{string(appendLossy(make([]byte, 0, len(b)+8), b))}
}

type metaspaceDecoder struct {
	rep    rune
	scheme prependScheme
}

// mapTokens returns the result of f on each token (i is its index).
func mapTokens(toks []string, f func(i int, t string) string) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = f(i, t)
	}
	return out
}

func (d metaspaceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		var b strings.Builder
		for _, r := range t {
			switch {
			case r != d.rep:
				b.WriteRune(r)
			case i == 0 && d.scheme != prependNever:
			default:
				b.WriteByte(' ')
			}
		}
		return b.String()
	})
}

type replaceDecoder struct {
	m       matcher
	content string
}

func (d replaceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(_ int, t string) string {
		// A literal or built-in pattern cannot fail; a regex that times
		// out leaves the token as it is.
		r, err := replaceAll(t, d.m, d.content)
		if err != nil {
			return t
		}
		return r
	})
}

type byteFallbackDecoder struct{}

// byteToken parses a "<0xXX>" token.
func byteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	h := t[3:5]
	if h[0] == '+' { // an unsigned integer parse also accepts a plus sign
		h = h[1:]
	}
	var v byte
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

func (byteFallbackDecoder) decodeChain(toks []string, pending *bool) []string {
	out := make([]string, 0, len(toks))
	var bytes []byte
	flush := func(last bool) {
		if len(bytes) == 0 {
			return
		}
		if utf8.Valid(bytes) {
			out = append(out, string(bytes))
		} else {
			for range bytes {
				out = append(out, "\uFFFD")
			}
			if last && validUpToIncompleteTail(bytes) {
				*pending = true
			}
		}
		bytes = bytes[:0]
	}
	for _, t := range toks {
		if b, ok := byteToken(t); ok {
			bytes = append(bytes, b)
			continue
		}
		flush(false)
		out = append(out, t)
	}
	flush(true)
	return out
}

type fuseDecoder struct{}

func (fuseDecoder) decodeChain(toks []string, _ *bool) []string {
	return []string{strings.Join(toks, "")}
}

type stripDecoder struct {
	content     rune
	start, stop int
}

func (d stripDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(_ int, t string) string {
		rs := []rune(t)
		lo := 0
		for lo < len(rs) && lo < d.start && rs[lo] == d.content {
			lo++
		}
		hi := len(rs)
		for k := 0; k < d.stop && hi > lo && rs[hi-1] == d.content; k++ {
			hi--
		}
		return string(rs[lo:hi])
	})
}

type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

var cleanupReplacer = []struct{ from, to string }{
	{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
	{" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
}

func cleanupText(s string) string {
	for _, r := range cleanupReplacer {
		s = strings.ReplaceAll(s, r.from, r.to)
	}
	return s
}

func (d wordPieceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		if i != 0 {
			if rest, ok := strings.CutPrefix(t, d.prefix); ok {
				t = rest
			} else {
				t = " " + t
			}
		}
		if d.cleanup {
			t = cleanupText(t)
		}
		return t
	})
}

type bpeDecoder struct{ suffix string }

func (d bpeDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		rep := " "
		if i == len(toks)-1 {
			rep = ""
		}
		if d.suffix != "" {
			t = strings.ReplaceAll(t, d.suffix, rep)
		}
		return t
	})
}

type ctcDecoder struct {
	pad, delim string
	cleanup    bool
}

func (d ctcDecoder) decodeChain(toks []string, _ *bool) []string {
	var out []string
	for i, t := range toks {
		if i > 0 && t == toks[i-1] {
			continue
		}
		if d.pad != "" {
			t = strings.ReplaceAll(t, d.pad, "")
		}
		if d.cleanup {
			t = cleanupText(t)
			if d.delim != "" {
				t = strings.ReplaceAll(t, d.delim, " ")
			}
		}
		if t != "" {
			out = append(out, t)
		}
	}
	return out
}

type sequenceDecoder []decoder

func (d sequenceDecoder) decodeChain(toks []string, pending *bool) []string {
	for _, x := range d {
		toks = x.decodeChain(toks, pending)
	}
	return toks
}
