package frontend

// The OpenAI request surface: what a completions or chat request may carry,
// how it is checked, and how it becomes token requests for the workers.
//
//   - Prompts (completions): a string, an array of strings (a batch: one
//     choice per prompt), an array of token ids, or an array of arrays of
//     token ids. Chat messages are rendered by the model's chat template
//     (text.go; the stand-in's is "<role>: <content>\n" each).
//   - n: each prompt is run n times, as n worker requests; with a seed,
//     choice j gets seed+j, without one (and n > 1) the frontend draws a base
//     seed, so the choices differ as sampled ones would. Choice index i*n+j
//     is prompt i's j-th choice, as OpenAI numbers them.
//   - stop (strings): matched on the detokenized text by the frontend; the
//     text ends before the stop string, finish_reason is "stop" and the
//     worker's request is ended. stop_token_ids (vLLM's extension) and
//     ignore_eos go to the engine in stop_conditions.
//   - seed, temperature, top_p, presence_penalty, frequency_penalty go to
//     the engine in sampling_options.
//   - vLLM's extensions (top_k, min_p, ..., skip_special_tokens,
//     include_stop_str_in_output): extensions.go; structured output
//     (response_format, structured_outputs): structured.go; logprobs and
//     top_logprobs: logprobs.go.
//   - Refused with 400 invalid_request_error naming the param: what the
//     engine interface does not carry (echo in chat, best_of > n, suffix,
//     tools in the completions API)
//     and values out of OpenAI's ranges.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// Bounds of the request parameters.
const (
	// MaxChoices bounds the worker requests one HTTP request makes (prompts
	// in a batch times n).
	MaxChoices = 128
	// MaxStop is how many stop strings a request may give (OpenAI's limit).
	MaxStop = 4
	// MaxStopLen bounds each stop string, in bytes: the text a choice holds
	// back while it could be the start of one.
	MaxStopLen = 1024
	// MaxStopTokenIDs bounds stop_token_ids, which every worker request of
	// the HTTP request (up to MaxChoices) carries.
	MaxStopTokenIDs = 1024
)

// completionRequest holds the fields of both OpenAI request kinds that the
// frontend reads. Fields it does not know are ignored, as OpenAI does.
type completionRequest struct {
	Model     string          `json:"model"`
	Prompt    json.RawMessage `json:"prompt"`
	Messages  []chatMessage   `json:"messages"`
	MaxTokens *int            `json:"max_tokens"`
	// max_completion_tokens is the newer name in the chat API.
	MaxCompletionTokens *int `json:"max_completion_tokens"`
	Stream              bool `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`

	N                *int            `json:"n"`
	Stop             json.RawMessage `json:"stop"`
	StopTokenIDs     []int           `json:"stop_token_ids"`
	IgnoreEOS        *bool           `json:"ignore_eos"`
	Seed             *int64          `json:"seed"`
	Temperature      *float64        `json:"temperature"`
	TopP             *float64        `json:"top_p"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`

	// The chat template's options (vLLM's extensions of the chat API, and
	// of /tokenize's chat form): hfmodel.ChatOptions.
	AddGenerationPrompt  *bool          `json:"add_generation_prompt"`
	ContinueFinalMessage bool           `json:"continue_final_message"`
	ChatTemplateKwargs   map[string]any `json:"chat_template_kwargs"`
	// AddSpecialTokens: the tokenizer's special tokens (its BOS) are added
	// to the prompt; by default to a completions prompt and not to a
	// rendered chat, whose template writes them (vLLM's defaults).
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// vLLM's sampling and text extensions (extensions.go).
	Extensions

	// Only on /tokenize and /detokenize (tokenize.go).
	ReturnTokenStrs bool    `json:"return_token_strs"`
	Tokens          []int64 `json:"tokens"`

	// Refused unless absent or neutral.
	ChatTemplate   *string         `json:"chat_template"`
	Logprobs       json.RawMessage `json:"logprobs"`
	TopLogprobs    *int            `json:"top_logprobs"`
	Echo           bool            `json:"echo"`
	BestOf         *int            `json:"best_of"`
	Suffix         *string         `json:"suffix"`
	ResponseFormat *responseFormat `json:"response_format"`

	// Tools (tools.go) and reasoning (chatparse.go), chat only.
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	IncludeReasoning  *bool           `json:"include_reasoning"`
	// ReasoningEffort (OpenAI's) reaches the template, and switches a
	// template's enable_thinking as vLLM does (chatOptions).
	ReasoningEffort *string `json:"reasoning_effort"`
}

// chatMessage is one of the chat's messages (text.go reads it).
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// An assistant's tool calls, a tool message's id of the call it
	// answers, the author's name, an assistant's reasoning.
	ToolCalls  json.RawMessage `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
	Name       *string         `json:"name"`
	Reasoning  *string         `json:"reasoning"`
}

// requestError is a 400 invalid_request_error about param.
type requestError struct{ msg, param, code string }

func (e *requestError) Error() string { return e.msg }

func invalid(param, code, format string, args ...any) *requestError {
	return &requestError{msg: fmt.Sprintf(format, args...), param: param, code: code}
}

func unsupported(param, what string) *requestError {
	return invalid(param, "unsupported_parameter", "%s is not supported: the engine interface does not carry it", what)
}

// prompt is one prompt of a request: its token ids (the stand-in tokenizer's
// for text).
type prompt struct {
	tokens []int
	text   string // a text prompt's text ("" for token ids), which echo repeats
}

// plan is a checked request: what to run and how to answer.
type plan struct {
	req          *completionRequest
	chat         bool
	prompts      []prompt
	n            int
	stops        []string
	seed         *int64 // choice j's seed is *seed + j
	includeUsage bool
	engine       map[string]any // the engine parameters asked (extensions.go)
	skipSpecial  bool           // special tokens are not text
	logprobsK    int            // candidates asked per token (logprobs.go); -1: no logprobs
	tools        toolPlan       // tools.go
	// The parsers of the model's chat output (chatparse.go): "" for none.
	toolParser, reasoningParser string
}

// checkExtensions checks vLLM's extensions of the request against the
// model's text and the cards of the instances it may go to (extensions.go).
func (p *plan) checkExtensions(model string, tx text, cards []modelcard.Card) error {
	asked, err := p.req.engineParams(tx.vocabSize())
	if err != nil {
		return err
	}
	so, soFrom, err := structured(p.req)
	if err != nil {
		return err
	}
	if p.toolParser, err = p.tools.toolParser(model, cards); err != nil {
		return err
	}
	if p.chat {
		if p.reasoningParser, err = reasoningParserOf(model, cards); err != nil {
			return err
		}
	}
	if jsonToolChoice(p.toolParser) { // else required and named are read as auto, unconstrained
		schema, err := p.tools.schema()
		if err != nil {
			return err
		}
		if schema != nil { // as vLLM: the tools' schema replaces response_format's
			so, soFrom = map[string]any{"json": schema}, "tool_choice"
		}
	}
	if so != nil {
		asked["structured_outputs"] = so
	}
	if p.logprobsK, err = p.logprobsAsked(); err != nil {
		return err
	}
	from := map[string]string{"structured_outputs": soFrom}
	if p.logprobsK >= 0 {
		asked["logprobs"] = p.logprobsK
		from["logprobs"] = "logprobs"
		if p.req.Echo { // the prompt's tokens' logprobs too
			asked["prompt_logprobs"] = p.logprobsK
			from["prompt_logprobs"] = "echo"
		}
	}
	if err := checkHonoured(model, asked, from, cards); err != nil {
		return err
	}
	p.engine = asked
	if p.skipSpecial, err = p.req.skipSpecial(); err != nil {
		return err
	}
	p.skipSpecial = p.skipsSpecial()
	return p.checkParsers(tx)
}

// check validates the sampling and output parameters.
func (p *plan) check() error {
	req := p.req
	p.n = 1
	if req.N != nil {
		if *req.N < 1 || *req.N > MaxChoices {
			return invalid("n", "invalid_n", "n must be between 1 and %d", MaxChoices)
		}
		p.n = *req.N
	}
	if req.StreamOptions != nil {
		if !req.Stream {
			return invalid("stream_options", "invalid_stream_options", "stream_options is only allowed when stream is true")
		}
		p.includeUsage = req.StreamOptions.IncludeUsage
	}
	stops, err := parseStop(req.Stop)
	if err != nil {
		return err
	}
	p.stops = stops
	if len(req.StopTokenIDs) > MaxStopTokenIDs {
		return invalid("stop_token_ids", "invalid_stop", "stop_token_ids may have at most %d ids", MaxStopTokenIDs)
	}
	for _, id := range req.StopTokenIDs {
		if id < 0 {
			return invalid("stop_token_ids", "invalid_stop", "stop_token_ids must be non-negative token ids")
		}
	}
	if t := req.Temperature; t != nil && (math.IsNaN(*t) || *t < 0 || *t > 2) {
		return invalid("temperature", "invalid_temperature", "temperature must be between 0 and 2")
	}
	if t := req.TopP; t != nil && (math.IsNaN(*t) || *t <= 0 || *t > 1) {
		return invalid("top_p", "invalid_top_p", "top_p must be greater than 0 and at most 1")
	}
	for param, v := range map[string]*float64{"presence_penalty": req.PresencePenalty, "frequency_penalty": req.FrequencyPenalty} {
		if v != nil && (math.IsNaN(*v) || *v < -2 || *v > 2) {
			return invalid(param, "invalid_"+param, "%s must be between -2 and 2", param)
		}
	}
	if req.Seed != nil && *req.Seed > math.MaxInt64-int64(p.n) {
		return invalid("seed", "invalid_seed", "seed is too large")
	}
	for param, v := range map[string]*int{"max_completion_tokens": req.MaxCompletionTokens, "max_tokens": req.MaxTokens} {
		if v != nil && *v <= 0 {
			return invalid(param, "invalid_max_tokens", "%s must be positive", param)
		}
	}
	p.seed = req.Seed
	if p.seed == nil && p.n > 1 {
		s := rand.Int64N(1 << 31)
		p.seed = &s
	}
	// What the engine interface does not carry.
	if req.Echo && p.chat {
		return unsupported("echo", "echo in the chat API")
	}
	if req.BestOf != nil && *req.BestOf != p.n {
		return unsupported("best_of", "best_of other than n")
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return unsupported("suffix", "suffix")
	}
	if p.tools, err = req.checkTools(p.chat); err != nil {
		return err
	}
	if e := req.ReasoningEffort; e != nil && !slices.Contains(reasoningEfforts, *e) {
		return invalid("reasoning_effort", "invalid_reasoning_effort", "reasoning_effort must be one of %s", strings.Join(reasoningEfforts, ", "))
	}
	return checkChatOptions(req)
}

// renderChat renders the request's messages in the model's text, with the
// request's template options.
func renderChat(req *completionRequest, tx text) (string, error) {
	sep := "\n"
	if _, ok := tx.(standIn); ok {
		sep = ""
	}
	msgs, err := chatMessages(req.Messages, sep)
	if err != nil {
		return "", invalid("messages", "invalid_prompt", "%s", err.Error())
	}
	o := req.chatOptions()
	if o.Tools, err = chatTools(req.Tools); err != nil {
		return "", invalid("tools", "invalid_tools", "%s", err.Error())
	}
	s, err := tx.chat(msgs, o)
	if err != nil {
		return "", invalid("messages", "invalid_prompt", "%s", err.Error())
	}
	return s, nil
}

// checkChatOptions refuses chat-template options that contradict each
// other, and a template sent with the request (vLLM refuses one unless its
// server trusts request templates; the frontend renders the model's own).
func checkChatOptions(req *completionRequest) error {
	if req.ChatTemplate != nil {
		return invalid("chat_template", "unsupported_parameter", "chat_template is not accepted: the model's own chat template renders the messages")
	}
	if err := req.chatOptions().Check(); err != nil {
		param := "chat_template_kwargs"
		if req.ContinueFinalMessage {
			param = "continue_final_message"
		}
		return invalid(param, "invalid_chat_options", "%s", err.Error())
	}
	return nil
}

// chatOptions are the request's options for the chat template
// (add_generation_prompt is true unless the request says otherwise).
//
// reasoning_effort is a variable too, and unless chat_template_kwargs set
// enable_thinking, it sets enable_thinking (false for "none"), as vLLM's
// server does for templates that need thinking switched on.
func (req *completionRequest) chatOptions() hfmodel.ChatOptions {
	vars := req.ChatTemplateKwargs
	if e := req.ReasoningEffort; e != nil {
		vars = maps.Clone(vars)
		if vars == nil {
			vars = map[string]any{}
		}
		vars["reasoning_effort"] = *e
		if _, set := req.ChatTemplateKwargs["enable_thinking"]; !set {
			vars["enable_thinking"] = *e != "none"
		}
	}
	return hfmodel.ChatOptions{
		AddGenerationPrompt:  req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage,
		Vars:                 vars,
	}
}

// reasoningEfforts are the values reasoning_effort may take (vLLM's).
var reasoningEfforts = []string{"none", "minimal", "low", "medium", "high", "xhigh", "max"}

// addSpecialTokens: whether the prompt gets the tokenizer's special tokens
// (chat: a rendered conversation).
func (req *completionRequest) addSpecialTokens(chat bool) bool {
	if req.AddSpecialTokens != nil {
		return *req.AddSpecialTokens
	}
	return !chat
}

// parseStop reads OpenAI's stop: null, a string, or an array of up to
// MaxStop strings; empty strings are dropped (they match nothing).
func parseStop(raw json.RawMessage) ([]string, error) {
	if jsonscan.IsNull(raw) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if len(one) > MaxStopLen {
			return nil, invalid("stop", "invalid_stop", "a stop string may have at most %d bytes", MaxStopLen)
		}
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("stop", "invalid_stop", "stop must be a string or an array of strings")
	}
	if len(list) > MaxStop {
		return nil, invalid("stop", "invalid_stop", "stop may have at most %d strings", MaxStop)
	}
	out := list[:0]
	for _, s := range list {
		if len(s) > MaxStopLen {
			return nil, invalid("stop", "invalid_stop", "a stop string may have at most %d bytes", MaxStopLen)
		}
		if s != "" {
			out = append(out, s)
		}
	}
	return out, nil
}

// parsePrompts reads the request's prompts in the model's language tx.
// limit bounds each prompt's tokens; a text too long to fit is refused
// before it is tokenised.
func parsePrompts(req *completionRequest, chat bool, limit int, tx text) ([]prompt, error) {
	tooLong := func(n int) error {
		return invalid("max_tokens", "context_length_exceeded",
			"this model's maximum context length is %d tokens; a prompt has %d tokens", limit, n)
	}
	fromText := func(s string) (prompt, error) {
		if max := tx.maxPromptBytes(limit); max > 0 && len(s) > max {
			return prompt{}, tooLong(len(s))
		}
		ids, err := tx.encode(s, req.addSpecialTokens(chat))
		if err != nil {
			return prompt{}, invalid("prompt", "invalid_prompt", "the prompt could not be tokenized: %s", err.Error())
		}
		if len(ids) > limit {
			return prompt{}, tooLong(len(ids))
		}
		return prompt{tokens: ids, text: s}, nil
	}
	ids := func(t []int) (prompt, error) {
		if len(t) == 0 {
			return prompt{}, invalid("prompt", "invalid_prompt", "a token prompt must not be empty")
		}
		if len(t) > limit {
			return prompt{}, tooLong(len(t))
		}
		for _, id := range t {
			if id < 0 {
				return prompt{}, invalid("prompt", "invalid_prompt", "token ids must be non-negative")
			}
		}
		return prompt{tokens: t}, nil
	}
	if chat {
		s, err := renderChat(req, tx)
		if err != nil {
			return nil, err
		}
		p, err := fromText(s)
		return []prompt{p}, err
	}
	bad := invalid("prompt", "invalid_prompt", "prompt must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
	raw := jsonscan.Trim(req.Prompt)
	if len(raw) == 0 {
		return nil, invalid("prompt", "invalid_prompt", "prompt is required")
	}
	var out []prompt
	add := func(p prompt, err error) error {
		if err != nil {
			return err
		}
		if len(out) == MaxChoices {
			return invalid("prompt", "invalid_prompt", "at most %d prompts", MaxChoices)
		}
		out = append(out, p)
		return nil
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, bad
		}
		return out, add(fromText(s))
	case '[':
	default:
		return nil, bad
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return nil, bad
	}
	switch first := jsonscan.Trim(items[0]); {
	case len(first) > 0 && first[0] == '"':
		var list []string
		if json.Unmarshal(raw, &list) != nil {
			return nil, bad
		}
		for _, s := range list {
			if err := add(fromText(s)); err != nil {
				return nil, err
			}
		}
	case len(first) > 0 && first[0] == '[':
		var lists [][]int
		if json.Unmarshal(raw, &lists) != nil {
			return nil, bad
		}
		for _, t := range lists {
			if err := add(ids(t)); err != nil {
				return nil, err
			}
		}
	default:
		var t []int
		if json.Unmarshal(raw, &t) != nil {
			return nil, bad
		}
		if err := add(ids(t)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// maxTokens is the completion budget of a prompt of promptLen tokens: the
// request's max_completion_tokens or max_tokens; else, for chat, the rest of
// the context (the engine stops at its limit or EOS), and for completions
// defaultMax (OpenAI's default of 16).
func (p *plan) maxTokens(promptLen, limit, defaultMax int) (int, error) {
	req := p.req
	var given *int
	if req.MaxCompletionTokens != nil {
		given = req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		given = req.MaxTokens
	}
	n := defaultMax
	switch {
	case given != nil:
		n = *given
	case p.chat:
		n = limit - promptLen
	}
	if promptLen > limit || n <= 0 || n > limit-promptLen {
		return 0, invalid("max_tokens", "context_length_exceeded",
			"this model's maximum context length is %d tokens; the request has %d prompt tokens and max_tokens %d", limit, promptLen, n)
	}
	return n, nil
}

// payload is the token request for one choice (go/tokens: the schema).
func (p *plan) payload(model string, ids []int, maxTokens, choice int) []byte {
	req := p.req
	out := tokens.Outgoing{Model: model, TokenIDs: ids, StopConditions: tokens.StopConditions{
		MaxTokens: maxTokens, StopTokenIDs: req.StopTokenIDs, IgnoreEOS: req.IgnoreEOS}}
	sampling := map[string]any{}
	if p.seed != nil {
		sampling["seed"] = *p.seed + int64(choice%p.n)
	}
	for k, v := range map[string]*float64{"temperature": req.Temperature, "top_p": req.TopP,
		"presence_penalty": req.PresencePenalty, "frequency_penalty": req.FrequencyPenalty} {
		if v != nil {
			sampling[k] = *v
		}
	}
	for k, v := range p.engine {
		sampling[k] = v
	}
	if len(sampling) > 0 {
		out.SamplingOptions = sampling
	}
	return out.Encode()
}

// stopper finds stop strings in a choice's text as it streams: text that
// could be the start of a stop string is held back until it is known not to
// be one. Each stop string has a matcher (Knuth-Morris-Pratt) that reads
// each byte once, so a choice's cost is linear in its text, whatever the
// stop strings (a long one that the output almost matches made it
// quadratic: the held text was copied and searched again per token).
type stopper struct {
	stops   []string
	include bool      // include_stop_str_in_output: the text ends with the stop string
	fail    [][]int32 // per stop: its failure function, made on first use
	state   []int     // per stop: the longest suffix of the text read that is a proper prefix of it
	pending string    // held back: the longest of those suffixes
	hit     bool      // a stop string was found
}

// feed adds text and returns what may be sent, and whether a stop string
// was found (then nothing after it is ever sent). Of the stop strings found
// in the held text and text, the one that starts first wins.
func (s *stopper) feed(text string) (string, bool) { return s.feedArmed(text, true) }

// feedArmed is feed; unless armed (min_tokens not yet reached: vLLM checks
// stop strings only in the text of the tokens after them), a stop string
// that ends in text is not a stop.
func (s *stopper) feedArmed(text string, armed bool) (string, bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	if s.fail == nil {
		s.fail = make([][]int32, len(s.stops))
		s.state = make([]int, len(s.stops))
		for i, stop := range s.stops {
			s.fail[i] = kmpFailure(stop)
		}
	}
	held := len(s.pending)
	at, atLen := -1, 0 // where the first stop found starts, in pending+text, and its length
	hold := 0
	for i, stop := range s.stops {
		f, st := s.fail[i], s.state[i]
		for j := 0; j < len(text); j++ {
			c := text[j]
			for st > 0 && stop[st] != c {
				st = int(f[st-1])
			}
			if stop[st] == c {
				st++
			}
			if st == len(stop) {
				if !armed {
					st = int(f[st-1]) // not a stop yet: look for the next one
					continue
				}
				if start := held + j + 1 - len(stop); at < 0 || start < at {
					at, atLen = start, len(stop)
				}
				break // this stop's first occurrence: later ones start later
			}
		}
		s.state[i] = st
		hold = max(hold, st)
	}
	if at >= 0 {
		all := s.pending + text
		s.pending, s.hit = "", true
		if s.include {
			return all[:at+atLen], true
		}
		return all[:at], true
	}
	// Hold back the longest suffix that may start a stop string.
	if hold >= len(text) {
		out := s.pending[:held+len(text)-hold]
		s.pending = s.pending[held+len(text)-hold:] + text
		return out, false
	}
	out := s.pending + text[:len(text)-hold]
	s.pending = text[len(text)-hold:]
	return out, false
}

// kmpFailure is the failure function of p: f[i] is the length of the
// longest proper prefix of p[:i+1] that is also its suffix.
func kmpFailure(p string) []int32 {
	f := make([]int32, len(p))
	k := 0
	for i := 1; i < len(p); i++ {
		for k > 0 && p[k] != p[i] {
			k = int(f[k-1])
		}
		if p[k] == p[i] {
			k++
		}
		f[i] = int32(k)
	}
	return f
}

// flush returns the text held back, at the end of the choice.
func (s *stopper) flush() string {
	out := s.pending
	s.pending = ""
	return out
}
