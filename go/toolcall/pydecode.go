package toolcall

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
)

// maxDepth stands in for the RecursionError Python's decoder raises on deep
// nesting (its exact depth depends on the interpreter's stack).
const maxDepth = 900

type pyDecoder struct {
	r     []rune
	depth int
}

type decodeErr uint8

const (
	decOK decodeErr = iota
	decBad
	decExtra // json.loads's "Extra data"
)

// pyLoads is json.loads over code points.
func pyLoads(r []rune) (*pyValue, decodeErr) {
	d := pyDecoder{r: r}
	i := d.ws(0)
	v, end, ok := d.value(i)
	if !ok {
		return nil, decBad
	}
	if d.ws(end) != len(r) {
		return nil, decExtra
	}
	return v, decOK
}

// pyRawDecode is JSONDecoder().raw_decode(r): one value from index 0, no
// leading whitespace allowed; end is where it stops.
func pyRawDecode(r []rune) (v *pyValue, end int, ok bool) {
	d := pyDecoder{r: r}
	return d.value(0)
}

// pyValid is json.loads succeeding.
func pyValid(s string) bool {
	_, e := pyLoads([]rune(s))
	return e == decOK
}

func (d *pyDecoder) ws(i int) int {
	for i < len(d.r) {
		switch d.r[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func (d *pyDecoder) lit(i int, s string) bool {
	if i+len(s) > len(d.r) {
		return false
	}
	for k := 0; k < len(s); k++ {
		if d.r[i+k] != rune(s[k]) {
			return false
		}
	}
	return true
}

func (d *pyDecoder) value(i int) (*pyValue, int, bool) {
	if i >= len(d.r) {
		return nil, i, false
	}
	switch c := d.r[i]; {
	case c == '"':
		s, end, ok := d.str(i + 1)
		return &pyValue{kind: pyStr, text: s}, end, ok
	case c == '{':
		return d.object(i + 1)
	case c == '[':
		return d.array(i + 1)
	case c == 'n' && d.lit(i, "null"):
		return &pyValue{kind: pyNull}, i + 4, true
	case c == 't' && d.lit(i, "true"):
		return &pyValue{kind: pyBool, b: true}, i + 4, true
	case c == 'f' && d.lit(i, "false"):
		return &pyValue{kind: pyBool}, i + 5, true
	case c == 'N' && d.lit(i, "NaN"):
		return &pyValue{kind: pyFloat, f: math.NaN()}, i + 3, true
	case c == 'I' && d.lit(i, "Infinity"):
		return &pyValue{kind: pyFloat, f: math.Inf(1)}, i + 8, true
	case c == '-' && d.lit(i, "-Infinity"):
		return &pyValue{kind: pyFloat, f: math.Inf(-1)}, i + 9, true
	}
	return d.number(i)
}

func isDigit(r rune) bool { return r >= '0' && r <= '9' }

func (d *pyDecoder) number(i int) (*pyValue, int, bool) {
	r, start := d.r, i
	if i < len(r) && r[i] == '-' {
		i++
	}
	switch {
	case i < len(r) && r[i] == '0':
		i++
	case i < len(r) && r[i] >= '1' && r[i] <= '9':
		for i < len(r) && isDigit(r[i]) {
			i++
		}
	default:
		return nil, start, false
	}
	isFloat := false
	if i+1 < len(r) && r[i] == '.' && isDigit(r[i+1]) {
		isFloat = true
		i += 2
		for i < len(r) && isDigit(r[i]) {
			i++
		}
	}
	if i < len(r) && (r[i] == 'e' || r[i] == 'E') {
		j := i + 1
		if j < len(r) && (r[j] == '+' || r[j] == '-') {
			j++
		}
		if j < len(r) && isDigit(r[j]) {
			for j < len(r) && isDigit(r[j]) {
				j++
			}
			isFloat, i = true, j
		}
	}
	text := string(r[start:i])
	if !isFloat {
		t := strings.TrimPrefix(text, "-")
		if t == "0" {
			text = "0"
		}
		return &pyValue{kind: pyInt, text: text}, i, true
	}
	// The text is well formed, so an error can only be a range one, where
	// Go's result (±Inf or 0) is Python's float() too.
	f, _ := strconv.ParseFloat(text, 64)
	return &pyValue{kind: pyFloat, f: f}, i, true
}

func hex4(r []rune, i int) (rune, bool) {
	if i+4 > len(r) {
		return 0, false
	}
	var v rune
	for _, c := range r[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v*16 + c - '0'
		case c >= 'a' && c <= 'f':
			v = v*16 + c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = v*16 + c - 'A' + 10
		default:
			return 0, false
		}
	}
	return v, true
}

// str scans a string's body from i (past the opening quote), strictly.
func (d *pyDecoder) str(i int) (string, int, bool) {
	r := d.r
	var b strings.Builder
	for {
		if i >= len(r) {
			return "", i, false
		}
		c := r[i]
		switch {
		case c == '"':
			return b.String(), i + 1, true
		case c < 0x20:
			return "", i, false
		case c != '\\':
			b.WriteRune(c)
			i++
			continue
		}
		if i+1 >= len(r) {
			return "", i, false
		}
		e := r[i+1]
		i += 2
		switch e {
		case '"', '\\', '/':
			b.WriteRune(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			u, ok := hex4(r, i)
			if !ok {
				return "", i, false
			}
			i += 4
			if u >= 0xd800 && u <= 0xdbff && i+1 < len(r) && r[i] == '\\' && r[i+1] == 'u' {
				if lo, ok := hex4(r, i+2); ok && lo >= 0xdc00 && lo <= 0xdfff {
					u = utf16.DecodeRune(u, lo)
					i += 6
				}
			}
			b.WriteRune(u) // a lone surrogate becomes U+FFFD
		default:
			return "", i, false
		}
	}
}

func (d *pyDecoder) object(i int) (*pyValue, int, bool) {
	if d.depth++; d.depth > maxDepth {
		return nil, i, false
	}
	defer func() { d.depth-- }()
	v := &pyValue{kind: pyDict, vals: map[string]*pyValue{}}
	i = d.ws(i)
	if i < len(d.r) && d.r[i] == '}' {
		return v, i + 1, true
	}
	for {
		if i >= len(d.r) || d.r[i] != '"' {
			return nil, i, false
		}
		k, end, ok := d.str(i + 1)
		if !ok {
			return nil, end, false
		}
		i = d.ws(end)
		if i >= len(d.r) || d.r[i] != ':' {
			return nil, i, false
		}
		val, end, ok := d.value(d.ws(i + 1))
		if !ok {
			return nil, end, false
		}
		v.set(k, val)
		i = d.ws(end)
		if i >= len(d.r) {
			return nil, i, false
		}
		switch d.r[i] {
		case '}':
			return v, i + 1, true
		case ',':
			i = d.ws(i + 1)
		default:
			return nil, i, false
		}
	}
}

func (d *pyDecoder) array(i int) (*pyValue, int, bool) {
	if d.depth++; d.depth > maxDepth {
		return nil, i, false
	}
	defer func() { d.depth-- }()
	v := &pyValue{kind: pyList}
	i = d.ws(i)
	if i < len(d.r) && d.r[i] == ']' {
		return v, i + 1, true
	}
	for {
		val, end, ok := d.value(i)
		if !ok {
			return nil, end, false
		}
		v.items = append(v.items, val)
		i = d.ws(end)
		if i >= len(d.r) {
			return nil, i, false
		}
		switch d.r[i] {
		case ']':
			return v, i + 1, true
		case ',':
			i = d.ws(i + 1)
		default:
			return nil, i, false
		}
	}
}
