package toolcall

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// llama3JSON is vLLM's Llama3JsonToolParser: the output is one JSON object
// {"name": ..., "parameters"|"arguments": ...}, or several separated by
// "; ", optionally after <|python_tag|>.
type llama3JSON struct {
	cur      int // current_tool_id
	nameSent bool
	streamed []string   // streamed_args_for_tool
	prev     []*pyValue // prev_tool_call_arr
}

const llamaBot = "<|python_tag|>"

var decodeRune = utf8.DecodeRuneInString

func newLlama3JSON(o Options) (impl, error) {
	if _, ok := o.lookup(llamaBot); !ok {
		return nil, fmt.Errorf("toolcall: llama3_json: the vocabulary has no %s token", llamaBot)
	}
	return &llama3JSON{cur: -1}, nil
}

func (l *llama3JSON) extract(text string) (*string, []Call, bool) {
	if !strings.Contains(text, llamaBot) && !strings.Contains(text, "{") {
		return nil, nil, false
	}
	r := []rune(text)
	end := -1
	var calls []Call
	for start, c := range r {
		if c != '{' || start <= end {
			continue
		}
		v, n, ok := pyRawDecode(r[start:])
		if !ok || v.kind != pyDict {
			return nil, nil, false
		}
		end = start + n
		name, args := v.get("name"), v.get("arguments")
		if args == nil {
			args = v.get("parameters")
		}
		if name == nil || args == nil || name.kind != pyStr {
			return nil, nil, false
		}
		calls = append(calls, Call{Name: name.text, Arguments: args.dumps()})
	}
	if len(calls) == 0 {
		return nil, nil, false
	}
	return nil, calls, true
}

// partialLoads is vLLM's partial_json_loads: the value and how many code
// points it used; ok false where it raises.
func partialLoads(r []rune, allowStr bool) (*pyValue, int, bool) {
	fixed, ok := fixFast(r, allowStr)
	if !ok {
		return nil, 0, false
	}
	v, e := pyLoads(fixed)
	switch e {
	case decOK:
		return v, len(r), true
	case decExtra:
		return pyRawDecode(r)
	}
	return nil, 0, false
}

// commonPrefix is find_common_prefix, by code points.
func commonPrefix(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) {
		ra, sa := decodeRune(a[n:])
		rb, sb := decodeRune(b[n:])
		if ra != rb || sa != sb {
			break
		}
		n += sa
	}
	return a[:n]
}

// parseAll reads the calls in the text so far; ok false is an exception.
func (l *llama3JSON) parseAll(cur string) (arr []*pyValue, complete []bool, ok bool) {
	r := []rune(cur)
	start := 0
	if strings.HasPrefix(cur, llamaBot) {
		start = utf8.RuneCountInString(llamaBot)
	}
	for start < len(r) {
		v, end, ok := partialLoads(r[start:], l.nameSent)
		if !ok {
			return nil, nil, false
		}
		_, e := pyLoads(r[start : start+end])
		complete = append(complete, e == decOK)
		start += end + 2
		hasParams, ok := v.has("parameters")
		if !ok {
			return nil, nil, false
		}
		if hasParams {
			if hasArgs, _ := v.has("arguments"); hasArgs || v.kind != pyDict {
				return nil, nil, false
			}
			v.set("arguments", v.get("parameters"))
		}
		arr = append(arr, v)
	}
	return arr, complete, true
}

func argsDelta(i int, s string) *Delta {
	return &Delta{Calls: []CallDelta{{Index: i, Arguments: strp(s)}}}
}

func (l *llama3JSON) stream(s *step) *Delta {
	if !strings.HasPrefix(s.curText, llamaBot) && !strings.HasPrefix(s.curText, "{") {
		return &Delta{Content: strp(s.deltaText)}
	}
	arr, complete, ok := l.parseAll(s.curText)
	if !ok || len(arr) == 0 {
		return nil
	}
	idx := l.cur
	if idx < 0 {
		idx += len(arr)
	}
	if idx < 0 || idx >= len(arr) {
		return nil
	}
	call := arr[idx]
	if call.kind != pyDict && (l.cur >= 0 || len(arr) <= l.cur+1) {
		return nil // .get on a non-dict raises
	}
	var d *Delta
	switch {
	case len(arr) > l.cur+1:
		// A new call starts: first send what the JSON completion added to
		// the previous one and was not streamed yet.
		if l.cur >= 0 {
			if args := call.get("arguments"); args != nil && args.truthy() {
				diff := runeFrom(args.dumps(), runeLen(l.streamed[l.cur]))
				d = argsDelta(l.cur, diff)
				l.streamed[l.cur] += diff
			}
		}
		l.cur = len(arr) - 1
		l.nameSent = false
		l.streamed = append(l.streamed, "")
		return d
	case !l.nameSent:
		if name := call.get("name"); name != nil && name.truthy() {
			if name.kind != pyStr {
				return nil // DeltaFunctionCall rejects a non-string name
			}
			d = &Delta{Calls: []CallDelta{{Index: l.cur, Opens: true, Name: strp(name.text)}}}
			l.nameSent = true
		}
	default:
		var ok bool
		if d, ok = l.argsStep(call, complete); !ok {
			return nil
		}
	}
	l.prev = arr
	return d
}

// argsStep streams the current call's arguments; ok false is an exception.
func (l *llama3JSON) argsStep(call *pyValue, complete []bool) (*Delta, bool) {
	args := call.get("arguments")
	if args == nil || !args.truthy() {
		return nil, true
	}
	sent := runeLen(l.streamed[l.cur])
	curJSON := args.dumps()
	if l.cur >= len(l.prev) || l.prev[l.cur].kind != pyDict {
		return nil, false
	}
	var diff *string
	if complete[l.cur] {
		diff = strp(runeFrom(curJSON, sent))
	} else if pa := l.prev[l.cur].get("arguments"); pa != nil && pa.truthy() {
		if prevJSON := pa.dumps(); curJSON != prevJSON {
			diff = strp(runeFrom(commonPrefix(prevJSON, curJSON), sent))
		}
	}
	if diff == nil {
		return nil, true
	}
	l.streamed[l.cur] += *diff
	return argsDelta(l.cur, *diff), true
}

func (l *llama3JSON) unstreamed() string {
	if len(l.prev) == 0 {
		return ""
	}
	i := len(l.prev) - 1
	last := l.prev[i]
	if last.kind != pyDict {
		return ""
	}
	expected := "{}"
	if a := last.get("arguments"); a != nil {
		if a.kind == pyStr {
			expected = a.text
		} else {
			expected = a.dumps()
		}
	}
	actual := ""
	if i < len(l.streamed) {
		actual = l.streamed[i]
	}
	if strings.HasPrefix(expected, actual) {
		return expected[len(actual):]
	}
	return ""
}
