package engineout

import (
	"encoding/binary"
	"math"
)

// reader reads the few MessagePack forms an engine output's known fields
// take, and skips any value. Each method reports false, and consumes
// nothing it could not read, on input that is not the form asked for or is
// cut short.
type reader struct {
	b []byte
	i int
}

// maxDepth bounds skip's nesting: a message of nested arrays costs its
// bytes, never a stack.
const maxDepth = 64

func (r *reader) done() bool { return r.i >= len(r.b) }

func (r *reader) peek() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	return r.b[r.i], true
}

// need reports whether n more bytes follow the header of h bytes at r.i.
func (r *reader) need(h int, n uint64) bool {
	return uint64(len(r.b)-r.i) >= uint64(h) && uint64(len(r.b)-r.i-h) >= n
}

// size reads the big-endian length of w bytes after the tag at r.i.
func (r *reader) size(w int) (uint64, bool) {
	if !r.need(1, uint64(w)) {
		return 0, false
	}
	p := r.b[r.i+1:]
	switch w {
	case 1:
		return uint64(p[0]), true
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), true
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), true
	default:
		return binary.BigEndian.Uint64(p), true
	}
}

// nil reads a nil.
func (r *reader) nil() bool {
	if c, ok := r.peek(); ok && c == 0xc0 {
		r.i++
		return true
	}
	return false
}

// array reads an array's header and returns its length.
func (r *reader) array() (int, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	var n uint64
	var h int
	switch {
	case c >= 0x90 && c <= 0x9f:
		n, h = uint64(c&0x0f), 1
	case c == 0xdc:
		n, ok = r.size(2)
		h = 3
	case c == 0xdd:
		n, ok = r.size(4)
		h = 5
	default:
		return 0, false
	}
	// Each element takes a byte at least: a length past the input is a lie.
	if !ok || !r.need(h, n) {
		return 0, false
	}
	r.i += h
	return int(n), true
}

// str reads a string's bytes (aliasing the input).
func (r *reader) str() ([]byte, bool) {
	c, ok := r.peek()
	if !ok {
		return nil, false
	}
	var n uint64
	var h int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n, h = uint64(c&0x1f), 1
	case c == 0xd9:
		n, ok = r.size(1)
		h = 2
	case c == 0xda:
		n, ok = r.size(2)
		h = 3
	case c == 0xdb:
		n, ok = r.size(4)
		h = 5
	default:
		return nil, false
	}
	if !ok || !r.need(h, n) {
		return nil, false
	}
	s := r.b[r.i+h : r.i+h+int(n)]
	r.i += h + int(n)
	return s, true
}

// int reads an integer that fits an int64.
func (r *reader) int() (int64, bool) {
	c, ok := r.peek()
	if !ok {
		return 0, false
	}
	switch {
	case c <= 0x7f:
		r.i++
		return int64(c), true
	case c >= 0xe0:
		r.i++
		return int64(int8(c)), true
	}
	var w int
	signed := false
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		w = 1 << (c - 0xcc)
	case 0xd0, 0xd1, 0xd2, 0xd3:
		w, signed = 1<<(c-0xd0), true
	default:
		return 0, false
	}
	u, ok := r.size(w)
	if !ok {
		return 0, false
	}
	var v int64
	if signed {
		switch w {
		case 1:
			v = int64(int8(u))
		case 2:
			v = int64(int16(u))
		case 4:
			v = int64(int32(u))
		default:
			v = int64(u)
		}
	} else {
		if u > math.MaxInt64 {
			return 0, false
		}
		v = int64(u)
	}
	r.i += 1 + w
	return v, true
}

// skip skips one value of any form.
func (r *reader) skip() bool { return r.skipDepth(0) }

func (r *reader) skipDepth(depth int) bool {
	c, ok := r.peek()
	if !ok || depth > maxDepth {
		return false
	}
	var items uint64 // elements to skip after the header
	var n uint64     // bytes to skip after the header
	h := 1
	switch {
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
	case c >= 0x80 && c <= 0x8f:
		items = 2 * uint64(c&0x0f)
	case c >= 0x90 && c <= 0x9f:
		items = uint64(c & 0x0f)
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
	case c == 0xc4, c == 0xd9: // bin 8, str 8
		n, ok = r.size(1)
		h = 2
	case c == 0xc5, c == 0xda: // bin 16, str 16
		n, ok = r.size(2)
		h = 3
	case c == 0xc6, c == 0xdb: // bin 32, str 32
		n, ok = r.size(4)
		h = 5
	case c == 0xc7: // ext 8: size, type, data
		n, ok = r.size(1)
		n++
		h = 2
	case c == 0xc8:
		n, ok = r.size(2)
		n++
		h = 3
	case c == 0xc9:
		n, ok = r.size(4)
		n++
		h = 5
	case c == 0xca:
		n = 4
	case c == 0xcb:
		n = 8
	case c >= 0xcc && c <= 0xcf:
		n = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		n = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8: // fixext: type and 1, 2, 4, 8 or 16 bytes
		n = 1 + 1<<(c-0xd4)
	case c == 0xdc:
		items, ok = r.size(2)
		h = 3
	case c == 0xdd:
		items, ok = r.size(4)
		h = 5
	case c == 0xde:
		items, ok = r.size(2)
		items *= 2
		h = 3
	case c == 0xdf:
		items, ok = r.size(4)
		items *= 2
		h = 5
	default: // 0xc1, never used
		return false
	}
	if !ok || !r.need(h, n) || !r.need(h, items) {
		return false
	}
	start := r.i
	r.i += h + int(n)
	for ; items > 0; items-- {
		if !r.skipDepth(depth + 1) {
			r.i = start
			return false
		}
	}
	return true
}
