package frontend

// The text of a model: how its prompts become token ids and its output
// becomes text again. A model whose workers name a model directory in the
// Hugging Face layout (model_path in their model card, go/modelcard) speaks
// its own language (go/hfmodel: its tokenizer and chat template), read from
// that directory, or from a worker that serves it when this frontend cannot
// read it (modelfiles.go); a model without one gets the stand-in, one token
// per prompt byte and a fixed word per output token, for tests and demos
// that need no tokenizer.
//
// A text is known by its content, not its path: the card's text_checksum
// (the checksum of the directory's text files as the worker read them) keys
// the loaded texts, and a directory is used only if the files this frontend
// reads (here, or from a worker) have that checksum. A request is tokenized
// with the text of one group of the model's instances and goes only to the
// instances of that group (route, models.go), so a directory updated in
// place, or different files at one path on different machines, never make a
// worker receive tokens of another text than its own.

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
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
	// decoder detokenizes one choice's output incrementally; skipSpecial:
	// special tokens are not text.
	decoder(prompt []int, skipSpecial bool) decoder
	// vocabSize is the number of token ids (0: any id).
	vocabSize() int
	// tokenText is one output token's text alone (logprobs.go).
	tokenText(id int) string
	// tokenID looks a token up in the vocabulary, added tokens included
	// (the output parsers' markers: chatparse.go).
	tokenID(token string) (int, bool)
	// specialTokens are the tokenizer's special tokens as transformers
	// lists them (all_special_tokens).
	specialTokens() []string
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

// tokenStrings: each id's word (tokenText).
func (t standIn) tokenStrings(ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = t.tokenText(id)
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

func (standIn) decoder([]int, bool) decoder { return standInDecoder{} }

func (standIn) vocabSize() int { return 0 }

// tokenText: the id's word.
// tokenID: the stand-in's vocabulary has no marker tokens.
func (standIn) tokenID(string) (int, bool) { return 0, false }

func (standIn) specialTokens() []string { return nil }

func (standIn) tokenText(id int) string {
	return strings.TrimPrefix(standInDecoder{}.next([]int{id}), " ")
}

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

func (t modelText) vocabSize() int { return t.m.Tokenizer().VocabSize() }

func (t modelText) tokenText(id int) string { return t.m.TokenText(id) }

func (t modelText) tokenID(token string) (int, bool) { return t.m.Tokenizer().TokenToID(token) }

func (t modelText) specialTokens() []string { return t.m.SpecialTokens() }

func (t modelText) decoder(prompt []int, skipSpecial bool) decoder {
	// By default special tokens (EOS, the template's markers) are not text,
	// as in vLLM's default (skip_special_tokens).
	return streamDecoder{t.m.Tokenizer().NewStreamDecoder(skipSpecial, prompt)}
}

type streamDecoder struct{ d *tokenizer.StreamDecoder }

func (s streamDecoder) next(ids []int) string { return s.d.Next(ids...) }

// ---------------------------------------------------------------- loading

// textID names the text an instance's card gives it: the checksum of its
// model directory's text files (go/modelcard), so that equal files are one
// text wherever they are and changed files are another at the same path; for
// a card that names a directory without a checksum (one go/modelcard did not
// build), "path:" and the path, the directory as this frontend finds it; ""
// for the stand-in (no directory).
func textID(c modelcard.Card) string {
	switch {
	case c.ModelPath == "":
		return ""
	case c.TextChecksum != "":
		return c.TextChecksum
	default:
		return "path:" + c.ModelPath
	}
}

// texts loads the models' texts once each, by text id, and keeps the ones
// that instances still name.
type texts struct {
	mu   sync.Mutex
	byID map[string]*loading
}

// loading is one text's load: done is closed when m or err is set. A
// failed load is tried again after textRetry.
type loading struct {
	done chan struct{}
	m    *hfmodel.Model
	err  error
	at   time.Time
}

// textRetry is how long a failed load is remembered before it is tried again.
const textRetry = 10 * time.Second

// get returns the model of text id, loading it on first use (concurrent
// callers wait for the one load) with load. Starting a load first drops the
// texts loaded before that no instance names any more (inUse: the ids the
// instances name), so what is kept is bounded by the texts in use: a new
// revision of a model's files replaces the old one once its last instance
// is gone.
func (ts *texts) get(id string, load func() (*hfmodel.Model, error), inUse func() map[string]bool) (*hfmodel.Model, error) {
	ts.mu.Lock()
	if ts.byID == nil {
		ts.byID = map[string]*loading{}
	}
	l := ts.byID[id]
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
		ts.evictLocked(inUse())
		l = &loading{done: make(chan struct{})}
		ts.byID[id] = l
		ts.mu.Unlock()
		l.m, l.err = load()
		l.at = time.Now()
		close(l.done)
		return l.m, l.err
	}
	ts.mu.Unlock()
	<-l.done
	return l.m, l.err
}

// evictLocked drops the finished loads whose text no instance names.
func (ts *texts) evictLocked(inUse map[string]bool) {
	for id, l := range ts.byID {
		select {
		case <-l.done:
			if !inUse[id] {
				delete(ts.byID, id)
			}
		default: // callers wait for it
		}
	}
}

// loaded is how many texts are kept (tests).
func (ts *texts) loaded() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byID)
}

// textGroup is the instances of one model that speak one text.
type textGroup struct {
	id    string
	cards []modelcard.Card
}

// textGroups are model's instances grouped by text (textID): first the
// group of the instance whose turn it is (the instances take turns, so each
// group gets its share of requests by its number of instances), then the
// others in order of their first instance; nil when no instance serves
// model. The groups are shared (modelindex.go): read only.
func (f *Frontend) textGroups(model string) []textGroup {
	e := f.index().models[model]
	if e == nil {
		return nil
	}
	if len(e.groups) == 1 {
		return e.groups
	}
	first := e.groupOf[int(f.turn.Add(1)%uint64(len(e.cards)))]
	out := make([]textGroup, 0, len(e.groups))
	out = append(out, e.groups[first])
	out = append(out, e.groups[:first]...)
	return append(out, e.groups[first+1:]...)
}

// textFor is the language of a request for model and the group of
// instances that speak it (textGroups, textOf). A model no instance serves
// is answered 404, one whose text does not load 503, and ok is false.
func (f *Frontend) textFor(w http.ResponseWriter, model string) (tx text, g textGroup, ok bool) {
	groups := f.textGroups(model)
	if len(groups) == 0 {
		modelNotFound(w, model)
		return nil, textGroup{}, false
	}
	tx, g, err := f.textOf(model, groups)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), "service_unavailable", "", "model_unavailable")
		return nil, textGroup{}, false
	}
	return tx, g, true
}

// textOf is the language of a request for a model whose instances are
// groups (textGroups), and the group that speaks it: the first whose text
// loads, so that every instance a request may go to has the files it was
// tokenized with. The stand-in is the text of instances that name no
// directory. An error says why no text loaded.
func (f *Frontend) textOf(model string, groups []textGroup) (text, textGroup, error) {
	var errs []string
	for _, g := range groups {
		if g.id == "" {
			return standIn{}, g, nil
		}
		m, err := f.texts.get(g.id, func() (*hfmodel.Model, error) { return f.loadText(g) }, f.textsInUse)
		if err == nil {
			return modelText{m}, g, nil
		}
		errs = append(errs, err.Error())
	}
	return nil, textGroup{}, fmt.Errorf("the frontend could not load the tokenizer of model %q from the directory its workers name: %s",
		model, strings.Join(errs, "; "))
}

// textsInUse are the text ids the instances name (shared: read only).
func (f *Frontend) textsInUse() map[string]bool { return f.index().texts }

// loadText loads the text of a group: its directory as this frontend reads
// it (each path the group's cards name, in turn), if its files are the
// workers' (their checksum); else from a worker that serves the same files
// (modelfiles.go), when this frontend cannot read the directory (it runs on
// another machine) or holds other files there (another revision).
func (f *Frontend) loadText(g textGroup) (*hfmodel.Model, error) {
	sum := g.cards[0].TextChecksum // the group's: its id ("" for a path id)
	var errs []string
	tried := map[string]bool{}
	for _, c := range g.cards {
		if tried[c.ModelPath] {
			continue
		}
		tried[c.ModelPath] = true
		m, err := loadHere(c.ModelPath, sum)
		if err == nil {
			return m, nil
		}
		errs = append(errs, err.Error())
	}
	m, err := f.fetchModel(g.id, g.cards[0].ModelPath, sum)
	if err == nil {
		return m, nil
	}
	return nil, fmt.Errorf("%s; nor from a worker: %w", strings.Join(errs, "; "), err)
}

// loadHere reads the model directory at dir on this machine, if its text
// files have the checksum sum ("": any).
func loadHere(dir, sum string) (*hfmodel.Model, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("model directory %q: %w", dir, err)
	}
	files, err := hfmodel.ReadDir(abs)
	if err != nil {
		return nil, err
	}
	if got := modelcard.Checksum(files); sum != "" && got != sum {
		slog.Info("the model directory here holds other text files than its workers': reading theirs from a worker",
			"model_path", abs, "checksum_here", got, "checksum", sum)
		return nil, fmt.Errorf("%s here holds other text files (checksum %s) than its workers' (%s)", abs, got, sum)
	}
	return hfmodel.FromFiles(abs, files)
}

// ---------------------------------------------------------------- messages

// chatMessages reads the request's messages: a role without control
// characters (one could forge lines of the rendered conversation) and a
// content that is a string or a list of parts whose text parts are joined
// (with a line break between them for a model's own template, as vLLM
// does; nothing between them for the stand-in, as before); null content
// is "", as vLLM gives it to the template. Then the keys vLLM keeps for
// the template: an assistant's tool_calls (toolCalls) and reasoning, a
// tool message's tool_call_id, any message's name.
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
		content, err := messageContent(m.Content, sep)
		if err != nil {
			return nil, err
		}
		out[i].Content = content
		out[i].Name = m.Name
		switch m.Role {
		case "assistant":
			if out[i].ToolCalls, err = toolCalls(m.ToolCalls); err != nil {
				return nil, fmt.Errorf("messages[%d].%w", i, err)
			}
			out[i].Reasoning = m.Reasoning
		case "tool":
			out[i].ToolCallID = m.ToolCallID
		}
	}
	return out, nil
}

// messageContent is a message's text: a string, or its text parts joined
// with sep; "" for null.
func messageContent(raw json.RawMessage, sep string) (string, error) {
	if jsonscan.IsNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("message content must be a string or a list of parts")
	}
	var b strings.Builder // one buffer: adding parts to a string copies it once per part
	for n, p := range parts {
		if p.Type != "" && p.Type != "text" {
			return "", fmt.Errorf("content parts of type %q are not supported: the engine interface carries text", p.Type)
		}
		if n > 0 {
			b.WriteString(sep)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}
