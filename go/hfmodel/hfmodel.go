// Package hfmodel reads the text side of a model directory in the Hugging
// Face layout: its tokenizer (tokenizer.json), its chat template and the
// special tokens the template sees (tokenizer_config.json, or a separate
// chat_template.jinja / chat_template.json), so that the frontend speaks the
// model's own language.
//
// Guarantees:
//
//   - Bounded: each file is read only up to its bound (MaxTokenizerBytes,
//     MaxConfigBytes); a larger one is an error naming it, as is a file that
//     is not what the layout says. Nothing outside the directory is read.
//   - Faithful: prompts are tokenized by go/tokenizer, token-exact with the
//     Hugging Face tokenizers library (without the file's truncation and
//     padding, as transformers encodes by default); chat is rendered by the model's Jinja
//     template with the variables Hugging Face's apply_chat_template gives it
//     (messages, tools, add_generation_prompt, the special tokens, and
//     raise_exception / strftime_now; tools.go, pyjson.go), and tokenized without adding special
//     tokens (the template writes them), as vLLM's server does.
//   - Safe to share: a Model is immutable once loaded; every method may be
//     called from many goroutines. A template that panics while rendering is
//     an error, never a crash.
package hfmodel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/ardanlabs/jinja"

	"github.com/dynamo-ctx/dynamo-ctx/go/tokenizer"
)

// Bounds on the files read.
const (
	// MaxTokenizerBytes bounds tokenizer.json (the largest in common use
	// are a few tens of MB).
	MaxTokenizerBytes = 256 << 20
	// MaxConfigBytes bounds tokenizer_config.json and the chat template
	// files.
	MaxConfigBytes = 16 << 20
)

// The files of the layout that are read.
const (
	TokenizerFile       = "tokenizer.json"
	TokenizerConfigFile = "tokenizer_config.json"
	ChatTemplateJinja   = "chat_template.jinja"
	ChatTemplateJSON    = "chat_template.json"
)

// Model is the text side of a loaded model directory.
type Model struct {
	dir  string
	tok  *tokenizer.Tokenizer
	chat *jinja.Template // nil: the model has no chat template
	// vars are the template's variables besides messages: the special
	// tokens by their tokenizer_config.json names.
	vars map[string]any
	// cleanUp: Detokenize applies transformers' clean-up of tokenization
	// spaces (tokenizer_config.json's clean_up_tokenization_spaces, which
	// transformers honours for every model but BPE).
	cleanUp bool
	// special are transformers' all_special_tokens: the named special
	// tokens, then additional_special_tokens, each once.
	special []string
}

// TextFiles are the files of a model directory that make its text, in the
// order they are looked for: tokenizer.json is required, the others
// optional.
var TextFiles = []string{TokenizerFile, TokenizerConfigFile, ChatTemplateJinja, ChatTemplateJSON}

// Limit is the most bytes of the text file name that are read.
func Limit(name string) int64 {
	if name == TokenizerFile {
		return MaxTokenizerBytes
	}
	return MaxConfigBytes
}

// Files are the contents of a model directory's text files by name (a
// subset of TextFiles).
type Files map[string][]byte

// ReadDir reads the text files of dir (each within its Limit); an optional
// file that does not exist is left out.
func ReadDir(dir string) (Files, error) {
	files := Files{}
	for _, name := range TextFiles {
		b, err := readFile(dir, name, Limit(name))
		switch {
		case err == nil:
			files[name] = b
		case errors.Is(err, os.ErrNotExist) && name != TokenizerFile:
		default:
			return nil, err
		}
	}
	return files, nil
}

// Load reads dir. It needs tokenizer.json; tokenizer_config.json and a chat
// template are optional (without a template, RenderChat is an error).
func Load(dir string) (*Model, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("model directory %q: %w", dir, err)
	}
	files, err := ReadDir(abs)
	if err != nil {
		return nil, err
	}
	return FromFiles(abs, files)
}

// FromFiles makes the model of a directory's text files, read elsewhere (a
// worker's, over the request plane); origin names them in errors.
func FromFiles(origin string, files Files) (*Model, error) {
	where := func(name string) string { return origin + "/" + name }
	raw, ok := files[TokenizerFile]
	if !ok {
		return nil, fmt.Errorf("%s: %w", where(TokenizerFile), os.ErrNotExist)
	}
	for name, b := range files {
		if int64(len(b)) > Limit(name) {
			return nil, fmt.Errorf("%s has more than the %d bytes read", where(name), Limit(name))
		}
	}
	tok, err := tokenizer.FromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where(TokenizerFile), err)
	}
	// As transformers (and vLLM's server) encode: a prompt is never cut
	// short or padded by the file's settings; the context length decides.
	tok = tok.WithoutTruncationAndPadding()
	m := &Model{dir: origin, tok: tok, vars: map[string]any{}}
	var cfg struct {
		ChatTemplate json.RawMessage   `json:"chat_template"`
		BOS          json.RawMessage   `json:"bos_token"`
		EOS          json.RawMessage   `json:"eos_token"`
		UNK          json.RawMessage   `json:"unk_token"`
		PAD          json.RawMessage   `json:"pad_token"`
		Additional   []json.RawMessage `json:"additional_special_tokens"`
		CleanUp      bool              `json:"clean_up_tokenization_spaces"`
		CleanUpBPE   bool              `json:"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"`
	}
	if b, ok := files[TokenizerConfigFile]; ok {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%s: %w", where(TokenizerConfigFile), err)
		}
	}
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		if s, ok := tokenText(raw); ok {
			m.vars[name] = s
		}
	}
	for _, raw := range append([]json.RawMessage{cfg.BOS, cfg.EOS, cfg.UNK, cfg.PAD}, cfg.Additional...) {
		if s, ok := tokenText(raw); ok && !slices.Contains(m.special, s) {
			m.special = append(m.special, s)
		}
	}
	m.cleanUp = cfg.CleanUp && (cfg.CleanUpBPE || tok.ModelType() != "BPE")
	src, err := chatTemplate(files, where, cfg.ChatTemplate)
	if err != nil {
		return nil, err
	}
	if src != "" {
		if m.chat, err = compile(useOwnTojson(src)); err != nil {
			return nil, fmt.Errorf("%s: the chat template does not compile: %w", origin, err)
		}
	}
	return m, nil
}

// SpecialTokens are the tokenizer's special tokens as transformers lists
// them (all_special_tokens): tokenizer_config.json's bos, eos, unk and pad
// tokens and its additional_special_tokens.
func (m *Model) SpecialTokens() []string { return m.special }

// Dir is where the model's files came from: its directory (absolute), or
// FromFiles's origin.
func (m *Model) Dir() string { return m.dir }

// Tokenizer is the model's tokenizer.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// HasChatTemplate reports whether the model has a chat template.
func (m *Model) HasChatTemplate() bool { return m.chat != nil }

// RenderChat renders messages with the model's chat template, ending with
// the prompt of the assistant's reply (add_generation_prompt); RenderChatWith
// (chat.go) takes the other options of a request.
func (m *Model) RenderChat(messages []Message) (string, error) {
	return m.RenderChatWith(messages, ChatOptions{AddGenerationPrompt: true})
}

// compile compiles a template, turning a panic of the template engine into
// an error.
func compile(src string) (t *jinja.Template, err error) {
	defer func() {
		if p := recover(); p != nil {
			t, err = nil, fmt.Errorf("%v", p)
		}
	}()
	return jinja.Compile(src)
}

// chatTemplate is the model's chat template source: tokenizer_config.json's
// chat_template (a string, or a list of named templates of which "default"
// is taken), else chat_template.jinja, else chat_template.json's
// "chat_template"; "" when there is none.
func chatTemplate(files Files, where func(string) string, fromConfig json.RawMessage) (string, error) {
	if s, err := templateValue(fromConfig); err != nil || s != "" {
		if err != nil {
			return "", fmt.Errorf("%s: chat_template: %w", where(TokenizerConfigFile), err)
		}
		return s, nil
	}
	if b, ok := files[ChatTemplateJinja]; ok {
		return string(b), nil
	}
	b, ok := files[ChatTemplateJSON]
	if !ok {
		return "", nil
	}
	var v struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return "", fmt.Errorf("%s: %w", where(ChatTemplateJSON), err)
	}
	s, err := templateValue(v.ChatTemplate)
	if err != nil {
		return "", fmt.Errorf("%s: chat_template: %w", where(ChatTemplateJSON), err)
	}
	return s, nil
}

// templateValue reads a chat_template value: a string, or a list of
// {"name", "template"} of which "default" is taken.
func templateValue(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", errors.New("want a string or a list of {name, template}")
	}
	for _, t := range named {
		if t.Name == "default" {
			return t.Template, nil
		}
	}
	return "", errors.New(`a list of templates without one named "default"`)
}

// tokenText reads a special token of tokenizer_config.json: a string, or
// an added-token object with "content".
func tokenText(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// readFile reads dir/name, at most limit bytes (an error past that).
func readFile(dir, name string, limit int64) ([]byte, error) {
	path := filepath.Join(dir, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("%s has %d bytes, more than the %d read", path, st.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s has more than the %d bytes read", path, limit)
	}
	return b, nil
}
