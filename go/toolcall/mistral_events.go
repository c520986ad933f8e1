package toolcall

import "strings"

// The ParserEngine half of vLLM's mistral parser for tokenizers with
// [ARGS]: semantic events become deltas (streamed) or calls (whole output),
// with MistralParser's overrides (any name is accepted, the empty one
// included; the opening '{' is sent with the name; the arguments are the
// first JSON value after the name).

// mistralDrop are the special tokens vLLM's engine drops: the tokenizer's
// all_special_tokens, which for Mistral's Hugging Face tokenizers are these.
var mistralDrop = []string{"<s>", "</s>", "<unk>"}

type slot struct {
	name     string
	args     strings.Builder
	nameSent bool
	opened   bool // the id has been sent
}

type mistralEngine struct {
	opts  Options
	eng   *engine
	slots []*slot

	deferred string // _deferred_content
	nonWS    bool   // _content_has_nonws
	tools    map[string]*pyValue
}

func newMistralEngine(o Options) *mistralEngine {
	return &mistralEngine{opts: o, eng: newEngine(o, mistralDrop)}
}

func (m *mistralEngine) unstreamed() string { return "" }

func (m *mistralEngine) stream(s *step) *Delta {
	return m.toDelta(m.eng.feed(s.deltaText, s.deltaIDs), false)
}

// flush is finish_streaming: what the end of the stream releases.
func (m *mistralEngine) flush() *Delta {
	evs := m.eng.finish()
	if len(evs) == 0 && m.deferred == "" {
		return nil
	}
	return m.toDelta(evs, true)
}

// extract is extract_tool_calls_from_content: the whole text through a
// fresh engine, without token ids.
func (m *mistralEngine) extract(text string) (*string, []Call, bool) {
	x := newMistralEngine(m.opts)
	evs := x.eng.feed(text, nil)
	evs = append(evs, x.eng.finish()...)
	d := x.toDelta(evs, true)
	calls := x.calls()
	var content *string
	if d != nil && d.Content != nil && *d.Content != "" {
		c := *d.Content
		if len(calls) > 0 {
			c = pyStrip(c)
		}
		if c != "" {
			content = &c
		}
	}
	return content, calls, len(calls) > 0
}

// calls is _build_extracted_result's calls.
func (m *mistralEngine) calls() []Call {
	var out []Call
	for _, s := range m.slots {
		if s.name == "" && s.args.Len() == 0 {
			continue
		}
		c := Call{Name: pyStrip(s.name), Arguments: "{}"}
		if raw := pyStrip(s.args.String()); raw != "" {
			c.Arguments = raw
			r := []rune(raw)
			if _, end, ok := pyRawDecode(r); ok {
				c.Arguments = string(r[:end])
			}
		}
		c.Arguments = m.fixArgTypes(c.Arguments, c.Name)
		out = append(out, c)
	}
	return out
}

// toDelta is _events_to_delta.
func (m *mistralEngine) toDelta(evs []semEvent, finished bool) *Delta {
	if len(evs) == 0 && m.deferred == "" {
		return nil
	}
	var calls []CallDelta
	var content string
	carried := m.deferred
	seenTool := false
	for _, ev := range evs {
		switch ev.typ {
		case evText:
			if seenTool {
				m.deferred += ev.value
			} else {
				content += ev.value
			}
			continue
		case evCallStart:
			for len(m.slots) <= ev.index {
				m.slots = append(m.slots, &slot{})
			}
		case evName:
			if ev.index >= 0 && ev.index < len(m.slots) {
				m.slots[ev.index].name += ev.value
			}
		case evArg:
			calls = m.argChunk(ev, calls)
		case evCallEnd:
			calls = m.callEnd(ev, calls)
		}
		seenTool = true
	}
	calls = coalesce(calls)
	if m.deferred != "" && (!seenTool || len(calls) == 0) {
		content = carried + content + m.deferred[len(carried):]
		m.deferred = ""
	}
	if !m.nonWS && content != "" {
		switch {
		case pyStrip(content) != "":
			m.nonWS = true
		case len(m.slots) > 0:
			content = ""
		case !finished:
			m.deferred, content = content, ""
		}
	}
	if content == "" && len(calls) == 0 {
		return nil
	}
	d := &Delta{Calls: calls}
	if content != "" {
		d.Content = &content
	}
	return d
}

// nameDelta is _emit_name_delta (every name accepted).
func (m *mistralEngine) nameDelta(i int, name string, calls []CallDelta) []CallDelta {
	s := m.slots[i]
	s.name, s.nameSent = name, true
	opens := !s.opened
	s.opened = true
	return append(calls, CallDelta{Index: i, Opens: opens, Name: strp(name)})
}

// argChunk is MistralParser._handle_arg_chunk over the engine's.
func (m *mistralEngine) argChunk(ev semEvent, calls []CallDelta) []CallDelta {
	if ev.index < 0 || ev.index >= len(m.slots) {
		return calls
	}
	s := m.slots[ev.index]
	before := s.nameSent
	s.args.WriteString(ev.value)
	switch {
	case !s.nameSent && (s.name != "" || ev.value != ""):
		calls = m.nameDelta(ev.index, s.name, calls)
	case s.nameSent && ev.value != "":
		calls = append(calls, CallDelta{Index: ev.index, Arguments: strp(ev.value)})
	}
	if ev.value != "" && !before && s.nameSent {
		calls = append(calls, CallDelta{Index: ev.index, Arguments: strp(ev.value)})
	}
	return calls
}

// callEnd is _handle_tool_end: a call whose name was never sent sends it
// now, with empty arguments.
func (m *mistralEngine) callEnd(ev semEvent, calls []CallDelta) []CallDelta {
	if ev.index < 0 || ev.index >= len(m.slots) || m.slots[ev.index].nameSent {
		return calls
	}
	calls = m.nameDelta(ev.index, m.slots[ev.index].name, calls)
	calls[len(calls)-1].Arguments = strp("")
	return calls
}

// coalesce is _coalesce_tool_call_deltas: one entry per index, in order.
func coalesce(calls []CallDelta) []CallDelta {
	if len(calls) < 2 {
		return calls
	}
	var out []CallDelta
	var args []*strings.Builder
	at := map[int]int{}
	for _, c := range calls {
		j, ok := at[c.Index]
		if !ok {
			at[c.Index] = len(out)
			out = append(out, c)
			args = append(args, nil)
			continue
		}
		e := &out[j]
		e.Opens = e.Opens || c.Opens
		if e.Name == nil {
			e.Name = c.Name
		}
		if c.Arguments == nil {
			continue
		}
		if args[j] == nil {
			args[j] = &strings.Builder{}
			if e.Arguments != nil {
				args[j].WriteString(*e.Arguments)
			}
		}
		args[j].WriteString(*c.Arguments)
	}
	for j, b := range args {
		if b != nil {
			out[j].Arguments = strp(b.String())
		}
	}
	return out
}
