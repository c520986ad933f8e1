package tokenizer

import "unicode/utf8"

// The byte-level alphabet: every byte is represented by a printable
// character (the printable Latin-1 bytes by themselves, the others by the
// code points from U+0100 up, in byte order).
var (
	byteToRune [256]rune
	runeToByte [324]int16 // -1: not in the alphabet
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = int16(b)
	}
}

// byteLevelMap spells each byte of s as its byte-level character.
func byteLevelMap(s string) string {
	return string(appendByteLevel(make([]byte, 0, 2*len(s)), s))
}

func appendByteLevel(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		r := byteToRune[s[i]]
		if r < utf8.RuneSelf {
			b = append(b, byte(r))
		} else {
			b = append(b, byte(0xC0|r>>6), byte(0x80|r&0x3F))
		}
	}
	return b
}

// byteOf is the byte a byte-level character stands for.
func byteOf(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
		return 0, false
	}
	return byte(runeToByte[r]), true
}

// byteLevelLen is len(byteLevelMap(s)).
func byteLevelLen(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if byteToRune[s[i]] < utf8.RuneSelf {
			n++
		} else {
			n += 2
		}
	}
	return n
}
