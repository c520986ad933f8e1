package toolcall

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

// vLLM's ParserEngine._fix_arg_types: a parsed call's arguments are
// corrected to the types its tool's schema gives (coerce_to_schema_type and
// extract_types_from_schema in vllm/tool_parsers/utils.py).

// fixArgTypes rewrites args (JSON text) when a property's value does not
// have its schema's type; args is kept as is when nothing changes.
func (m *mistralEngine) fixArgTypes(args, name string) string {
	if name == "" {
		return args
	}
	props := toolProperties(m.opts.Tools, name)
	if props == nil || props.kind != pyDict || len(props.keys) == 0 {
		return args
	}
	v, e := pyLoads([]rune(args))
	if e != decOK || v.kind != pyDict {
		return args
	}
	if coerceDict(v, props) {
		return v.dumps()
	}
	return args
}

// toolProperties is find_tool_properties: the first tool named name's
// parameters' "properties".
func toolProperties(tools []Tool, name string) *pyValue {
	for _, t := range tools {
		if t.Name != name {
			continue
		}
		if len(t.Parameters) == 0 {
			return nil
		}
		p, e := pyLoads([]rune(string(t.Parameters)))
		if e != decOK {
			return nil
		}
		return p.get("properties")
	}
	return nil
}

func coerceDict(args, props *pyValue) bool {
	changed := false
	for _, k := range args.keys {
		prop := props.get(k)
		if prop == nil || prop.kind != pyDict {
			continue
		}
		if c, ok := coerceValue(args.vals[k], prop); ok {
			args.vals[k] = c
			changed = true
		}
	}
	return changed
}

func coerceValue(v, schema *pyValue) (*pyValue, bool) {
	switch v.kind {
	case pyStr:
		return coerceString(v.text, schemaTypes(schema))
	case pyDict:
		if p := schema.get("properties"); p != nil && p.kind == pyDict {
			return v, coerceDict(v, p)
		}
		return v, false
	case pyList:
		items := schema.get("items")
		if items == nil || items.kind != pyDict {
			return v, false
		}
		changed := false
		for i, it := range v.items {
			if c, ok := coerceValue(it, items); ok {
				v.items[i], changed = c, true
			}
		}
		return v, changed
	}
	c, _ := coerceString(v.dumps(), schemaTypes(schema))
	if c.kind != v.kind || !scalarEqual(c, v) {
		return c, true
	}
	return v, false
}

func scalarEqual(a, b *pyValue) bool {
	switch a.kind {
	case pyBool:
		return a.b == b.b
	case pyInt, pyStr:
		return a.text == b.text
	case pyFloat:
		return a.f == b.f
	}
	return a.kind == pyNull
}

var typeAliases = map[string]string{
	"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
	"int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
	"uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
	"float": "number", "float32": "number", "float64": "number", "double": "number",
	"bool": "boolean", "dict": "object", "arr": "array", "list": "array", "sequence": "array",
}

// schemaTypes is extract_types_from_schema.
func schemaTypes(s *pyValue) map[string]bool {
	out := map[string]bool{}
	if s == nil || s.kind != pyDict {
		return map[string]bool{"string": true}
	}
	if t := s.get("type"); t != nil && t.kind == pyStr {
		out[t.text] = true
	} else if t != nil && t.kind == pyList {
		for _, it := range t.items {
			if it.kind == pyStr {
				out[it.text] = true
			}
		}
	}
	if e := s.get("enum"); e != nil && e.kind == pyList {
		names := [...]string{pyNull: "null", pyBool: "boolean", pyInt: "integer", pyFloat: "number", pyStr: "string", pyList: "array", pyDict: "object"}
		for _, it := range e.items {
			out[names[it.kind]] = true
		}
	}
	for _, f := range []string{"anyOf", "oneOf", "allOf"} {
		if c := s.get(f); c != nil && c.kind == pyList {
			for _, it := range c.items {
				for t := range schemaTypes(it) {
					out[t] = true
				}
			}
		}
	}
	if len(out) == 0 {
		out["string"] = true
	}
	return out
}

// coerceString is coerce_to_schema_type; changed is Python's `coerced is
// not value`.
func coerceString(s string, types map[string]bool) (*pyValue, bool) {
	norm := map[string]bool{}
	for t := range types {
		t = strings.ToLower(pyStrip(t))
		if a, ok := typeAliases[t]; ok {
			t = a
		}
		norm[t] = true
	}
	for _, c := range []string{"null", "integer", "number", "boolean", "object", "array", "string"} {
		if !norm[c] {
			continue
		}
		switch c {
		case "null":
			if strings.ToLower(s) == "null" {
				return &pyValue{kind: pyNull}, true
			}
		case "string":
			return &pyValue{kind: pyStr, text: s}, false
		case "integer":
			if n, ok := pyIntParse(s); ok {
				return &pyValue{kind: pyInt, text: n}, true
			}
		case "number":
			if f, ok := pyFloatParse(s); ok && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return floatOrInt(f), true
			}
		case "boolean":
			switch strings.ToLower(pyStrip(s)) {
			case "true", "1":
				return &pyValue{kind: pyBool, b: true}, true
			case "false", "0":
				return &pyValue{kind: pyBool}, true
			}
		default: // object, array
			if v, e := pyLoads([]rune(s)); e == decOK && finite(v) {
				return v, true
			}
		}
	}
	if v, e := pyLoads([]rune(s)); e == decOK && finite(v) {
		return v, true
	}
	return &pyValue{kind: pyStr, text: s}, false
}

// floatOrInt is `val if val != int(val) else int(val)`.
func floatOrInt(f float64) *pyValue {
	if f != math.Trunc(f) {
		return &pyValue{kind: pyFloat, f: f}
	}
	i, _ := big.NewFloat(f).Int(nil)
	return &pyValue{kind: pyInt, text: i.String()}
}

func finite(v *pyValue) bool {
	switch v.kind {
	case pyFloat:
		return !math.IsInf(v.f, 0) && !math.IsNaN(v.f)
	case pyList:
		for _, it := range v.items {
			if !finite(it) {
				return false
			}
		}
	case pyDict:
		for _, k := range v.keys {
			if !finite(v.vals[k]) {
				return false
			}
		}
	}
	return true
}

// digitsOK: ASCII digits, single underscores between them (Python's
// numeric literal grammar).
func digitsOK(s string) bool {
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '_' {
			return false
		}
	}
	return true
}

// pyIntParse is int(s) for ASCII digits: its canonical decimal text.
func pyIntParse(s string) (string, bool) {
	s = pyStrip(s)
	neg := strings.HasPrefix(s, "-")
	if neg || strings.HasPrefix(s, "+") {
		s = s[1:]
	}
	if !digitsOK(s) {
		return "", false
	}
	n, ok := new(big.Int).SetString(strings.ReplaceAll(s, "_", ""), 10)
	if !ok {
		return "", false
	}
	if neg {
		n.Neg(n)
	}
	return n.String(), true
}

// pyFloatParse is float(s) for ASCII numerals, inf and nan.
func pyFloatParse(s string) (float64, bool) {
	s = pyStrip(s)
	body := strings.TrimLeft(s, "+-")
	if len(s)-len(body) > 1 {
		return 0, false
	}
	switch strings.ToLower(body) {
	case "inf", "infinity":
		return math.Inf(1), true
	case "nan":
		return math.NaN(), true
	}
	mant, exp, hasExp := strings.Cut(strings.ToLower(body), "e")
	if hasExp {
		if !digitsOK(strings.TrimLeft(exp, "+-")) || len(exp)-len(strings.TrimLeft(exp, "+-")) > 1 {
			return 0, false
		}
	}
	ip, fp, dot := strings.Cut(mant, ".")
	if (ip == "" && fp == "") || (ip != "" && !digitsOK(ip)) || (dot && fp != "" && !digitsOK(fp)) {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
	if err != nil && !math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}
