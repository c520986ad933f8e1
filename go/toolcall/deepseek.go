package toolcall

import (
	"fmt"
	"strings"
)

// deepSeekV3 is vLLM's DeepSeekV3ToolParser: calls sit between
// <｜tool▁calls▁begin｜> and <｜tool▁calls▁end｜>, each one
// <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>.
type deepSeekV3 struct {
	callsBeginID int
	callBeginID  int // -1: not in the vocabulary (counted as absent)
	callEndID    int

	cur      int // current_tool_id
	nameSent bool
	streamed []string
	prev     []dsCall // prev_tool_call_arr
}

// dsCall is one prev_tool_call_arr entry: a dict that may lack either key.
type dsCall struct {
	name, args       string
	hasName, hasArgs bool
}

const (
	dsCallsBegin = "<｜tool▁calls▁begin｜>"
	dsCallsEnd   = "<｜tool▁calls▁end｜>"
	dsCallBegin  = "<｜tool▁call▁begin｜>"
	dsCallEnd    = "<｜tool▁call▁end｜>"
	dsSep        = "<｜tool▁sep｜>"
	dsFence      = "\n```json\n"
)

func newDeepSeekV3(o Options) (impl, error) {
	begin, ok1 := o.lookup(dsCallsBegin)
	_, ok2 := o.lookup(dsCallsEnd)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("toolcall: deepseek_v3: the vocabulary lacks the tool calls begin/end tokens")
	}
	d := &deepSeekV3{callsBeginID: begin, callBeginID: -1, callEndID: -1, cur: -1}
	if id, ok := o.lookup(dsCallBegin); ok {
		d.callBeginID = id
	}
	if id, ok := o.lookup(dsCallEnd); ok {
		d.callEndID = id
	}
	return d, nil
}

// dsHead splits a call's first line, TYPE<｜tool▁sep｜>NAME, at its last
// separator (the regexes' greedy TYPE); ok false when it has none.
func dsHead(line string) (typ, name string, ok bool) {
	k := strings.LastIndex(line, dsSep)
	if k < 0 {
		return "", "", false
	}
	return line[:k], line[k+len(dsSep):], true
}

// dsMatchCall matches the whole-call regex at text[s:] (text[s:] starts
// with the call begin token); end is where the match ends.
func dsMatchCall(text string, s int) (typ, name, args string, end int, ok bool) {
	i := s + len(dsCallBegin)
	nl := strings.IndexByte(text[i:], '\n')
	if nl < 0 {
		return "", "", "", 0, false
	}
	typ, name, ok = dsHead(text[i : i+nl])
	i += nl
	if !ok || !strings.HasPrefix(text[i:], dsFence) {
		return "", "", "", 0, false
	}
	i += len(dsFence)
	nl = strings.IndexByte(text[i:], '\n')
	if nl < 0 {
		return "", "", "", 0, false
	}
	args, i = text[i:i+nl], i+nl
	tail := "\n```" + dsCallEnd
	if !strings.HasPrefix(text[i:], tail) {
		return "", "", "", 0, false
	}
	return typ, name, args, i + len(tail), true
}

func (d *deepSeekV3) extract(text string) (*string, []Call, bool) {
	first := strings.Index(text, dsCallsBegin)
	if first < 0 {
		return nil, nil, false
	}
	var calls []Call
	for pos := 0; ; {
		k := strings.Index(text[pos:], dsCallBegin)
		if k < 0 {
			break
		}
		typ, name, args, end, ok := dsMatchCall(text, pos+k)
		if !ok {
			pos += k + 1
			continue
		}
		if typ != "function" {
			return nil, nil, false // ToolCall's type must be "function"
		}
		calls = append(calls, Call{Name: name, Arguments: args})
		pos = end
	}
	if first == 0 {
		return nil, calls, true
	}
	return strp(text[:first]), calls, true
}

// dsPortion reads a call's text so far: the name once its line ends, and
// the arguments once their line has a character that is neither a newline
// nor a backtick (the streaming regexes).
func dsPortion(p string) (c dsCall, ok bool) {
	nl := strings.IndexByte(p, '\n')
	if nl < 0 {
		return c, false
	}
	_, name, ok := dsHead(p[:nl])
	if !ok {
		return c, false
	}
	c = dsCall{name: name, hasName: true, hasArgs: true}
	if rest, found := strings.CutPrefix(p[nl:], dsFence); found {
		if e := strings.IndexByte(rest, '\n'); e >= 0 {
			rest = rest[:e]
		}
		c.args = strings.TrimRight(rest, "`")
	}
	return c, true
}

func count(ids []int, id int) int {
	n := 0
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}

func lastPart(s, sep string) string {
	if k := strings.LastIndex(s, sep); k >= 0 {
		return s[k+len(sep):]
	}
	return s
}

func firstPart(s, sep string) string {
	if k := strings.Index(s, sep); k >= 0 {
		return s[:k]
	}
	return s
}

func (d *deepSeekV3) stream(s *step) *Delta {
	if count(s.curIDs, d.callsBeginID) == 0 {
		return &Delta{Content: strp(s.deltaText)}
	}
	delta := strings.ReplaceAll(strings.ReplaceAll(s.deltaText, dsCallsBegin, ""), dsCallsEnd, "")
	prevStart, prevEnd := count(s.prevIDs, d.callBeginID), count(s.prevIDs, d.callEndID)
	curStart, curEnd := count(s.curIDs, d.callBeginID), count(s.curIDs, d.callEndID)
	if d.callBeginID < 0 {
		prevStart, curStart = 0, 0
	}
	if d.callEndID < 0 {
		prevEnd, curEnd = 0, 0
	}
	var portion, text *string
	if curStart == curEnd && prevEnd == curEnd && !strings.Contains(delta, dsCallEnd) {
		return &Delta{Content: strp(delta)}
	}
	if strings.Contains(delta, dsCallEnd) {
		full := s.curText + delta
		portion = strp(pyRStrip(firstPart(lastPart(full, dsCallBegin), dsCallEnd)))
		delta = pyRStrip(firstPart(delta, dsCallEnd))
		text = strp(pyLStrip(delta))
	}
	switch {
	case curStart > curEnd && curStart > prevStart:
		portion = nil
		if len(s.deltaIDs) > 1 {
			portion = strp(lastPart(s.curText, dsCallBegin))
		}
		text = nil
		d.cur++
		d.nameSent = false
		d.streamed = append(d.streamed, "")
	case curStart > curEnd && curStart == prevStart:
		portion, text = strp(lastPart(s.curText, dsCallBegin)), nil
	case curStart == curEnd && curEnd >= prevEnd:
		if len(d.prev) == 0 {
			return nil
		}
		i, ok := pyIndex(len(d.prev), d.cur)
		if !ok {
			return nil
		}
		if p := d.prev[i]; p.hasArgs && p.args != "" {
			k := strings.LastIndex(delta, `"}`)
			if k < 0 {
				return nil
			}
			diff := delta[:k] + `"}`
			j, ok := pyIndex(len(d.streamed), d.cur)
			if !ok {
				return nil
			}
			d.streamed[j] += diff
			return argsDelta(d.cur, diff)
		}
	default:
		t := strings.ReplaceAll(strings.ReplaceAll(delta, dsCallBegin, ""), dsCallEnd, "")
		return &Delta{Content: &t}
	}
	return d.streamCall(portion, text, delta)
}

// pyIndex resolves a Python index into a list of n.
func pyIndex(n, i int) (int, bool) {
	if i < 0 {
		i += n
	}
	return i, i >= 0 && i < n
}

// streamCall is the second half of the streaming step: name, then arguments.
func (d *deepSeekV3) streamCall(portion, text *string, delta string) *Delta {
	var cur dsCall
	if portion != nil && *portion != "" {
		c, ok := dsPortion(*portion)
		if !ok {
			return nil
		}
		cur = c
	}
	if !d.nameSent {
		if !cur.hasName || cur.name == "" {
			return nil
		}
		d.nameSent = true
		return &Delta{Calls: []CallDelta{{Index: d.cur, Opens: true, Name: strp(cur.name)}}}
	}
	if portion == nil {
		if text != nil {
			return &Delta{Content: strp(delta)}
		}
		return nil
	}
	if len(d.prev) <= d.cur {
		d.prev = append(d.prev, dsCall{})
	}
	i, ok := pyIndex(len(d.prev), d.cur)
	if !ok {
		return nil
	}
	prevArgs := d.prev[i].args
	j, ok := pyIndex(len(d.streamed), d.cur)
	if !ok && cur.args != "" {
		return nil
	}
	var out *Delta
	switch {
	case cur.args != "" && prevArgs == "":
		out = argsDelta(d.cur, cur.args)
		d.streamed[j] = cur.args
	case cur.args != "" && cur.args != prevArgs && len(cur.args) > len(prevArgs) &&
		strings.HasPrefix(cur.args, prevArgs):
		out = argsDelta(d.cur, cur.args[len(prevArgs):])
		d.streamed[j] = cur.args
	}
	if d.cur == len(d.prev)-1 {
		d.prev[d.cur] = cur
	} else {
		d.prev = append(d.prev, cur)
	}
	return out
}

func (d *deepSeekV3) unstreamed() string {
	if len(d.prev) == 0 {
		return ""
	}
	i := len(d.prev) - 1
	expected := "{}"
	if d.prev[i].hasArgs {
		expected = d.prev[i].args
	}
	actual := ""
	if i < len(d.streamed) {
		actual = d.streamed[i]
	}
	if strings.HasPrefix(expected, actual) {
		return expected[len(actual):]
	}
	return ""
}
