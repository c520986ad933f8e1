package frontend

// The text of a model: how its prompts become token ids and its output
// becomes text again. A model whose workers name a model directory in the
// Hugging Face layout ("model_path" in their instance metadata) speaks its
// own language (go/hfmodel: its tokenizer and chat template), read from that
// directory, or from a worker that serves it when this frontend cannot read
// it (modelfiles.go); a model
// without one gets the stand-in, one token per prompt byte and a fixed word
// per output token, for tests and demos that need no tokenizer.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokenizer"
)

// text is a model's language.
type text interface {
	// chat renders a conversation as the prompt text.
	chat(messages []hfmodel.Message, o hfmodel.ChatOptions) (string, error)
	// encode tokenizes a prompt text, adding the tokenizer's special tokens
	// (its BOS) or not.
	encode(s string, addSpecial bool) ([]int, error)
	// detokenize is the text of ids, special tokens included (/detokenize).
	detokenize(ids []int) string
	// tokenStrings are the vocabulary's strings of ids (/tokenize).
	tokenStrings(ids []int) []string
	// maxPromptBytes is the longest text that may still fit in limit
	// tokens: a longer one is refused before it is tokenized (0: no bound
	// but the body's).
	maxPromptBytes(limit int) int
	// decoder detokenizes one choice's output incrementally.
	decoder(prompt []int) decoder
}

// decoder turns one choice's output tokens into text as they arrive.
type decoder interface {
	// next returns the text the tokens complete (never part of a UTF-8
	// character).
	next(ids []int) string
}

// ---------------------------------------------------------------- stand-in

// standIn is the language of a model without a model directory.
type standIn struct{}

// chat: "<role>: <content>\n" each; an open final message has no line
// break; template variables mean nothing to it.
func (standIn) chat(messages []hfmodel.Message, o hfmodel.ChatOptions) (string, error) {
	if err := o.Check(); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range messages {
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	s := b.String()
	if o.ContinueFinalMessage {
		s = strings.TrimSuffix(s, "\n")
	}
	return s, nil
}

// detokenize: the stand-in's output text of ids (a word each).
func (standIn) detokenize(ids []int) string { return standInDecoder{}.next(ids) }

// tokenStrings: each id's word.
func (standIn) tokenStrings(ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = strings.TrimPrefix(standInDecoder{}.next([]int{id}), " ")
	}
	return out
}

// encode: one token per byte.
func (standIn) encode(s string, _ bool) ([]int, error) {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out, nil
}

func (standIn) maxPromptBytes(limit int) int { return limit }

func (standIn) decoder([]int) decoder { return standInDecoder{} }

type standInDecoder struct{}

var words = strings.Fields("the of and to in is was for on that with as by at from it an be this are which or")

// next: a fixed word per token id.
func (standInDecoder) next(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteByte(' ')
		b.WriteString(words[((id%len(words))+len(words))%len(words)])
	}
	return b.String()
}

// ---------------------------------------------------------------- a model's own

// modelText is the language of a model loaded from its directory.
type modelText struct{ m *hfmodel.Model }

func (t modelText) chat(messages []hfmodel.Message, o hfmodel.ChatOptions) (string, error) {
	return t.m.RenderChatWith(messages, o)
}

func (t modelText) encode(s string, addSpecial bool) ([]int, error) {
	return t.m.Tokenizer().Encode(s, addSpecial)
}

func (t modelText) detokenize(ids []int) string { return t.m.Detokenize(ids) }

func (t modelText) tokenStrings(ids []int) []string { return t.m.TokenStrings(ids) }

func (modelText) maxPromptBytes(int) int { return 0 }

func (t modelText) decoder(prompt []int) decoder {
	// Special tokens (EOS, the template's markers) are not text, as in
	// vLLM's default (skip_special_tokens).
	return streamDecoder{t.m.Tokenizer().NewStreamDecoder(true, prompt)}
}

type streamDecoder struct{ d *tokenizer.StreamDecoder }

func (s streamDecoder) next(ids []int) string { return s.d.Next(ids...) }

// ---------------------------------------------------------------- loading

// texts loads model directories once each and keeps them.
type texts struct {
	mu    sync.Mutex
	byDir map[string]*loading
}

// loading is one directory's load: done is closed when m or err is set. A
// failed load is tried again after textRetry.
type loading struct {
	done chan struct{}
	m    *hfmodel.Model
	err  error
	at   time.Time
}

// textRetry is how long a failed load is remembered before it is tried again.
const textRetry = 10 * time.Second

// get returns the model at dir, loading it on first use (concurrent callers
// wait for the one load) with load.
func (ts *texts) get(dir string, load func(string) (*hfmodel.Model, error)) (*hfmodel.Model, error) {
	ts.mu.Lock()
	if ts.byDir == nil {
		ts.byDir = map[string]*loading{}
	}
	l := ts.byDir[dir]
	if l != nil {
		select {
		case <-l.done:
			if l.err != nil && time.Since(l.at) > textRetry {
				l = nil // try again
			}
		default:
		}
	}
	if l == nil {
		l = &loading{done: make(chan struct{})}
		ts.byDir[dir] = l
		ts.mu.Unlock()
		l.m, l.err = load(dir)
		l.at = time.Now()
		close(l.done)
		return l.m, l.err
	}
	ts.mu.Unlock()
	<-l.done
	return l.m, l.err
}

// load reads a model directory here, or, when this frontend cannot (it
// runs on another machine), from a worker that serves it (modelfiles.go).
func (f *Frontend) load(dir string) (*hfmodel.Model, error) {
	m, err := hfmodel.Load(dir)
	if err == nil {
		return m, nil
	}
	m, ferr := f.fetchModel(dir)
	if ferr == nil {
		return m, nil
	}
	return nil, fmt.Errorf("%w; nor from a worker: %w", err, ferr)
}

// textOf is the language of the model whose instances' metadata are metas:
// the model directory they name (the first that loads, in their order), or
// the stand-in when none names one. An error says why no directory loaded.
func (f *Frontend) textOf(model string, metas []instanceMeta) (text, error) {
	var errs []error
	tried := map[string]bool{}
	for _, m := range metas {
		if m.ModelPath == "" || tried[m.ModelPath] {
			continue
		}
		tried[m.ModelPath] = true
		hm, err := f.texts.get(m.ModelPath, f.load)
		if err == nil {
			return modelText{hm}, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return standIn{}, nil
	}
	return nil, fmt.Errorf("the frontend could not load the tokenizer of model %q from the directory its workers name: %w",
		model, errors.Join(errs...))
}

// ---------------------------------------------------------------- messages

// chatMessages reads the request's messages: a role without control
// characters (one could forge lines of the rendered conversation) and a
// content that is a string or a list of parts whose text parts are joined
// (with a line break between them for a model's own template, as vLLM
// does; nothing between them for the stand-in, as before).
func chatMessages(messages []chatMessage, sep string) ([]hfmodel.Message, error) {
	if len(messages) == 0 {
		return nil, errors.New("messages must not be empty")
	}
	out := make([]hfmodel.Message, len(messages))
	for i, m := range messages {
		if strings.IndexFunc(m.Role, unicode.IsControl) >= 0 {
			return nil, errors.New("a message's role must not contain control characters")
		}
		out[i].Role = m.Role
		if jsonscan.IsNull(m.Content) {
			continue
		}
		var s string
		if err := json.Unmarshal(m.Content, &s); err == nil {
			out[i].Content = s
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return nil, errors.New("message content must be a string or a list of parts")
		}
		var b strings.Builder // one buffer: adding parts to a string copies it once per part
		n := 0
		for _, p := range parts {
			if p.Type != "" && p.Type != "text" {
				return nil, fmt.Errorf("content parts of type %q are not supported: the engine interface carries text", p.Type)
			}
			if n > 0 {
				b.WriteString(sep)
			}
			b.WriteString(p.Text)
			n++
		}
		out[i].Content = b.String()
	}
	return out, nil
}
