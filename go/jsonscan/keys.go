package jsonscan

import (
	"encoding/json"
	"unicode/utf8"
)

// Keys is a set of up to MaxKeys member names, each ASCII, that a reader
// must find named exactly: the field names of the types encoding/json
// decodes a text into.
type Keys struct {
	names  []string
	index  map[string]int // name -> its index in names
	folded map[string]int // a name's foldASCII form -> its index
	maxLen int            // the longest name's length
}

// MaxKeys bounds the names of a Keys (Seen holds that many).
const MaxKeys = 64 * len(Seen{})

// NewKeys returns the set of names, each known by its index in names. It
// panics for more than MaxKeys names, a name given twice, or one outside
// ASCII: a program's field names, so a bug.
func NewKeys(names ...string) *Keys {
	if len(names) > MaxKeys {
		panic("jsonscan: more than MaxKeys keys")
	}
	k := &Keys{names: names, index: map[string]int{}, folded: map[string]int{}}
	for i, name := range names {
		if _, dup := k.index[name]; dup {
			panic("jsonscan: the key " + name + " given twice")
		}
		f, ok := foldASCII(nil, []byte(name))
		if !ok || len(f) != len(name) {
			panic("jsonscan: the key " + name + " is not ASCII")
		}
		k.index[name] = i
		k.folded[string(f)] = i
		k.maxLen = max(k.maxLen, len(name))
	}
	return k
}

// Name is the name of index i.
func (k *Keys) Name(i int) string { return k.names[i] }

// Seen is the set of keys one object has named so far, by index: a zero
// Seen for each object.
type Seen [2]uint64

// Match is what a member's name is to a Keys.
type Match int

const (
	// Other: not a key, and equal to none up to case. encoding/json
	// ignores the member; so may the reader.
	Other Match = iota
	// Exact: a key, named for the first time in its object.
	Exact
	// Duplicate: a key that its object named before. encoding/json takes
	// the last value, an exact reader perhaps the first.
	Duplicate
	// Folded: not a key, but equal to one up to case (strings.EqualFold).
	// encoding/json reads it as that key, an exact reader does not.
	Folded
)

// Match says what name (a member's name, decoded) is, and which key it
// names (-1 for Other). seen is the set of keys that name's object named
// before it; an Exact match is added to it.
func (k *Keys) Match(name []byte, seen *Seen) (Match, int) {
	var fold [64]byte
	return k.match(name, seen, fold[:0])
}

// match is Match with fold a buffer for the folded name (it grows past its
// capacity).
func (k *Keys) match(name []byte, seen *Seen, fold []byte) (Match, int) {
	if i, ok := k.index[string(name)]; ok {
		if seen[i/64]&(1<<(i%64)) != 0 {
			return Duplicate, i
		}
		seen[i/64] |= 1 << (i % 64)
		return Exact, i
	}
	// A rune that folds to an ASCII letter is at most 3 bytes long.
	if len(name) > 3*k.maxLen {
		return Other, -1
	}
	if f, ok := foldASCII(fold, name); ok {
		if i, ok := k.folded[string(f)]; ok {
			return Folded, i
		}
	}
	return Other, -1
}

// Problem is a member name that a reader matching names exactly reads
// differently from encoding/json.
type Problem struct {
	Match Match  // Duplicate or Folded
	Key   int    // the key it names (Keys.Name)
	Name  []byte // the name as given, decoded
}

// Check looks at the member names of every object in b, at any depth, b
// being valid JSON (json.Valid), and returns the first that is a Duplicate
// or Folded match of k (each object has its own Seen), or false if none
// is. It reads b once.
func (k *Keys) Check(b []byte) (Problem, bool) {
	type frame struct {
		object, wantName bool
		seen             Seen
	}
	stack := make([]frame, 0, 8)
	var fold [64]byte // 3*maxLen, allocated past it
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !checked[c] {
			continue
		}
		switch c {
		case '{':
			stack = append(stack, frame{object: true, wantName: true})
		case '[':
			stack = append(stack, frame{})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.wantName = true
			}
		case '"':
			end, escaped := StringEnd(b, i+1)
			if top := len(stack) - 1; top >= 0 && stack[top].wantName {
				stack[top].wantName = false
				name := b[i+1 : end]
				if escaped {
					var s string
					if json.Unmarshal(b[i:end+1], &s) != nil {
						return Problem{}, false // not valid JSON after all: encoding/json says so
					}
					name = []byte(s)
				}
				if m, key := k.match(name, &stack[top].seen, fold[:0]); m == Duplicate || m == Folded {
					return Problem{Match: m, Key: key, Name: name}, true
				}
			}
			i = end
		}
	}
	return Problem{}, false
}

// checked marks the bytes Check acts on.
var checked = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true, ',': true}

// foldASCII appends name in upper case, and reports whether it may fold
// (strings.EqualFold) to an ASCII name at all: the only runes outside ASCII
// that fold to ASCII ones are the Kelvin sign (k) and the long s (s)
// (TestOnlyTwoRunesFoldToASCII).
func foldASCII(out, name []byte) ([]byte, bool) {
	for i := 0; i < len(name); {
		c := name[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(name[i:])
		switch r {
		case '\u212a':
			out = append(out, 'K')
		case '\u017f':
			out = append(out, 'S')
		default:
			return out, false
		}
		i += size
	}
	return out, true
}
