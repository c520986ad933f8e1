package tokens

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Items built from the pieces of the shape the fast path reads, each piece
// sometimes replaced by a near miss (another spelling of a key, a number
// encoding/json reads differently, a string with an escape...): a byte
// fuzzer rarely builds whole items, these are whole items or almost.
func TestItemAgreesOnGeneratedShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// pick is mostly its first choice (the piece as workers write it), else any.
	pick := func(s ...string) string {
		if r.IntN(100) < 85 {
			return s[0]
		}
		return s[r.IntN(len(s))]
	}
	ws := func() string { return pick("", "", "", " ", "\t", "\n", "\r\n ", "\v", "\u00a0", "\f") }
	num := func() string {
		return pick(pick("0", "-0", "1")+pick("", "7", "23"), "-0", "1", "-1", "7", "01", "-01", "00", "123456789012345678", "-123456789012345678",
			"999999999999999999", "1000000000000000000", "9223372036854775807", "9223372036854775808",
			"-9223372036854775808", "1.0", "1e2", "1E2", "-", "+1", "0x1", "1.", ".1", "\"1\"", "null", "true", "[1]", "{}",
			"１", "1 2")
	}
	str := func() string {
		return pick(pick(`"stop"`, `"length"`, "null"), `"length"`, `""`, `"a b"`, `"\u0041"`, `"\n"`, `"`+"\x7f"+`"`, `"`+"\x1f"+`"`, `"é"`,
			`"\xff"`, `"\""`, `"x`, `null`, `nul`, `NULL`, `7`, `true`, `[]`, `{}`, `"stop"x`)
	}
	key := func(k string) string {
		return pick(`"`+k+`"`, `"`+k+`"`, `"`+k+`"`, `"`+strings.ToUpper(k)+`"`, `"`+k+` "`, `"\u0074`+k[1:]+`"`,
			`"`+strings.Replace(k, "k", "\u212a", 1)+`"`, `"`+strings.Replace(k, "s", "\u017f", 1)+`"`, k)
	}
	fast := 0
	for range 300000 {
		var b strings.Builder
		b.WriteString(ws() + pick("{", "{", "{", "[", "") + ws() + key("token_ids") + ws() + pick(":", ":", ":", "=") + ws())
		switch r.IntN(8) {
		case 0:
			b.WriteString(pick("null", `"x"`, "{}", "[", "[]"))
		default:
			b.WriteString("[" + ws())
			for i, n := 0, r.IntN(4); i < n; i++ {
				if i > 0 {
					b.WriteString(ws() + pick(",", ",", ",", ",,", ";", "") + ws())
				}
				b.WriteString(num())
			}
			b.WriteString(ws() + pick("]", "]", "]", ",]", "}"))
		}
		for i, n := 0, r.IntN(3); i < n; i++ {
			b.WriteString(ws() + pick(",", ",", ",", "") + ws() + key(pick("finish_reason", "token_ids", "text")) + ws() + ":" + ws())
			if r.IntN(4) == 0 {
				b.WriteString("[" + num() + "]")
			} else {
				b.WriteString(str())
			}
		}
		b.WriteString(ws() + pick("}", "}", "}", "}}", "", "} x", "}\x00", "},"))
		raw := []byte(b.String())
		if _, ok := scanItem(raw, func(int, []byte) {}); ok {
			fast++
		}
		checkItemAgrees(t, raw)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d of 300000 read by the fast path", fast)
	if fast < 10000 {
		t.Errorf("only %d items took the fast path: the generator tests little", fast)
	}
}
