package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character classes, each named after the definition the Hugging Face
// tokenizers format relies on for it.

// isWhitespace is the Unicode White_Space property: what `\s` matches in
// the format's regexes and what the whitespace splitters and strippers use.
func isWhitespace(r rune) bool { return unicode.IsSpace(r) }

// isLetter is `\p{L}`.
func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

// isNumber is `\p{N}` (Nd, Nl and No): also what the Digits pre-tokenizer
// calls numeric.
func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// isAlphabetic is the Unicode Alphabetic property.
func isAlphabetic(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) ||
		unicode.In(r, unicode.Other_Alphabetic, unicode.Other_Lowercase, unicode.Other_Uppercase)
}

// isWordChar is `\w` of the patterns the format evaluates with a
// Unicode-aware linear regex engine (the Whitespace pre-tokenizer and the
// single_word test of added tokens): Alphabetic, marks, decimal numbers,
// connector punctuation and the two join controls.
func isWordChar(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_'
	}
	return isAlphabetic(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D
}

// isASCIIPunct is the ASCII punctuation set (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~).
func isASCIIPunct(r rune) bool {
	return r >= '!' && r <= '/' || r >= ':' && r <= '@' || r >= '[' && r <= '`' || r >= '{' && r <= '~'
}

// isPunct is what the Punctuation and Bert pre-tokenizers split on: ASCII
// punctuation or any Unicode P* category.
func isPunct(r rune) bool { return isASCIIPunct(r) || unicode.IsPunct(r) }

// isOther is the C* categories, unassigned code points included.
func isOther(r rune) bool {
	if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs) {
		return true
	}
	return !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z)
}

// appendLower appends the full lowercase mapping of r: the simple mapping,
// except U+0130, whose lowercase is two code points.
func appendLower(b []byte, r rune) []byte {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return append(b, byte(r))
	}
	if r == 0x130 {
		return append(b, "i\u0307"...)
	}
	return utf8.AppendRune(b, unicode.ToLower(r))
}

// firstRuneLen is the byte length of the first character of s (0 if empty).
func firstRuneLen(s string) int {
	if s == "" {
		return 0
	}
	if s[0] < utf8.RuneSelf {
		return 1
	}
	_, n := utf8.DecodeRuneInString(s)
	return n
}
