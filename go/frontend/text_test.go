package frontend_test

// The model's own text: a worker that names a model directory
// (testdata/model, a Llama-3-style tokenizer and chat template; see its
// README) makes the frontend tokenize prompts, render chat and detokenize
// output as Hugging Face's libraries do (testdata/model/expect.json holds
// their answers).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

type expectations struct {
	Completions []struct {
		Prompt string `json:"prompt"`
		IDs    []int  `json:"ids"`
	} `json:"completions"`
	Chat []struct {
		Messages []map[string]string `json:"messages"`
		IDs      []int               `json:"ids"`
	} `json:"chat"`
	OutputIDs  []int  `json:"output_ids"`
	OutputText string `json:"output_text"`
}

func modelDir(t *testing.T) (string, expectations) {
	t.Helper()
	dir, err := filepath.Abs("testdata/model")
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "expect.json"))
	require.NoError(t, err)
	var x expectations
	require.NoError(t, json.Unmarshal(b, &x))
	return dir, x
}

// speaker answers every request with the ids, one per item, the last with
// finish_reason "length", and reports each request's prompt ids.
func speaker(ids []int, prompts chan<- []int) planetest.Handler {
	return func(w *planetest.Worker, req *plane.Request) {
		prompts <- parse(req).TokenIDs
		for i, id := range ids {
			item := map[string]any{"token_ids": []int{id}}
			if i == len(ids)-1 {
				item["finish_reason"] = "length"
			}
			b, _ := json.Marshal(item)
			if req.Send(b) != nil {
				return
			}
		}
		req.Complete()
	}
}

// llamaCard is the card of a worker of model "llama" whose model directory
// is at path and holds the text files of dir (read here), as go/modelcard
// builds it on the worker's machine.
func llamaCard(t *testing.T, path, dir string) modelcard.Card {
	t.Helper()
	files, err := hfmodel.ReadDir(dir)
	require.NoError(t, err)
	return modelcard.Card{Model: "llama", Mode: modelcard.Agg, MaxModelLen: 512, ModelPath: path, TextChecksum: modelcard.Checksum(files)}
}

// modelEnv runs a frontend and a speaker worker of the model directory dir.
func modelEnv(t *testing.T, dir string, ids []int) (*env, chan []int) {
	return cardEnv(t, llamaCard(t, dir, dir), ids)
}

// cardEnv runs a frontend and a speaker worker with the given card.
func cardEnv(t *testing.T, card modelcard.Card, ids []int) (*env, chan []int) {
	e := newEnv(t)
	prompts := make(chan []int, 16)
	e.workerMeta("w", "dynamo", card, speaker(ids, prompts))
	e.start()
	return e, prompts
}

func TestModelTextPromptsAndOutput(t *testing.T) {
	dir, x := modelDir(t)
	e, prompts := modelEnv(t, dir, x.OutputIDs)

	for _, c := range x.Completions {
		body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": c.Prompt, "max_tokens": len(x.OutputIDs)})
		r := e.post("/v1/completions", string(body), nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, c.IDs, received(t, prompts), "the prompt %q as Hugging Face tokenizes it (BOS added)", c.Prompt)
		m := r.json(t)
		assert.Equal(t, x.OutputText, choice(t, m)["text"])
		usage := m["usage"].(map[string]any)
		assert.EqualValues(t, len(c.IDs), usage["prompt_tokens"])
		assert.EqualValues(t, len(x.OutputIDs), usage["completion_tokens"])
	}
	for _, c := range x.Chat {
		body, _ := json.Marshal(map[string]any{"model": "llama", "messages": c.Messages, "max_tokens": len(x.OutputIDs)})
		r := e.post("/v1/chat/completions", string(body), nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		assert.Equal(t, c.IDs, received(t, prompts), "the chat rendered by the model's template, tokenized without added tokens")
		msg := choice(t, r.json(t))["message"].(map[string]any)
		assert.Equal(t, x.OutputText, msg["content"])
	}
}

// Streamed, every chunk is whole characters: é and 😀 are split across
// tokens, and no chunk carries half of one.
func TestModelTextStreamsWholeCharacters(t *testing.T) {
	dir, x := modelDir(t)
	e, prompts := modelEnv(t, dir, x.OutputIDs)
	for _, chat := range []bool{false, true} {
		path, body := "/v1/completions", fmt.Sprintf(`{"model":"llama","prompt":"Hi","max_tokens":%d,"stream":true}`, len(x.OutputIDs))
		if chat {
			path = "/v1/chat/completions"
			body = fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":"Hi"}],"max_tokens":%d,"stream":true}`, len(x.OutputIDs))
		}
		resp := e.open(path, body, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		received(t, prompts)
		ev := newEvents(resp)
		var all strings.Builder
		pieces := 0
		for {
			c := choice(t, ev.chunk(t))
			var s string
			if chat {
				s = c["delta"].(map[string]any)["content"].(string)
			} else {
				s = c["text"].(string)
			}
			assert.NotContains(t, s, "\uFFFD", "a chunk with part of a character")
			all.WriteString(s)
			if s != "" {
				pieces++
			}
			if c["finish_reason"] != nil {
				assert.Equal(t, "length", c["finish_reason"])
				break
			}
		}
		ev.done(t)
		assert.Equal(t, x.OutputText, all.String())
		assert.Less(t, pieces, len(x.OutputIDs), "some tokens (halves of characters) made no chunk of their own")
	}
}

// Stop strings are matched on the model's text.
func TestModelTextStopStrings(t *testing.T) {
	dir, x := modelDir(t)
	e, prompts := modelEnv(t, dir, x.OutputIDs)
	r := e.post("/v1/completions", `{"model":"llama","prompt":"Hi","max_tokens":12,"stop":["é,"]}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	received(t, prompts)
	c := choice(t, r.json(t))
	assert.Equal(t, "Hello world caf", c["text"])
	assert.Equal(t, "stop", c["finish_reason"])
}

// The context length counts the model's tokens.
func TestModelTextContextLength(t *testing.T) {
	dir, x := modelDir(t)
	e, _ := modelEnv(t, dir, x.OutputIDs)
	// 171 words of one token each (" Hello" is one token) + BOS = 172 prompt tokens.
	prompt := strings.Repeat(" Hello", 171)
	r := e.post("/v1/completions", fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":341}`, prompt), nil)
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), "context_length_exceeded")
	assert.Contains(t, string(r.body), "172 prompt tokens")
}

// A model directory the frontend cannot read is a 503 that names it, never
// a silent fall-back to the stand-in.
func TestModelTextUnreadableDirectory(t *testing.T) {
	dir, _ := modelDir(t)
	e, _ := cardEnv(t, llamaCard(t, "/nonexistent/model-dir", dir), []int{1})
	r := e.post("/v1/completions", `{"model":"llama","prompt":"Hi","max_tokens":1}`, nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), "/nonexistent/model-dir")
	assert.Contains(t, string(r.body), "model_unavailable")
}

// A chat template that refuses the conversation (raise_exception) is a
// 400 with its message.
func TestModelTextTemplateRefusal(t *testing.T) {
	src, _ := modelDir(t)
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json", "config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	cfg := `{"bos_token":"<|begin_of_text|>","chat_template":"{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first message must be the users') }}{% endif %}{{ messages[0]['content'] }}"}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644))
	e, prompts := modelEnv(t, dir, []int{0})
	r := e.post("/v1/chat/completions", `{"model":"llama","messages":[{"role":"system","content":"x"}],"max_tokens":1}`, nil)
	assert.Equal(t, http.StatusBadRequest, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), "the first message must be the user")
	r = e.post("/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"Hello"}],"max_tokens":1}`, nil)
	assert.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, []int{0}, received(t, prompts))
}

// received is the next prompt a speaker saw (failing rather than hanging).
func received(t *testing.T, prompts <-chan []int) []int {
	t.Helper()
	select {
	case p := <-prompts:
		return p
	case <-time.After(planetest.WaitLimit):
		t.Fatal("the worker got no request")
		return nil
	}
}

// A model directory this frontend cannot read (it runs on another machine)
// is read from a worker that serves it on <namespace>.backend.model_files.
func TestModelTextFetchedFromAWorker(t *testing.T) {
	dir, x := modelDir(t)
	const remote = "/elsewhere/models/llama" // the worker's path, not readable here
	e := newEnv(t)
	prompts := make(chan []int, 4)
	card := llamaCard(t, remote, dir)
	e.workerMeta("w", "dynamo", card, speaker(x.OutputIDs, prompts))
	asked := serveFiles(t, e, card, dir)
	e.start()

	c := x.Completions[0]
	body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": c.Prompt, "max_tokens": len(x.OutputIDs)})
	r := e.post("/v1/completions", string(body), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, c.IDs, received(t, prompts))
	assert.Equal(t, x.OutputText, choice(t, r.json(t))["text"])
	assert.Contains(t, <-asked, "tokenizer.json")
	r = e.post("/v1/completions", string(body), nil) // loaded once
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	received(t, prompts)
	assert.Empty(t, asked)
}

// serveFiles serves the text files of dir on <namespace>.backend.model_files,
// as a worker with card does, in pieces; it reports the names each request
// asked for.
func serveFiles(t *testing.T, e *env, card modelcard.Card, dir string) <-chan []string {
	asked := make(chan []string, 4)
	planetest.Serve(t, planetest.Join(t, e.host), "dynamo."+frontend.ModelFilesEndpoint, func(w *planetest.Worker, req *plane.Request) {
		var r struct {
			Files []string `json:"files"`
		}
		require.NoError(t, json.Unmarshal(req.Payload, &r))
		asked <- r.Files
		for _, name := range r.Files {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				w.Send(req, mustJSON(map[string]any{"name": name, "missing": true}))
				continue
			}
			for len(b) > 0 { // in pieces, as a worker sends a large file
				n := min(len(b), 1000)
				w.Send(req, mustJSON(map[string]any{"name": name, "data": string(b[:n])}))
				b = b[n:]
			}
			w.Send(req, mustJSON(map[string]any{"name": name, "end": true}))
		}
		req.Complete()
	}, planetest.Named("files"), planetest.WithMetadata(cardJSON(t, card)))
	return asked
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
