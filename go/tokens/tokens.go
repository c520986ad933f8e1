// Package tokens is the one Go statement of the token schema that LLM
// requests and their response items follow (Dynamo's preprocessed request,
// the subset this project reads):
//
//   - a request carries "token_ids" (the prompt, then the tokens generated
//     so far) and "max_tokens", at the top level or under
//     "stop_conditions" (null: no limit);
//   - a response item carries "token_ids" (the new tokens) and
//     "finish_reason" (null until the last).
//
// The request plane stays generic JSON: it migrates a request through a
// hook (plane.Options.Continuation), and a Continuation of this package is
// what the library installs. The frontend reads items with ParseItem.
// Python's own reader of the schema is dynamo_ctx/backends/vllm.py.
package tokens

import (
	"encoding/json"
	"fmt"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

// Item is a response item as the schema defines it.
type Item struct {
	TokenIDs     []int   `json:"token_ids"`
	FinishReason *string `json:"finish_reason"`
	// LogProbs and TopLogprobs, when the request asked the engine for
	// logprobs: per token of TokenIDs, its log probability, and the
	// engine's candidates at its position (the sampled token first, then
	// the others by rank).
	LogProbs    []float64     `json:"log_probs,omitempty"`
	TopLogprobs [][]Candidate `json:"top_logprobs,omitempty"`
	// PromptLogProbs and PromptTopLogprobs, in the first item when the
	// request asked prompt logprobs: the same for each prompt token (the
	// first has none: null and an empty list).
	PromptLogProbs    []*float64    `json:"prompt_log_probs,omitempty"`
	PromptTopLogprobs [][]Candidate `json:"prompt_top_logprobs,omitempty"`
}

// Candidate is a token the engine weighed at a position.
type Candidate struct {
	TokenID int     `json:"token_id"`
	Logprob float64 `json:"logprob"`
	Rank    int     `json:"rank"`
}

// Request is a token request as a worker reads it.
type Request struct {
	TokenIDs []int // the prompt's (or the sequence so far's) token ids
	// MaxTokens is stop_conditions.max_tokens, else max_tokens, else -1 (no limit).
	MaxTokens int
}

// ParseRequest reads a token request.
func ParseRequest(payload []byte) (Request, error) {
	var p struct {
		TokenIDs       []int `json:"token_ids"`
		MaxTokens      *int  `json:"max_tokens"`
		StopConditions *struct {
			MaxTokens *int `json:"max_tokens"`
		} `json:"stop_conditions"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return Request{}, err
	}
	r := Request{TokenIDs: p.TokenIDs, MaxTokens: -1}
	switch {
	case p.StopConditions != nil && p.StopConditions.MaxTokens != nil:
		r.MaxTokens = *p.StopConditions.MaxTokens
	case p.MaxTokens != nil:
		r.MaxTokens = *p.MaxTokens
	}
	return r, nil
}

// Outgoing is a token request as a frontend writes it.
type Outgoing struct {
	Model           string         `json:"model"`
	TokenIDs        []int          `json:"token_ids"`
	StopConditions  StopConditions `json:"stop_conditions"`
	SamplingOptions map[string]any `json:"sampling_options,omitempty"` // seed, temperature, top_p, ...
}

// StopConditions says when the engine stops.
type StopConditions struct {
	MaxTokens    int   `json:"max_tokens"`
	StopTokenIDs []int `json:"stop_token_ids,omitempty"`
	IgnoreEOS    *bool `json:"ignore_eos,omitempty"`
}

// Encode is the request's JSON.
func (r *Outgoing) Encode() []byte { return mustJSON(r) }

// ParseItem reads a response item.
func ParseItem(raw []byte) (Item, error) {
	var it Item
	ids := make([]int, 0, 4)
	if finish, ok := scanItem(raw, func(v int, _ []byte) { ids = append(ids, v) }); ok {
		return Item{TokenIDs: ids, FinishReason: finish}, nil
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return Item{}, fmt.Errorf("malformed item: %w", err)
	}
	return it, nil
}

// scanItem reads an item of the shape workers write, with the cost of one
// pass over its bytes (it is read for every token): an object of
// "token_ids", an array of integers of at most 18 digits, and optionally
// then "finish_reason", null or a string of printable ASCII without
// escapes, with JSON whitespace anywhere between. It calls id with each
// token id's value and literal, in order, and returns the finish reason.
// For anything else (other members, another order, escapes, big numbers,
// malformed JSON) it returns false, having perhaps called id already:
// the caller then reads the item with encoding/json, which decides what
// it means or whether it is an error. For what it accepts, the result is
// the one encoding/json gives.
func scanItem(b []byte, id func(v int, lit []byte)) (finish *string, ok bool) {
	i, ok := jsonscan.Expect(b, 0, `{`, `"token_ids"`, `:`, `[`)
	if !ok {
		return nil, false
	}
	if jsonscan.HasAt(b, i, `]`) {
		i++
	} else {
		for {
			start := i
			neg := jsonscan.HasAt(b, i, `-`)
			if neg {
				i++
			}
			digits := i
			v := 0
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				v = v*10 + int(b[i]-'0')
				i++
			}
			n := i - digits
			if n == 0 || n > 18 || (n > 1 && b[digits] == '0') {
				return nil, false
			}
			if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
				return nil, false // encoding/json refuses these for an int
			}
			if neg {
				v = -v
			}
			id(v, b[start:i])
			i = jsonscan.SkipSpace(b, i)
			if jsonscan.HasAt(b, i, `]`) {
				i++
				break
			}
			if !jsonscan.HasAt(b, i, `,`) {
				return nil, false
			}
			i = jsonscan.SkipSpace(b, i+1)
		}
	}
	i = jsonscan.SkipSpace(b, i)
	if jsonscan.HasAt(b, i, `,`) {
		if i, ok = jsonscan.Expect(b, i, `,`, `"finish_reason"`, `:`); !ok {
			return nil, false
		}
		switch {
		case jsonscan.HasAt(b, i, `null`):
			i += len(`null`)
		case jsonscan.HasAt(b, i, `"`):
			end, escaped := jsonscan.StringEnd(b, i+1)
			if escaped {
				return nil, false // or no closing quote
			}
			for _, c := range b[i+1 : end] {
				if c < 0x20 || c > 0x7e {
					return nil, false
				}
			}
			f := string(b[i+1 : end])
			finish = &f
			i = end + 1
		default:
			return nil, false
		}
		i = jsonscan.SkipSpace(b, i)
	}
	if !jsonscan.HasAt(b, i, `}`) || jsonscan.SkipSpace(b, i+1) != len(b) {
		return nil, false
	}
	return finish, true
}

// Continuation carries a token request across migration attempts: it
// records the token ids of the items passed to the caller (Observe), and
// rewrites the request for the next worker so that it continues where the
// last one stopped (Next): "token_ids" extended by those tokens,
// "max_tokens" (top level and under "stop_conditions") reduced by their
// number, never below 0. It also says when the items observed complete
// the request (Complete), which then needs no next attempt. One
// Continuation serves one request.
type Continuation struct {
	received []json.RawMessage // token ids passed to the caller so far, as they were written
	finished bool              // the last item carried a finish reason of a request done (completes)
}

// New returns the Continuation of one request (plane.Options.Continuation).
func New() *Continuation { return &Continuation{} }

// Observe records an item passed to the caller. Items without token ids
// (or not objects) add nothing. An item with a finish reason, or with
// tokens, decides whether the request is finished (Complete); others
// leave that as it was.
func (c *Continuation) Observe(item []byte) {
	n := len(c.received)
	if finish, ok := scanItem(item, func(_ int, lit []byte) { c.received = append(c.received, append(json.RawMessage(nil), lit...)) }); ok {
		c.noteEnd(finish, len(c.received) > n)
		return
	}
	c.received = c.received[:n] // what the scan added before it gave up
	var tok struct {
		TokenIDs     []json.RawMessage `json:"token_ids"`
		FinishReason json.RawMessage   `json:"finish_reason"` // a string ends; anything else is not read
	}
	if json.Unmarshal(item, &tok) == nil {
		c.received = append(c.received, tok.TokenIDs...)
		var reason *string // null: none; absent or not a string: not read
		if json.Unmarshal(tok.FinishReason, &reason) != nil {
			reason = nil
		}
		c.noteEnd(reason, len(tok.TokenIDs) > 0)
	}
}

// noteEnd applies an item's finish reason (nil: none) and whether it
// carried tokens to finished: a reason decides, tokens without one undo.
func (c *Continuation) noteEnd(reason *string, tokens bool) {
	switch {
	case reason != nil:
		c.finished = Completes(*reason)
	case tokens:
		c.finished = false
	}
}

// Complete reports whether the items observed complete the request
// payload (plane.Completer): the last one carried the finish reason of a
// request that is done ("stop", "length", "eos": not "abort", "cancelled",
// "error", which say it was not), or they hold all the tokens its
// max_tokens allows (at least one; only when every max_tokens the request
// carries is an integer, so that no reader of it could allow more).
func (c *Continuation) Complete(payload []byte) bool {
	if c.finished {
		return true
	}
	if len(c.received) == 0 {
		return false
	}
	n, ok := tokenLimit(payload)
	return ok && len(c.received) >= n
}

// Completes reports whether a worker's finish reason says the request is
// done: "stop", "length" and "eos" do; "abort", "cancelled", "error" and
// any other say it ended without being done, which a migration may
// continue.
func Completes(reason string) bool {
	switch reason {
	case "stop", "length", "eos":
		return true
	}
	return false
}

// tokenLimit is a request's max_tokens, stop_conditions' first, when each
// one it carries is an integer of 0 or more; false otherwise (none, null,
// or anything else). Keys match exactly, as the worker's reader and
// continuation read them.
func tokenLimit(payload []byte) (int, bool) {
	var req map[string]json.RawMessage
	if json.Unmarshal(payload, &req) != nil {
		return 0, false
	}
	fields := []json.RawMessage{req["max_tokens"]}
	if raw, ok := req["stop_conditions"]; ok && !jsonscan.IsNull(raw) {
		var sc map[string]json.RawMessage
		if json.Unmarshal(raw, &sc) != nil {
			return 0, false
		}
		fields = append(fields, sc["max_tokens"]) // the one that wins
	}
	n, found := 0, false
	for _, raw := range fields {
		if raw == nil {
			continue
		}
		var v int
		if jsonscan.IsNull(raw) || json.Unmarshal(raw, &v) != nil || v < 0 {
			return 0, false
		}
		n, found = v, true
	}
	return n, found
}

// Count is the number of tokens observed.
func (c *Continuation) Count() int { return len(c.received) }

// Next returns payload rewritten for the next attempt (payload itself is
// not modified). Without tokens observed, or for a payload that is not a
// JSON object, it is payload unchanged; "token_ids" that is not an array
// is an error.
func (c *Continuation) Next(payload []byte) ([]byte, error) {
	if len(c.received) == 0 {
		return payload, nil
	}
	return continuation(payload, c.received)
}

func continuation(payload []byte, received []json.RawMessage) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(payload, &req); err != nil || req == nil {
		return payload, nil // not a token request (or null): resend as is
	}
	var ids []json.RawMessage
	if raw, ok := req["token_ids"]; ok {
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, err
		}
	}
	ids = append(ids, received...)
	req["token_ids"] = mustJSON(ids)
	reduce := func(m map[string]json.RawMessage) {
		var n int64
		// null (no limit) stays null: Unmarshal of null leaves n at 0.
		if raw, ok := m["max_tokens"]; ok && !jsonscan.IsNull(raw) && json.Unmarshal(raw, &n) == nil {
			n -= int64(len(received))
			if n < 0 {
				n = 0
			}
			m["max_tokens"] = mustJSON(n)
		}
	}
	reduce(req)
	if raw, ok := req["stop_conditions"]; ok {
		var sc map[string]json.RawMessage
		if json.Unmarshal(raw, &sc) == nil {
			reduce(sc)
			req["stop_conditions"] = mustJSON(sc)
		}
	}
	return json.Marshal(req)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only values that always encode are passed
	}
	return b
}
