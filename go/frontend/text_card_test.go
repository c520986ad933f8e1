package frontend_test

// The model's text is known by its content (the text checksum of the
// workers' model cards), not its path: a directory updated in place, and
// different files at one path on different machines, are each served with
// their own workers' text.

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/frontend"
	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/internal/planetest"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

// Two revisions of a model's chat template: the second says the message
// twice, so a chat is another prompt in each.
const (
	templateOnce  = `{{ bos_token }}{{ messages[0]['content'] }}`
	templateTwice = `{{ bos_token }}{{ messages[0]['content'] }}{{ messages[0]['content'] }}`
)

// revision writes a model directory into dir: the test model's tokenizer
// and a tokenizer_config.json with the chat template.
func revision(t *testing.T, dir, template string) {
	t.Helper()
	src, _ := modelDir(t)
	b, err := os.ReadFile(filepath.Join(src, hfmodel.TokenizerFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, hfmodel.TokenizerFile), b, 0o644))
	cfg := mustJSON(map[string]any{"bos_token": "<|begin_of_text|>", "chat_template": template})
	require.NoError(t, os.WriteFile(filepath.Join(dir, hfmodel.TokenizerConfigFile), cfg, 0o644))
}

// chatIDs are the prompt ids of a chat of one user message in dir's text.
func chatIDs(t *testing.T, dir, content string) []int {
	t.Helper()
	m, err := hfmodel.Load(dir)
	require.NoError(t, err)
	s, err := m.RenderChat([]hfmodel.Message{{Role: "user", Content: content}})
	require.NoError(t, err)
	ids, err := m.Tokenizer().Encode(s, false)
	require.NoError(t, err)
	return ids
}

// waitInstances waits until the frontend knows n instances.
func (e *env) waitInstances(n int) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		r := e.do(http.MethodGet, "/health", "", nil)
		return r.status == http.StatusOK && r.json(e.t)["instances"] == float64(n)
	}, planetest.WaitLimit, 5*time.Millisecond, "the frontend never knew %d instances", n)
}

// A new revision of the model's files at the same path (updated in place,
// then a worker started on it): the frontend loads the new text, never
// serving the one it loaded from that path before.
func TestModelTextUpdatedInPlace(t *testing.T) {
	dir := t.TempDir()
	revision(t, dir, templateOnce)
	before := chatIDs(t, dir, "Hello")
	oldCard, _, err := modelcard.Build(modelcard.Card{Model: "llama", Mode: modelcard.Agg, ModelPath: dir})
	require.NoError(t, err)
	e := newEnv(t)
	oldPrompts := make(chan []int, 4)
	old := e.workerMeta("old", "dynamo", oldCard, speaker([]int{0}, oldPrompts))
	e.start()
	r := e.post("/v1/chat/completions", chat("llama", "Hello", 1, false), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, before, received(t, oldPrompts))

	revision(t, dir, templateTwice)
	after := chatIDs(t, dir, "Hello")
	require.NotEqual(t, before, after)
	old.EP.Close()
	e.waitInstances(0)
	newCard, _, err := modelcard.Build(modelcard.Card{Model: "llama", Mode: modelcard.Agg, ModelPath: dir})
	require.NoError(t, err)
	require.NotEqual(t, oldCard.TextChecksum, newCard.TextChecksum)
	newPrompts := make(chan []int, 4)
	e.workerMeta("new", "dynamo", newCard, speaker([]int{0}, newPrompts))
	e.waitInstances(1)
	r = e.post("/v1/chat/completions", chat("llama", "Hello", 1, false), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, after, received(t, newPrompts), "the new revision's text")
	texts, routes := frontend.Loaded(e.fe)
	assert.Equal(t, 1, texts, "the old revision's text is dropped")
	assert.Equal(t, 1, routes, "and its route")
}

// Two workers name the same path with different files in it (on different
// machines): each request is tokenized with the text of the worker that
// serves it. Here the frontend's copy of the path holds a's files; b's are
// read from b.
func TestModelTextSamePathOtherFiles(t *testing.T) {
	here, there := t.TempDir(), t.TempDir()
	revision(t, here, templateOnce)   // a's files, at the path this frontend reads
	revision(t, there, templateTwice) // b's: the same path on b's machine
	idsA, idsB := chatIDs(t, here, "Hello"), chatIDs(t, there, "Hello")
	require.NotEqual(t, idsA, idsB)
	cardA, cardB := llamaCard(t, here, here), llamaCard(t, here, there)
	e := newEnv(t)
	promptsA, promptsB := make(chan []int, 16), make(chan []int, 16)
	e.workerMeta("a", "dynamo", cardA, speaker([]int{0}, promptsA))
	e.workerMeta("b", "dynamo", cardB, speaker([]int{0}, promptsB))
	asked := serveFiles(t, e, cardB, there) // b serves its own files
	e.start()
	e.waitInstances(2)

	n := map[string]int{}
	for range 6 {
		r := e.post("/v1/chat/completions", chat("llama", "Hello", 1, false), nil)
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		select {
		case p := <-promptsA:
			assert.Equal(t, idsA, p, "a request to a in b's text")
			n["a"]++
		case p := <-promptsB:
			assert.Equal(t, idsB, p, "a request to b in a's text")
			n["b"]++
		case <-time.After(planetest.WaitLimit):
			t.Fatal("no worker got the request")
		}
	}
	assert.Equal(t, map[string]int{"a": 3, "b": 3}, n, "the workers take turns")
	assert.Contains(t, planetest.Recv(t, asked, "b's files asked of b"), hfmodel.TokenizerFile)
	assert.Empty(t, asked, "and once")
}

// A worker whose files changed since it published its card (their checksum
// is not the card's) is not read: a 503 that says so, never another text.
func TestModelTextFilesChangedSinceTheCard(t *testing.T) {
	there := t.TempDir()
	revision(t, there, templateOnce)
	card := llamaCard(t, "/elsewhere/models/llama", there)
	revision(t, there, templateTwice) // changed after the card was built
	e := newEnv(t)
	prompts := make(chan []int, 4)
	e.workerMeta("w", "dynamo", card, speaker([]int{0}, prompts))
	serveFiles(t, e, card, there)
	e.start()
	r := e.post("/v1/chat/completions", chat("llama", "Hello", 1, false), nil)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.Contains(t, string(r.body), "model_unavailable")
	assert.Contains(t, string(r.body), "are not those of its card")
	assert.Empty(t, prompts)
}

// A card that names a directory without a checksum (one that go/modelcard
// did not build) is still served: its text is the directory as this
// frontend finds it, by path.
func TestModelTextCardWithoutChecksum(t *testing.T) {
	dir, x := modelDir(t)
	e, prompts := cardEnv(t, modelcard.Card{Model: "llama", ModelPath: dir}, x.OutputIDs)
	c := x.Completions[0]
	r := e.post("/v1/completions", completion("llama", c.Prompt, len(x.OutputIDs), false), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, c.IDs, received(t, prompts))
}
