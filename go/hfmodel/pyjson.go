package hfmodel

// JSON as the Python side of a chat template sees it: a request's JSON
// (tool parameters, tool call arguments) becomes template values the way
// Python's json.loads makes objects (keys in the order given, a repeated key
// keeping its first place and its last value; integers and floats kept
// apart), and the template's tojson filter writes values back the way
// transformers' tojson does (Python's json.dumps with ensure_ascii off: keys
// in insertion order, floats as Python's repr, no HTML escaping, indent and
// separators and sort_keys honoured).
//
// The template library's own tojson differs (floats as Go prints them, an
// indented rendering with sorted keys), and its filters cannot be replaced,
// so a template's uses of the tojson filter are renamed to pyTojsonName
// (useOwnTojson), a filter the rendering passes among its variables.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	"github.com/ardanlabs/jinja"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// MaxJSONDepth bounds the nesting of the JSON a request gives the template
// (tool parameters, tool call arguments).
const MaxJSONDepth = 512

// pyTojsonName is the name templates' tojson filter is renamed to.
const pyTojsonName = "__hfmodel_tojson"

// jsonValue is the template value of a JSON text, as Python's json.loads
// makes it.
func jsonValue(raw []byte) (jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := d.Token(); err == nil {
		return jinja.Undefined(), errors.New("more than one JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder, depth int) (jinja.Value, error) {
	tok, err := d.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t)), nil
	}
	if depth >= MaxJSONDepth {
		return jinja.Undefined(), fmt.Errorf("JSON nested deeper than %d levels", MaxJSONDepth)
	}
	if tok == json.Delim('[') {
		var items []jinja.Value
		for d.More() {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items = append(items, v)
		}
		_, err := d.Token()
		return jinja.NewList(items), err
	}
	obj := jinja.NewDict()
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return jinja.Undefined(), err
		}
		v, err := decodeValue(d, depth+1)
		if err != nil {
			return jinja.Undefined(), err
		}
		obj.AsDict().Set(k.(string), v)
	}
	_, err = d.Token()
	return obj, err
}

// numberValue is a JSON number as Python reads it: an integer without a
// fraction or exponent (one past int64 becomes a float, where Python keeps
// every digit), else a float (infinite past float64's range, as in Python).
func numberValue(s string) jinja.Value {
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, _ := strconv.ParseFloat(s, 64) // ±Inf past the range, as Python's float()
	return jinja.NewFloat(f)
}

// goValue is a Go value (a request's chat_template_kwargs, decoded by
// encoding/json) as a template value: maps keep their keys sorted (their
// order is lost), and a whole float64 within float64's exact integers is an
// integer, which JSON's 1 was.
func goValue(v any) jinja.Value {
	switch t := v.(type) {
	case float64:
		if t == math.Trunc(t) && math.Abs(t) <= 1<<53 {
			return jinja.NewInt(int64(t))
		}
	case []any:
		items := make([]jinja.Value, len(t))
		for i, x := range t {
			items[i] = goValue(x)
		}
		return jinja.NewList(items)
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := jinja.NewDict()
		for _, k := range keys {
			d.AsDict().Set(k, goValue(t[k]))
		}
		return d
	}
	return jinja.FromGoValue(v)
}

// ---------------------------------------------------------------- tojson

// useOwnTojson renames the template's tojson filters (a "|" then "tojson"
// inside a {{ }} or {% %} tag, outside its string literals) to pyTojsonName.
func useOwnTojson(src string) string {
	var b strings.Builder
	i := 0
	for i < len(src) {
		open := strings.Index(src[i:], "{")
		if open < 0 || i+open+1 >= len(src) {
			break
		}
		open += i
		closer := map[byte]string{'{': "}}", '%': "%}", '#': "#}"}[src[open+1]]
		if closer == "" {
			b.WriteString(src[i : open+1])
			i = open + 1
			continue
		}
		b.WriteString(src[i:open])
		end := tagEnd(src, open+2, closer)
		tag := src[open:end]
		if closer != "#}" {
			tag = renameTojson(tag)
		}
		b.WriteString(tag)
		i = end
	}
	b.WriteString(src[i:])
	return b.String()
}

// tagEnd is where the tag opened before from ends: past its closer, found
// outside string literals (the end of src if none).
func tagEnd(src string, from int, closer string) int {
	var quote byte
	for j := from; j < len(src); j++ {
		c := src[j]
		switch {
		case quote != 0 && c == '\\':
			j++
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case closer != "#}" && (c == '"' || c == '\''):
			quote = c
		case strings.HasPrefix(src[j:], closer):
			return j + len(closer)
		}
	}
	return len(src)
}

// renameTojson renames the tojson filters of one tag.
func renameTojson(tag string) string {
	var b strings.Builder
	var quote byte
	for j := 0; j < len(tag); j++ {
		c := tag[j]
		b.WriteByte(c)
		switch {
		case quote != 0 && c == '\\' && j+1 < len(tag):
			j++
			b.WriteByte(tag[j])
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '|':
			k := j + 1
			for k < len(tag) && strings.IndexByte(" \t\r\n", tag[k]) >= 0 {
				k++
			}
			if strings.HasPrefix(tag[k:], "tojson") && !isIdentByte(tag, k+len("tojson")) {
				b.WriteString(tag[j+1 : k])
				b.WriteString(pyTojsonName)
				j = k + len("tojson") - 1
			}
		}
	}
	return b.String()
}

func isIdentByte(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	c := s[i]
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// dumpOptions are json.dumps's arguments that transformers' tojson passes.
type dumpOptions struct {
	asciiOnly   bool
	indent      string
	indented    bool
	itemSep     string
	keySep      string
	sortKeys    bool
	depthBudget int
}

// pyTojson is transformers' tojson filter: tojson(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
var pyTojson = jinja.NewCallable(pyTojsonName, func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson needs a value")
	}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	opt := map[string]jinja.Value{}
	for i, a := range args[1:] {
		if i >= len(names) {
			return jinja.Undefined(), errors.New("tojson takes at most 4 arguments")
		}
		opt[names[i]] = a
	}
	for k, v := range kwargs {
		opt[k] = v
	}
	o := dumpOptions{itemSep: ", ", keySep: ": ", depthBudget: 1000}
	o.asciiOnly = opt["ensure_ascii"].IsTruthy()
	o.sortKeys = opt["sort_keys"].IsTruthy()
	if in, ok := opt["indent"]; ok && !in.IsNone() && !in.IsUndefined() {
		o.indented, o.itemSep = true, ","
		switch {
		case in.IsString():
			o.indent = in.AsString()
		case in.IsInt() || in.IsBool():
			n := 0
			if in.IsInt() {
				n = int(min(max(in.AsInt(), 0), 64))
			} else if in.AsBool() {
				n = 1
			}
			o.indent = strings.Repeat(" ", n)
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
	}
	if s, ok := opt["separators"]; ok && !s.IsNone() && !s.IsUndefined() {
		if !s.IsList() || s.AsList().Len() != 2 || !s.AsList().Get(0).IsString() || !s.AsList().Get(1).IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = s.AsList().Get(0).AsString(), s.AsList().Get(1).AsString()
	}
	var b strings.Builder
	if err := dumpValue(&b, args[0], &o, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(b.String()), nil
})

func dumpValue(b *strings.Builder, v jinja.Value, o *dumpOptions, level int) error {
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		b.WriteString(map[bool]string{true: "true", false: "false"}[v.AsBool()])
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(jsonscan.PyFloat(v.AsFloat()))
	case v.IsString():
		dumpString(b, v.AsString(), o.asciiOnly)
	case v.IsList(), v.IsDict():
		if level >= o.depthBudget {
			return errors.New("tojson: value nested too deeply")
		}
		return dumpContainer(b, v, o, level)
	default:
		return fmt.Errorf("tojson: %s is not JSON serializable", v.String())
	}
	return nil
}

func dumpContainer(b *strings.Builder, v jinja.Value, o *dumpOptions, level int) error {
	open, closing := "[", "]"
	var keys []string
	n := 0
	if v.IsDict() {
		open, closing = "{", "}"
		keys = v.AsDict().OrderedKeys()
		if o.sortKeys {
			sort.Strings(keys)
		}
		n = len(keys)
	} else {
		n = v.AsList().Len()
	}
	b.WriteString(open)
	if n == 0 {
		b.WriteString(closing)
		return nil
	}
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		if o.indented {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(o.indent, level+1))
		}
		item := jinja.Value{}
		if keys != nil {
			dumpString(b, keys[i], o.asciiOnly)
			b.WriteString(o.keySep)
			item, _ = v.AsDict().Get(keys[i])
		} else {
			item = v.AsList().Get(i)
		}
		if err := dumpValue(b, item, o, level+1); err != nil {
			return err
		}
	}
	if o.indented {
		b.WriteByte('\n')
		b.WriteString(strings.Repeat(o.indent, level))
	}
	b.WriteString(closing)
	return nil
}

// dumpString writes s as Python's json.dumps does: '"', '\\' and the C0
// controls escaped (\n, \r, \t, \b, \f by name), and with asciiOnly every
// non-ASCII character as \uXXXX (UTF-16 surrogate pairs past the BMP).
func dumpString(b *strings.Builder, s string, asciiOnly bool) {
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || asciiOnly && r == 0x7f:
			fmt.Fprintf(b, `\u%04x`, r)
		case asciiOnly && r > 0x7f:
			if r > 0xffff {
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u%04x\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
