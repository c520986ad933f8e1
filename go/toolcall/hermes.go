package toolcall

import "strings"

// hermes is vLLM's Hermes2ProToolParser: calls are JSON objects
// {"name": ..., "arguments": ...} between <tool_call> and </tool_call>.
type hermes struct {
	sentContent int // bytes of the text already sent as content
	calls       []hermesCall
}

type hermesCall struct {
	name     string
	hasName  bool
	args     string // the arguments text streamed so far (prev_tool_call_arr)
	hasArgs  bool
	streamed string // streamed_args_for_tool
}

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
)

func newHermes(Options) (impl, error) { return &hermes{}, nil }

func (h *hermes) extract(text string) (*string, []Call, bool) {
	first := strings.Index(text, hermesOpen)
	if first < 0 {
		return nil, nil, false
	}
	var calls []Call
	for pos := first; ; {
		k := strings.Index(text[pos:], hermesOpen)
		if k < 0 {
			break
		}
		body := pos + k + len(hermesOpen)
		var js string
		if e := strings.Index(text[body:], hermesClose); e >= 0 {
			js, pos = text[body:body+e], body+e+len(hermesClose)
		} else {
			js, pos = text[body:], len(text)
		}
		v, err := pyLoads([]rune(js))
		if err != decOK || v.kind != pyDict {
			return nil, nil, false
		}
		name, args := v.get("name"), v.get("arguments")
		if name == nil || args == nil || name.kind != pyStr {
			return nil, nil, false
		}
		calls = append(calls, Call{Name: name.text, Arguments: args.dumps()})
	}
	if first == 0 {
		return nil, calls, true
	}
	return strp(text[:first]), calls, true
}

// partialTagOverlap is the length of the longest proper prefix of tag that
// ends text.
func partialTagOverlap(text, tag string) int {
	for k := min(len(tag)-1, len(text)); k > 0; k-- {
		if strings.HasSuffix(text, tag[:k]) {
			return k
		}
	}
	return 0
}

// content is the text before any <tool_call> not yet sent, holding back a
// suffix that may be the start of the tag.
func (h *hermes) content(cur string) *string {
	end := strings.Index(cur, hermesOpen)
	if end < 0 {
		end = len(cur) - partialTagOverlap(cur, hermesOpen)
	}
	if end > h.sentContent {
		s := cur[h.sentContent:end]
		h.sentContent = end
		return &s
	}
	return nil
}

type hermesRegion struct {
	json     string
	complete bool
}

func hermesRegions(text string) []hermesRegion {
	var out []hermesRegion
	for pos := 0; ; {
		k := strings.Index(text[pos:], hermesOpen)
		if k < 0 {
			return out
		}
		body := pos + k + len(hermesOpen)
		if e := strings.Index(text[body:], hermesClose); e >= 0 {
			out = append(out, hermesRegion{pyStrip(text[body : body+e]), true})
			pos = body + e + len(hermesClose)
			continue
		}
		raw := text[body:]
		raw = raw[:len(raw)-partialTagOverlap(raw, hermesClose)]
		js := pyStrip(raw)
		return append(out, hermesRegion{js, js != "" && pyValid(js)})
	}
}

// skipSpace skips str.isspace characters from byte i.
func skipSpace(s string, i int) int {
	for i < len(s) {
		r, n := decodeRune(s[i:])
		if !pyIsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// hermesName is the first `"name"\s*:\s*"([^"]+)"` match's group, raw.
func hermesName(js string) (string, bool) {
	for pos := 0; ; pos++ {
		k := strings.Index(js[pos:], `"name"`)
		if k < 0 {
			return "", false
		}
		pos += k
		i := skipSpace(js, pos+len(`"name"`))
		if i < len(js) && js[i] == ':' {
			i = skipSpace(js, i+1)
			if i < len(js) && js[i] == '"' {
				if e := strings.IndexByte(js[i+1:], '"'); e > 0 {
					return js[i+1 : i+1+e], true
				}
			}
		}
	}
}

// hermesArgs is the text after the first `"arguments"\s*:\s*`; when the
// call is complete, less the brace that closes the call.
func hermesArgs(js string, complete bool) (string, bool) {
	for pos := 0; ; pos++ {
		k := strings.Index(js[pos:], `"arguments"`)
		if k < 0 {
			return "", false
		}
		pos += k
		i := skipSpace(js, pos+len(`"arguments"`))
		if i >= len(js) || js[i] != ':' {
			continue
		}
		raw := js[skipSpace(js, i+1):]
		if complete {
			raw = pyRStrip(raw)
			if strings.HasSuffix(raw, "}") {
				raw = pyRStrip(raw[:len(raw)-1])
			}
		}
		return raw, true
	}
}

func (h *hermes) stream(s *step) *Delta {
	content := h.content(s.curText)
	var deltas []CallDelta
	for i, r := range hermesRegions(s.curText) {
		if i >= len(h.calls) {
			h.calls = append(h.calls, hermesCall{})
		}
		c := &h.calls[i]
		if !c.hasName {
			name, ok := hermesName(r.json)
			if !ok {
				break
			}
			c.name, c.hasName = name, true
			deltas = append(deltas, CallDelta{Index: i, Opens: true, Name: strp(name)})
		}
		args, ok := hermesArgs(r.json, r.complete)
		if !ok || runeLen(args) <= runeLen(c.streamed) {
			continue
		}
		diff := runeFrom(args, runeLen(c.streamed))
		c.streamed, c.args, c.hasArgs = args, args, true
		if diff != "" {
			deltas = append(deltas, CallDelta{Index: i, Arguments: strp(diff)})
		}
	}
	if (content != nil && *content != "") || len(deltas) > 0 {
		return &Delta{Content: content, Calls: deltas}
	}
	return nil
}

func (h *hermes) unstreamed() string {
	if len(h.calls) == 0 {
		return ""
	}
	c := h.calls[len(h.calls)-1]
	expected := "{}" // json.dumps of the default, an empty dict
	if c.hasArgs {
		expected = c.args
	}
	if strings.HasPrefix(expected, c.streamed) {
		return expected[len(c.streamed):]
	}
	return ""
}
