package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSkipSpace(t *testing.T) {
	assert.Equal(t, 4, SkipSpace([]byte(" \t\r\nx"), 0))
	assert.Equal(t, 0, SkipSpace([]byte("x "), 0))
	assert.Equal(t, 2, SkipSpace([]byte("x "), 1), "the end when all is space")
	assert.Equal(t, 0, SkipSpace(nil, 0))
	assert.Equal(t, 1, SkipSpace([]byte("a\v b"), 1), "\\v is no JSON whitespace")
}

func TestHasAtAndExpect(t *testing.T) {
	b := []byte(` { "a" :[`)
	assert.True(t, HasAt(b, 1, `{`))
	assert.False(t, HasAt(b, 0, `{`))
	assert.False(t, HasAt(b, len(b)-1, `[1`), "past the end")
	assert.False(t, HasAt(b, len(b), `x`))
	i, ok := Expect(b, 0, `{`, `"a"`, `:`, `[`)
	assert.True(t, ok)
	assert.Equal(t, len(b), i)
	i, ok = Expect(b, 0, `{`, `"b"`)
	assert.False(t, ok)
	assert.Equal(t, 3, i, "where the literal was not")
	_, ok = Expect(b, 0, `{`, `"a"`, `:`, `[`, `]`)
	assert.False(t, ok, "the end of b")
}

func TestTrim(t *testing.T) {
	for in, want := range map[string]string{"": "", " \t\r\n": "", " null\n": "null", "[1, 2]": "[1, 2]", "\u00a0x": "\u00a0x"} {
		assert.Equal(t, want, string(Trim([]byte(in))), "%q", in)
	}
}

func TestIsNull(t *testing.T) {
	for _, s := range []string{"", " ", "null", " \t\r\nnull\n "} {
		assert.True(t, IsNull([]byte(s)), "%q", s)
	}
	for _, s := range []string{"nul", "nulll", "null x", "0", `"null"`, "[]", "\vnull", "Null"} {
		assert.False(t, IsNull([]byte(s)), "%q", s)
	}
	assert.True(t, IsNull(nil))
}

func TestStringEnd(t *testing.T) {
	for _, c := range []struct {
		text    string // a string's contents and what follows it
		end     int
		escaped bool
	}{
		{`abc"`, 3, false},
		{`"`, 0, false},
		{`a\"b"x"`, 4, true},
		{`a\\"x"`, 3, true},
		{`\u0022"`, 6, true},
		{`no end`, 5, true},         // not valid JSON: the last index
		{`esc \" no end`, 12, true}, // likewise
	} {
		end, escaped := StringEnd([]byte(c.text), 0)
		assert.Equal(t, c.end, end, c.text)
		assert.Equal(t, c.escaped, escaped, c.text)
	}
}

func TestSkipValue(t *testing.T) {
	for _, c := range []struct{ text, value string }{
		{`"a\"}" ,1`, `"a\"}"`},
		{`{"a":[1,"]}",{"b":null}]} ,`, `{"a":[1,"]}",{"b":null}]}`},
		{`[[],{}]]`, `[[],{}]`},
		{`-1.5e3,`, `-1.5e3`},
		{`true}`, `true`},
		{`null`, `null`},
		{"7\t", "7"},
	} {
		assert.Equal(t, c.value, c.text[:SkipValue([]byte(c.text), 0)], c.text)
	}
}

func TestMembers(t *testing.T) {
	m, ok := Object([]byte(` { "a" : 1 , "b\"c" :{"x":[1,2]}, "d":"}" } `))
	require.True(t, ok)
	var got []Member
	for {
		mem, ok := m.Next()
		if !ok {
			break
		}
		got = append(got, mem)
	}
	assert.Equal(t, []Member{
		{Name: []byte("a"), Value: []byte("1")},
		{Name: []byte(`b\"c`), Escaped: true, Value: []byte(`{"x":[1,2]}`)},
		{Name: []byte("d"), Value: []byte(`"}"`)},
	}, got)
	m, ok = Object([]byte(`{}`))
	require.True(t, ok)
	_, ok = m.Next()
	assert.False(t, ok)
	for _, notObject := range []string{`[1]`, `null`, ` "{}"`, ``} {
		_, ok := Object([]byte(notObject))
		assert.False(t, ok, notObject)
	}
	_, ok = (&Members{}).Next()
	assert.False(t, ok, "the zero Members has none")
}

// Whatever valid JSON SkipValue and Members split, they split where
// encoding/json does: the value SkipValue skips is the whole text, and the
// members put back together are the object.
func FuzzSkipValueAndMembers(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,"]}",{"b":null}]}`, ` {"id" : "a" , "state" : 2 } `, `[1, "x\"y", {}]`, `"\\"`, `-0.5e-3`,
		`{"\u0069d":"a","k":{"\"":"}"}}`, `{}`, ` true `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		start := SkipSpace(b, 0)
		end := SkipValue(b, start)
		require.Equal(t, len(bytes.TrimRight(b, " \t\r\n")), end, "%q", b)
		m, ok := Object(b)
		if !ok {
			require.NotEqual(t, byte('{'), b[start], "%q", b)
			return
		}
		var rebuilt bytes.Buffer
		rebuilt.WriteByte('{')
		for {
			mem, ok := m.Next()
			if !ok {
				break
			}
			if rebuilt.Len() > 1 {
				rebuilt.WriteByte(',')
			}
			require.True(t, json.Valid(mem.Value), "%q in %q", mem.Value, b)
			require.Equal(t, mem.Escaped, bytes.IndexByte(mem.Name, '\\') >= 0)
			rebuilt.WriteString(`"` + string(mem.Name) + `":`)
			rebuilt.Write(mem.Value)
		}
		rebuilt.WriteByte('}')
		var want, got bytes.Buffer
		require.NoError(t, json.Compact(&want, b))
		require.NoError(t, json.Compact(&got, rebuilt.Bytes()), "%q", rebuilt.Bytes())
		require.Equal(t, want.String(), got.String())
	})
}
