package toolcall

import (
	"strings"
	"unicode/utf16"
)

// This file models ijson's parse_coro over its yajl2_c backend, as vLLM's
// mistral parser feeds it: pieces of text go in, and each (prefix, event,
// value) comes out as soon as yajl has lexed the token that makes it (a
// number only once the character after it is seen; strings, keys and
// literals when complete). After the first error every later feed fails
// again, as a yajl handle in its error state does. Only what vLLM reads is
// kept: the event, the value of strings and keys, and the path.

type jsonEventKind uint8

const (
	evStartMap jsonEventKind = iota
	evMapKey
	evEndMap
	evStartArray
	evEndArray
	evString
	evScalar // number, boolean or null
)

// jsonEvent is one ijson event; its prefix is the path's elements joined by
// "." (array items are "item").
type jsonEvent struct {
	kind  jsonEventKind
	value string // strings and map keys
	path  []string
}

// yajl parser states (yajl_parser.c).
type yajlState uint8

const (
	ysStart yajlState = iota
	ysComplete
	ysMapStart
	ysMapNeedKey
	ysMapSep
	ysMapNeedVal
	ysMapGotVal
	ysArrayStart
	ysArrayNeedVal
	ysArrayGotVal
)

// yajl lexer states for a token cut by the end of a piece.
type yajlLex uint8

const (
	lxNone yajlLex = iota
	lxString
	lxLiteral
	lxNumber
)

type yajl struct {
	stack []yajlState
	path  []string
	bad   bool

	lex     yajlLex
	str     strings.Builder // a string's decoded value so far
	esc     int             // 0; 1 after '\'; 2.. in \uXXXX (digits read + 2)
	hex     rune
	pending rune // a high surrogate from \uXXXX waiting for its pair (0: none)
	lowOnly bool // a lone low surrogate: the value cannot be decoded
	lit     string
	num     numLex
	on      func(jsonEvent)
}

// numLex is yajl_lex_number's progress.
type numLex uint8

const (
	nmMinus    numLex = iota // after '-'
	nmZero                   // after the leading 0
	nmInt                    // in 1-9 digits
	nmDot                    // after '.'
	nmFrac                   // in fraction digits
	nmExp                    // after e/E
	nmExpSign                // after e+/e-
	nmExpDigit               // in exponent digits
)

func newYajl() *yajl { return &yajl{stack: []yajlState{ysStart}} }

// feed parses one piece, handing each event to on as yajl emits it; ok is
// false when yajl fails in the piece (after the events before the failure)
// or failed before. An event's path is only valid during the call.
func (y *yajl) feed(text string, on func(jsonEvent)) (ok bool) {
	if y.bad {
		return false
	}
	y.on = on
	defer func() { y.on = nil }()
	for _, c := range text {
		if !y.char(c) {
			y.bad = true
			return false
		}
	}
	return true
}

func (y *yajl) top() yajlState  { return y.stack[len(y.stack)-1] }
func (y *yajl) set(s yajlState) { y.stack[len(y.stack)-1] = s }
func (y *yajl) emit(k jsonEventKind, v string) {
	y.on(jsonEvent{kind: k, value: v, path: y.path})
}

// char lexes one code point.
func (y *yajl) char(c rune) bool {
	switch y.lex {
	case lxString:
		return y.strChar(c)
	case lxLiteral:
		if c != rune(y.lit[0]) {
			return false
		}
		y.lit = y.lit[1:]
		if y.lit == "" {
			y.lex = lxNone
			return y.token(tokScalar)
		}
		return true
	case lxNumber:
		done, ok := y.numChar(c)
		if !ok {
			return false
		}
		if !done {
			return true
		}
		y.lex = lxNone
		if !y.token(tokScalar) {
			return false
		}
		// yajl always reads one past a number: lex that character now.
	}
	switch c {
	case '\t', '\n', '\v', '\f', '\r', ' ':
		return true
	case '{':
		return y.token(tokLBrace)
	case '}':
		return y.token(tokRBrace)
	case '[':
		return y.token(tokLBracket)
	case ']':
		return y.token(tokRBracket)
	case ',':
		return y.token(tokComma)
	case ':':
		return y.token(tokColon)
	case '"':
		y.lex, y.esc, y.pending, y.lowOnly = lxString, 0, 0, false
		y.str.Reset()
		return true
	case 't':
		y.lex, y.lit = lxLiteral, "rue"
		return true
	case 'f':
		y.lex, y.lit = lxLiteral, "alse"
		return true
	case 'n':
		y.lex, y.lit = lxLiteral, "ull"
		return true
	case '-':
		y.lex, y.num = lxNumber, nmMinus
		return true
	}
	if c >= '0' && c <= '9' {
		y.lex, y.num = lxNumber, nmInt
		if c == '0' {
			y.num = nmZero
		}
		return true
	}
	return false // invalid char in json text (comments included)
}

// numChar advances a number; done reports that c is past its end.
func (y *yajl) numChar(c rune) (done, ok bool) {
	digit := c >= '0' && c <= '9'
	switch y.num {
	case nmMinus:
		if !digit {
			return false, false
		}
		y.num = nmInt
		if c == '0' {
			y.num = nmZero
		}
		return false, true
	case nmZero, nmInt, nmFrac:
		switch {
		case digit && y.num != nmZero:
		case c == '.' && y.num != nmFrac:
			y.num = nmDot
		case c == 'e' || c == 'E':
			y.num = nmExp
		default:
			return true, true
		}
		return false, true
	case nmDot:
		if !digit {
			return false, false
		}
		y.num = nmFrac
		return false, true
	case nmExp:
		if c == '+' || c == '-' {
			y.num = nmExpSign
			return false, true
		}
		fallthrough
	case nmExpSign:
		if !digit {
			return false, false
		}
		y.num = nmExpDigit
		return false, true
	}
	if digit { // nmExpDigit
		return false, true
	}
	return true, true
}

func (y *yajl) strChar(c rune) bool {
	switch {
	case y.esc == 1:
		y.esc = 0
		if c == 'u' {
			y.esc, y.hex = 2, 0
			return true
		}
		i := strings.IndexRune(`"\/bfnrt`, c)
		if i < 0 {
			return false
		}
		y.put(rune("\"\\/\b\f\n\r\t"[i]))
		return true
	case y.esc >= 2:
		h, ok := hexVal(c)
		if !ok {
			return false
		}
		y.hex = y.hex<<4 | h
		if y.esc++; y.esc == 6 {
			y.esc = 0
			y.putEscaped(y.hex)
		}
		return true
	case c == '\\':
		y.esc = 1
		return true
	case c == '"':
		y.flushSurrogate()
		y.lex = lxNone
		return !y.lowOnly && y.token(tokString) // ijson fails to decode a lone low surrogate
	case c < 0x20:
		return false // invalid character inside string
	}
	y.put(c)
	return true
}

func hexVal(c rune) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func (y *yajl) put(r rune) {
	y.flushSurrogate()
	y.str.WriteRune(r)
}

// putEscaped writes a \uXXXX code unit: a high surrogate waits for a low
// one to pair with; one left alone is '?', as yajl writes it; a lone low
// one makes the string fail.
func (y *yajl) putEscaped(u rune) {
	switch {
	case u >= 0xD800 && u < 0xDC00:
		y.flushSurrogate()
		y.pending = u
	case u >= 0xDC00 && u < 0xE000 && y.pending != 0:
		y.str.WriteRune(utf16.DecodeRune(y.pending, u))
		y.pending = 0
	case u >= 0xDC00 && u < 0xE000:
		y.flushSurrogate()
		y.lowOnly = true
	default:
		y.put(u)
	}
}

func (y *yajl) flushSurrogate() {
	if y.pending != 0 {
		y.pending = 0
		y.str.WriteByte('?')
	}
}

type yajlTok uint8

const (
	tokLBrace yajlTok = iota
	tokRBrace
	tokLBracket
	tokRBracket
	tokComma
	tokColon
	tokString
	tokScalar
)

// token is yajl_do_parse's step for one complete token.
func (y *yajl) token(t yajlTok) bool {
	switch s := y.top(); s {
	case ysComplete:
		return false // trailing garbage
	case ysMapStart, ysMapNeedKey:
		if t == tokString {
			y.emitKey(y.str.String())
			y.set(ysMapSep)
			return true
		}
		if t == tokRBrace && s == ysMapStart {
			y.endMap()
			return true
		}
		return false
	case ysMapSep:
		if t != tokColon {
			return false
		}
		y.set(ysMapNeedVal)
		return true
	case ysMapGotVal, ysArrayGotVal:
		switch {
		case t == tokComma && s == ysMapGotVal:
			y.set(ysMapNeedKey)
		case t == tokComma:
			y.set(ysArrayNeedVal)
		case t == tokRBrace && s == ysMapGotVal:
			y.endMap()
		case t == tokRBracket && s == ysArrayGotVal:
			y.endArray()
		default:
			return false
		}
		return true
	}
	return y.value(t)
}

// value is a token where a value is expected.
func (y *yajl) value(t yajlTok) bool {
	s := y.top()
	var push yajlState
	switch t {
	case tokString:
		y.emit(evString, y.str.String())
	case tokScalar:
		y.emit(evScalar, "")
	case tokLBrace:
		y.emit(evStartMap, "")
		push = ysMapStart
	case tokLBracket:
		y.emit(evStartArray, "")
		push = ysArrayStart
	case tokRBracket:
		if s != ysArrayStart {
			return false
		}
		y.endArray()
		return true
	default:
		return false
	}
	switch s {
	case ysStart:
		y.set(ysComplete)
	case ysMapNeedVal:
		y.set(ysMapGotVal)
	default:
		y.set(ysArrayGotVal)
	}
	if push == ysMapStart {
		y.stack = append(y.stack, push)
		y.path = append(y.path, "")
	} else if push == ysArrayStart {
		y.stack = append(y.stack, push)
		y.path = append(y.path, "item")
	}
	return true
}

// emitKey sends map_key with the map's own prefix, then names the path's
// last element.
func (y *yajl) emitKey(k string) {
	y.on(jsonEvent{kind: evMapKey, value: k, path: y.path[:len(y.path)-1]})
	y.path[len(y.path)-1] = k
}

func (y *yajl) endMap() {
	y.stack = y.stack[:len(y.stack)-1]
	y.path = y.path[:len(y.path)-1]
	y.emit(evEndMap, "")
}

func (y *yajl) endArray() {
	y.stack = y.stack[:len(y.stack)-1]
	y.path = y.path[:len(y.path)-1]
	y.emit(evEndArray, "")
}

// prefixIs reports whether '.'.join(path) == want, without joining.
func prefixIs(path []string, want string) bool {
	if len(path) == 0 {
		return want == ""
	}
	for i, p := range path {
		if i > 0 {
			if want == "" || want[0] != '.' {
				return false
			}
			want = want[1:]
		}
		if !strings.HasPrefix(want, p) {
			return false
		}
		want = want[len(p):]
	}
	return want == ""
}
