package frontend

import (
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// Streaming tool_choice "required": the output is a JSON array of
// {"name": ..., "parameters": ...} objects (its schema, tools.go). Each
// step scans the whole text so far for the array's elements: a call is
// announced (id, type, name and the arguments so far) once its name is
// complete and its parameters started, and later deltas carry the new text
// of its parameters. The scan of a prefix finds the same positions as the
// scan of the whole, so what an earlier step sent is known from the length
// of its text alone, as in vLLM's server.

// requiredSpan is where one element of the array sits in the text.
type requiredSpan struct {
	name      *string // once its string is complete and decodes
	nameEnd   int     // just past the name's closing quote
	argsStart int     // where the parameters' value starts (-1: not yet)
	argsEnd   int     // where it ends (-1: still being written)
}

func (s *requiredSpan) ready() bool { return s.name != nil && s.argsStart >= 0 }

// readyAt reports whether the first n bytes of the text made the call
// announceable.
func (s *requiredSpan) readyAt(n int) bool {
	return s.name != nil && s.nameEnd <= n && s.argsStart >= 0 && s.argsStart < n
}

// What the scanner expects next within an element object.
const (
	expectKey = iota
	expectColon
	expectValue
	inStringValue
	inContainerValue
	inScalarValue
	afterValue
)

// scanRequired finds the elements of a (possibly partial) required-calls
// array; text after the array's end is ignored.
func scanRequired(text string) []*requiredSpan {
	var spans []*requiredSpan
	depth := 0 // of {} and []: an element's members are at 2
	inString, escaped := false, false
	stringStart, valueStart := 0, 0
	var cur *requiredSpan
	expect := expectKey
	key := ""
	endValue := func(pos int) {
		switch {
		case key == "parameters":
			cur.argsEnd = pos
		case key == "name" && expect == inStringValue:
			var name string
			if json.Unmarshal([]byte(text[valueStart:pos]), &name) == nil {
				cur.name, cur.nameEnd = &name, pos
			} else {
				cur.name = nil
			}
		}
		expect = afterValue
	}
	startValue := func(pos, state int) {
		valueStart = pos
		if key == "parameters" {
			cur.argsStart = pos
		}
		expect = state
	}
	for i := 0; i < len(text); {
		ch, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
				if depth == 2 && cur != nil {
					if expect == expectKey {
						key, expect = text[stringStart+1:i], expectColon
					} else if expect == inStringValue {
						endValue(i + 1)
					}
				}
			}
		case ch == '"':
			inString, stringStart = true, i
			if depth == 2 && cur != nil && expect == expectValue {
				startValue(i, inStringValue)
			}
		case ch == '{' || ch == '[':
			switch {
			case depth == 0 && ch != '[', depth == 1 && ch != '{':
				return spans
			case depth == 1:
				cur = &requiredSpan{argsStart: -1, argsEnd: -1}
				spans = append(spans, cur)
				expect, key = expectKey, ""
			case depth == 2 && cur != nil && expect == expectValue:
				startValue(i, inContainerValue)
			}
			depth++
		case ch == '}' || ch == ']':
			if depth == 2 && cur != nil && expect == inScalarValue {
				endValue(i)
			}
			depth--
			switch {
			case depth == 2 && cur != nil && expect == inContainerValue:
				endValue(i + 1)
			case depth == 1:
				cur = nil
			case depth <= 0:
				return spans
			}
		case depth != 2 || cur == nil:
		case ch == ':':
			if expect == expectColon {
				expect = expectValue
			}
		case ch == ',':
			if expect == inScalarValue {
				endValue(i)
			}
			expect, key = expectKey, ""
		case unicode.IsSpace(ch):
			if expect == inScalarValue {
				endValue(i)
			}
		case expect == expectValue:
			startValue(i, inScalarValue)
		}
		i += size
	}
	return spans
}

// requiredDelta is what a step of a required-calls stream sends: for each
// element with something new, its announcement or its new arguments text.
func requiredDelta(prev, current string) *deltaMsg {
	if current == "" {
		return nil
	}
	sent := len(prev)
	var calls []callOut
	for index, s := range scanRequired(current) {
		if !s.ready() {
			break // elements come in order: no later one is ready
		}
		end := s.argsEnd
		if end < 0 {
			end = len(current)
		}
		if s.readyAt(sent) {
			if from := min(end, sent); from < end {
				calls = append(calls, callOut{Index: index, Function: funcOut{Arguments: ptr(current[from:end])}})
			}
			continue
		}
		calls = append(calls, callOut{Index: index, ID: toolCallID(), Type: "function",
			Function: funcOut{Name: s.name, Arguments: ptr(current[s.argsStart:end])}})
	}
	if len(calls) == 0 {
		return nil
	}
	return &deltaMsg{calls: calls}
}
