package toolcall

import (
	"errors"
	"slices"
	"strings"
)

// vLLM 0.32's mistral parser (vllm/parser/mistral.py) with a Hugging Face
// tokenizer: without [ARGS] in the vocabulary (tokenizers before v11) it
// reads [TOOL_CALLS] then a JSON array of {"name", "arguments"} objects
// (this file); with [ARGS] it reads [TOOL_CALLS]name[ARGS]{...} through
// vLLM's parser engine (mistral_engine.go).

const (
	mistralBot  = "[TOOL_CALLS]"
	mistralArgs = "[ARGS]"
)

func newMistral(o Options) (impl, error) {
	bot, ok := o.lookup(mistralBot)
	if !ok {
		return nil, errors.New("toolcall: mistral: no [TOOL_CALLS] token in the vocabulary")
	}
	if _, ok := o.lookup(mistralArgs); ok {
		return newMistralEngine(o), nil
	}
	return &mistralLegacy{botID: bot, toolID: -1, json: newYajl()}, nil
}

// legacyState is vLLM's StreamingState.
type legacyState uint8

const (
	lsWaitToolStart legacyState = iota
	lsWaitToolKey
	lsName
	lsNameDone
	lsWaitArgsStart
	lsArgs
	lsArgsDone
	lsToolDone
	lsAllDone
)

// mistralLegacy is the pre-v11 path: the JSON after [TOOL_CALLS] is read
// by ijson events (yajl.go), the text split so that each piece's events
// are known.
type mistralLegacy struct {
	botID   int
	started bool // tool_call_started
	state   legacyState
	toolID  int
	opening bool // a call started whose id has not been sent
	json    *yajl

	// What the event handler leaves for the step (ijson coroutine state).
	bare    bool
	newTool bool
	name    *string
	strArgs *string
}

func (m *mistralLegacy) unstreamed() string { return "" }

// extract is _legacy_extract_tool_calls for tool_choice auto.
func (m *mistralLegacy) extract(text string) (*string, []Call, bool) {
	if !strings.Contains(text, mistralBot) {
		return &text, nil, false
	}
	parts := strings.Split(text, mistralBot)
	content, body := parts[0], ""
	for _, seg := range parts[1:] {
		if s := pyStrip(seg); s != "" {
			body = s
			break
		}
	}
	r := []rune(body)
	parsed, _, ok := pyRawDecode(r)
	if !ok {
		parsed = nil
		if i, j := strings.Index(body, "[{"), strings.LastIndex(body, "}]"); i >= 0 && j >= i+2 {
			if v, e := pyLoads([]rune(body[i : j+2])); e == decOK {
				parsed = v
			}
		}
	}
	calls := legacyCalls(parsed)
	if len(calls) == 0 {
		return &body, nil, false
	}
	if pyStrip(content) == "" {
		return nil, calls, true
	}
	return &content, calls, true
}

// legacyCalls is _pre_v11_function_calls.
func legacyCalls(parsed *pyValue) []Call {
	if parsed == nil {
		return nil
	}
	items := parsed.items
	switch parsed.kind {
	case pyDict:
		items = []*pyValue{parsed}
	case pyList:
	default:
		return nil
	}
	var out []Call
	for _, tc := range items {
		if tc.kind != pyDict || (tc.get("name") == nil && tc.get("arguments") == nil) {
			continue
		}
		c := Call{Arguments: "{}"}
		if n := tc.get("name"); n != nil && n.kind == pyStr {
			c.Name = n.text
		}
		if a := tc.get("arguments"); a != nil && a.kind == pyStr {
			c.Arguments = a.text
		} else if a != nil && a.kind != pyNull {
			c.Arguments = a.dumps()
		}
		out = append(out, c)
	}
	return out
}

// stream is extract_tool_calls_streaming's pre-v11 path.
func (m *mistralLegacy) stream(s *step) *Delta {
	text := s.deltaText
	hasBot := slices.Contains(s.deltaIDs, m.botID) || strings.Contains(text, mistralBot)
	if hasBot {
		m.started = true
	}
	if !m.started {
		return &Delta{Content: strp(text)}
	}
	var content *string
	if hasBot {
		parts := strings.Split(text, mistralBot)
		if !strings.HasPrefix(text, mistralBot) {
			content = strp(parts[0])
		}
		text = strings.Join(parts[1:], "")
	}
	var calls []CallDelta
	cur := CallDelta{Index: m.toolID}
	var args strings.Builder // cur's arguments, once hasArgs
	hasArgs, modified := false, false
	flush := func() {
		if modified {
			cur.Opens, m.opening = m.opening, false
			if hasArgs {
				cur.Arguments = strp(args.String())
			}
			calls = append(calls, cur)
		}
	}
	for text != "" {
		before := m.state
		var piece string
		if m.state == lsAllDone {
			content, text = strp(text), ""
			continue
		}
		piece, text = m.split(text)
		if !m.json.feed(piece, m.onEvent) {
			return nil // ijson raised: vLLM logs it and sends nothing
		}
		if m.newTool {
			m.newTool = false
			flush()
			modified, hasArgs = false, false
			args.Reset()
			m.toolID++
			m.opening = true
			cur = CallDelta{Index: m.toolID}
		}
		if m.name != nil {
			modified, cur.Name, m.name = true, m.name, nil
		}
		if m.strArgs != nil {
			modified, hasArgs = true, true
			args.Reset()
			args.WriteString(*m.strArgs)
			m.strArgs = nil
		}
		if m.state == lsNameDone {
			m.state = lsWaitToolKey
		}
		if m.state == lsArgs || m.state == lsArgsDone {
			if m.state == lsArgsDone {
				m.state = lsWaitToolKey
			}
			modified, hasArgs = true, true
			args.WriteString(piece)
			if before != lsArgs {
				a := pyLStrip(args.String())
				args.Reset()
				args.WriteString(a)
			}
		}
	}
	flush()
	hasContent := content != nil && *content != ""
	if hasContent || len(calls) > 0 {
		d := &Delta{Calls: calls}
		if hasContent {
			d.Content = content
		}
		return d
	}
	if m.state == lsAllDone {
		return &Delta{}
	}
	return nil
}

// split is _split_delta with the stops of the current state: the piece
// ends after the first stop character.
func (m *mistralLegacy) split(text string) (piece, rest string) {
	var stops string
	switch m.state {
	case lsWaitToolStart:
		stops = "{"
	case lsWaitToolKey:
		stops = ":{}"
	case lsName:
		stops = ",]}"
	case lsWaitArgsStart:
		stops = "{}"
	case lsArgs:
		stops = "}"
	case lsArgsDone, lsNameDone:
		stops = "}]"
	case lsToolDone:
		stops = "{]"
	}
	if i := strings.IndexAny(text, stops); i >= 0 {
		return text[:i+1], text[i+1:]
	}
	return text, ""
}

// onEvent is update_stream_state_pre_v11_tokenizer for one ijson event.
func (m *mistralLegacy) onEvent(e jsonEvent) {
	if e.kind == evStartMap && prefixIs(e.path, "") {
		m.bare = true
	}
	at := func(want string) bool {
		if !m.bare {
			return prefixIs(e.path, want)
		}
		if want == "item" {
			return prefixIs(e.path, "")
		}
		rest, ok := strings.CutPrefix(want, "item.")
		return ok && rest != "" && prefixIs(e.path, rest)
	}
	switch {
	case e.kind == evStartMap && at("item"):
		m.state, m.newTool = lsWaitToolKey, true
	case e.kind == evMapKey && at("item") && e.value == "name":
		m.state = lsName
	case e.kind == evString && at("item.name"):
		m.name, m.state = strp(e.value), lsNameDone
	case e.kind == evMapKey && at("item") && e.value == "arguments":
		m.state = lsWaitArgsStart
	case e.kind == evStartMap && at("item.arguments"):
		m.state = lsArgs
	case e.kind == evEndMap && at("item.arguments"):
		m.state = lsArgsDone
	case e.kind == evString && at("item.arguments"):
		m.strArgs = strp(e.value)
	case e.kind == evEndMap && at("item"):
		m.state = lsToolDone
		if m.bare {
			m.state = lsAllDone
		}
	case e.kind == evEndArray && at(""):
		m.state = lsAllDone
	}
}
