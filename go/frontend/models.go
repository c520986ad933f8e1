package frontend

import (
	"encoding/json"
	"net/http"
	"sort"
	"sync"

	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

type instanceMeta struct {
	Model          string `json:"model"`
	MigrationLimit int    `json:"migration_limit"`
	MaxModelLen    int    `json:"max_model_len"`
	// ModelPath is the model directory (Hugging Face layout) whose
	// tokenizer and chat template are the model's language (text.go).
	ModelPath string `json:"model_path"`
	// MaxNumSeqs is the instance's capacity: the requests its engine runs
	// at once (0: unlimited; admission.go).
	MaxNumSeqs int `json:"max_num_seqs"`
}

// parseMeta reads an instance's metadata. Every request reads every
// instance's (routing, limits), so the parsed form is kept, by the bytes, for
// as many distinct metadata as maxParsedMetas; past that the memo starts over.
func parseMeta(b []byte) instanceMeta {
	parsedMetas.RLock()
	m, ok := parsedMetas.m[string(b)]
	parsedMetas.RUnlock()
	if ok {
		return m
	}
	_ = json.Unmarshal(b, &m)
	parsedMetas.Lock()
	if len(parsedMetas.m) >= maxParsedMetas {
		clear(parsedMetas.m)
	}
	parsedMetas.m[string(b)] = m
	parsedMetas.Unlock()
	return m
}

const maxParsedMetas = 1024

var parsedMetas = struct {
	sync.RWMutex
	m map[string]instanceMeta
}{m: map[string]instanceMeta{}}

// modelClient returns the client that routes to the instances of model. It
// shares the frontend's one view of the instances (the one /health and
// /v1/models show), so a model listed there is routable at once.
func (f *Frontend) modelClient(model string) (*plane.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.clients[model]; c != nil {
		return c, nil
	}
	c, err := f.client.Filtered(func(meta []byte) bool { return parseMeta(meta).Model == model })
	if err != nil {
		return nil, err
	}
	f.gates[model] = newGate(c, max(f.opts.MaxQueuedRequests, 0))
	f.clients[model] = c
	return c, nil
}

// gateOf is the admission of model (made with its client by modelClient).
func (f *Frontend) gateOf(model string) *gate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gates[model]
}

func (f *Frontend) migrationLimit(c *plane.Client) int {
	if f.opts.MigrationLimit >= 0 {
		return f.opts.MigrationLimit
	}
	limit := 0
	for _, in := range c.Instances() {
		if m := parseMeta(in.Meta); m.MigrationLimit > limit {
			limit = m.MigrationLimit
		}
	}
	return limit
}

// metas are the parsed metadata of c's instances.
func (f *Frontend) metas(c *plane.Client) []instanceMeta {
	ins := c.Instances()
	out := make([]instanceMeta, len(ins))
	for i, in := range ins {
		out[i] = parseMeta(in.Meta)
	}
	return out
}

// maxModelLen is the model's context length: the smallest its instances
// declare, else Options.DefaultMaxModelLen.
func (f *Frontend) maxModelLen(c *plane.Client) int {
	limit := 0
	for _, in := range c.Instances() {
		if m := parseMeta(in.Meta); m.MaxModelLen > 0 && (limit == 0 || m.MaxModelLen < limit) {
			limit = m.MaxModelLen
		}
	}
	if limit == 0 {
		return f.opts.DefaultMaxModelLen
	}
	return limit
}

func (f *Frontend) modelNames() []string {
	seen := map[string]bool{}
	for _, in := range f.client.Instances() {
		if m := parseMeta(in.Meta); m.Model != "" {
			seen[m.Model] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// hasModel reports whether a registered instance declares model, so that a
// per-model client is only made for models that exist.
func (f *Frontend) hasModel(model string) bool {
	for _, in := range f.client.Instances() {
		if parseMeta(in.Meta).Model == model {
			return true
		}
	}
	return false
}

func modelObject(name string) map[string]any {
	return map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "dynamo-ctx"}
}

func (f *Frontend) models(w http.ResponseWriter, r *http.Request) {
	data := []map[string]any{}
	for _, n := range f.modelNames() {
		data = append(data, modelObject(n))
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
}

// model answers GET /v1/models/{id}; the id may contain slashes.
func (f *Frontend) model(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	if !f.hasModel(name) {
		modelNotFound(w, name)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(modelObject(name))
}
