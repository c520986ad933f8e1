package hfmodel

// What a request may ask of the chat template and of detokenization beyond
// the defaults, with the meaning Hugging Face's transformers gives each
// (apply_chat_template's add_generation_prompt, continue_final_message and
// extra template variables; decode without skipping special tokens, with
// clean_up_tokenization_spaces), as vLLM's server passes them on.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// ChatOptions are a request's options for the chat template.
type ChatOptions struct {
	// AddGenerationPrompt ends the rendering with the prompt of the
	// assistant's reply.
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the final message open: the rendering
	// ends where its content ends (no end-of-turn marker), for the model to
	// continue it. It excludes AddGenerationPrompt.
	ContinueFinalMessage bool
	// Tools are the request's tools: nil gives the template tools = None,
	// as a request without tools does.
	Tools []Tool
	// Vars are more variables for the template (a request's
	// chat_template_kwargs, e.g. enable_thinking); they may replace the
	// special tokens' variables, not the ones the options above set.
	Vars map[string]any
}

// reservedVars are variables a request may not set: those the rendering
// sets itself, and transformers' own arguments that are not variables.
var reservedVars = map[string]bool{
	"messages": true, "add_generation_prompt": true, "continue_final_message": true,
	"tools": true, "documents": true, "chat_template": true, "tokenize": true,
}

// continueMark is appended to the final message's content to find where
// that content ends in the rendering (transformers does the same).
const continueMark = "CONTINUE_FINAL_MESSAGE_MARK "

// ErrChatOptions is wrapped by RenderChatWith's errors about the options
// (a request's mistake, not the template's).
var ErrChatOptions = errors.New("invalid chat options")

// Check reports options that contradict each other or set a variable the
// rendering sets itself, wrapping ErrChatOptions.
func (o ChatOptions) Check() error {
	if o.ContinueFinalMessage && o.AddGenerationPrompt {
		return fmt.Errorf("%w: continue_final_message and add_generation_prompt cannot both be true", ErrChatOptions)
	}
	for k := range o.Vars {
		if reservedVars[k] {
			return fmt.Errorf("%w: chat_template_kwargs may not set %q", ErrChatOptions, k)
		}
	}
	return nil
}

// RenderChatWith renders messages with the model's chat template and the
// options o.
func (m *Model) RenderChatWith(messages []Message, o ChatOptions) (out string, err error) {
	if m.chat == nil {
		return "", fmt.Errorf("model %s has no chat template (tokenizer_config.json chat_template, or %s)", m.dir, ChatTemplateJinja)
	}
	if err := o.Check(); err != nil {
		return "", err
	}
	if o.ContinueFinalMessage && len(messages) == 0 {
		return "", fmt.Errorf("%w: continue_final_message needs a final message", ErrChatOptions)
	}
	data, err := m.templateData(messages, o)
	if err != nil {
		return "", err
	}
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("the chat template failed: %v", p)
		}
	}()
	out, err = m.chat.RenderValues(data)
	if err != nil || !o.ContinueFinalMessage {
		return out, err
	}
	return openFinalMessage(out, messages[len(messages)-1].Content)
}

// templateData are the template's variables: the special tokens, the
// request's variables, and what apply_chat_template sets (messages, tools,
// documents, add_generation_prompt), with the tojson filter of pyjson.go.
func (m *Model) templateData(messages []Message, o ChatOptions) (map[string]jinja.Value, error) {
	suffix := ""
	if o.ContinueFinalMessage {
		suffix = continueMark
	}
	msgs, err := messagesValue(messages, suffix)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChatOptions, err)
	}
	tools, err := toolsValue(o.Tools)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrChatOptions, err)
	}
	data := make(map[string]jinja.Value, len(m.vars)+len(o.Vars)+5)
	for k, v := range m.vars {
		data[k] = jinja.FromGoValue(v)
	}
	for k, v := range o.Vars {
		data[k] = goValue(v)
	}
	data["messages"] = msgs
	data["tools"] = tools
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(o.AddGenerationPrompt)
	data[pyTojsonName] = pyTojson
	return data, nil
}

// openFinalMessage cuts a rendering made with continueMark after the final
// message's content where that content ends. A template that keeps the
// mark's trailing space kept the content's own spacing; one that trimmed it
// trimmed the content's trailing spaces too, so they are trimmed here.
func openFinalMessage(rendered, final string) (string, error) {
	mark := strings.TrimSpace(continueMark)
	at := strings.LastIndex(rendered, mark)
	if at < 0 || !strings.Contains(rendered, strings.TrimSpace(final)) {
		return "", fmt.Errorf("%w: continue_final_message is set but the template does not render the final message's content", ErrChatOptions)
	}
	if strings.HasPrefix(rendered[at:], continueMark) {
		return rendered[:at], nil
	}
	return strings.TrimRight(rendered[:at], " \t\n\r\v\f"), nil
}

// Detokenize is the text of ids as transformers' decode gives it by
// default: special tokens included, tokenization spaces cleaned up where
// the model's tokenizer_config.json asks for it.
func (m *Model) Detokenize(ids []int) string {
	s := m.tok.Decode(ids, false)
	if m.cleanUp {
		s = cleanUpSpaces(s)
	}
	return s
}

// cleanUpSpaces is transformers' clean_up_tokenization: the spaces a
// word-piece tokenizer's decoding leaves before punctuation and English
// contractions are removed, one replacement after the other over the whole
// text (a later one sees what an earlier one made).
func cleanUpSpaces(s string) string {
	for _, r := range [][2]string{
		{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
		{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// TokenStrings are the vocabulary's strings of ids (transformers'
// convert_ids_to_tokens); an id outside the vocabulary gives "".
func (m *Model) TokenStrings(ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i], _ = m.tok.IDToToken(id)
	}
	return out
}

// TokenText is one output token's text as vLLM's server writes it in
// logprobs: the token decoded alone (special tokens kept, as Detokenize),
// with the leading spaces a Metaspace tokenizer's marker stands for that
// decoding alone strips put back.
func (m *Model) TokenText(id int) string {
	s := m.Detokenize([]int{id})
	marker := m.tok.SpaceMarker()
	if marker == "" {
		return s
	}
	raw, _ := m.tok.IDToToken(id)
	markers := 0
	for strings.HasPrefix(raw, marker) {
		raw = raw[len(marker):]
		markers++
	}
	if missing := markers - (len(s) - len(strings.TrimLeft(s, " "))); missing > 0 {
		s = strings.Repeat(" ", missing) + s
	}
	return s
}
