package ctxtree

import (
	"crypto/rand"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// The id rule: a context's id is its request's id on every hop (the HTTP
// frontend takes it from x-request-id, the plane carries it to each worker,
// migration keeps it), so one rule bounds both, here, and every layer asks
// ValidateID: the plane, the C ABI (dc_context_new, dc_id_check), and through
// it Python's Context(id=...).

// MaxIDLen bounds an id, in bytes of UTF-8.
const MaxIDLen = 256

// IDRule is the rule in words, for messages.
const IDRule = "1 to 256 bytes of printable UTF-8"

// ErrInvalidID: an id that breaks the rule. ValidateID's errors wrap it.
var ErrInvalidID = errors.New("invalid id")

// ValidateID checks an id: 1 to MaxIDLen bytes of valid UTF-8 whose every
// rune is printable (unicode.IsPrint: letters, marks, numbers, punctuation,
// symbols and the ASCII space; no control, format or other space
// characters). The error wraps ErrInvalidID and says what is wrong and the
// rule. It allocates nothing for a valid id.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: it is empty; an id is %s", ErrInvalidID, IDRule)
	case len(id) > MaxIDLen:
		return fmt.Errorf("%w: it is %d bytes long; an id is %s", ErrInvalidID, len(id), IDRule)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: it is not valid UTF-8; an id is %s", ErrInvalidID, IDRule)
	}
	for i, r := range id {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %U at byte %d is not printable; an id is %s", ErrInvalidID, r, i, IDRule)
		}
	}
	return nil
}

// NewID returns a random (version 4) UUID in its canonical text form, the id
// of a request that arrived without one.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, x := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hexd[x>>4], hexd[x&0xf])
	}
	return string(out)
}
