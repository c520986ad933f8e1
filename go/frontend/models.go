package frontend

import (
	"net/http"
	"sync"

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// parseMeta reads an instance's metadata, its model card (go/modelcard: the
// one definition of what a worker publishes), leniently: what does not parse
// is left at zero. Every request reads every instance's (routing, limits),
// so the parsed form is kept, by the bytes, for as many distinct metadata as
// maxParsedMetas; past that the memo starts over.
func parseMeta(b []byte) modelcard.Card {
	parsedMetas.RLock()
	m, ok := parsedMetas.m[string(b)]
	parsedMetas.RUnlock()
	if ok {
		return m
	}
	m, _ = modelcard.Parse(b)
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
	m map[string]modelcard.Card
}{m: map[string]modelcard.Card{}}

// route names the instances a request may go to: those of one model that
// speak one text (textID). A model's instances normally all do; while they
// do not (a new revision of the model's files rolling out, or different
// files at one path on different machines), each request is tokenized with
// one text and goes only to the instances that have it (text.go).
type route struct{ model, text string }

// modelClient returns the client that routes to the instances of key, with
// its admission gate (made with it). It shares the frontend's one view of the
// instances (the one /health and /v1/models show), so a model listed there
// is routable at once. Making one closes the model's routes that nothing
// uses any more (unused), so that they are bounded by the texts in use.
func (f *Frontend) modelClient(key route) (*plane.Client, *gate, error) {
	f.mu.Lock()
	if c := f.clients[key]; c != nil {
		g := f.gates[key]
		f.mu.Unlock()
		return c, g, nil
	}
	c, err := f.client.Filtered(func(meta []byte) bool {
		m := parseMeta(meta)
		return m.Model == key.model && textID(m) == key.text
	})
	if err != nil {
		f.mu.Unlock()
		return nil, nil, err
	}
	var stale []*plane.Client
	for k, old := range f.clients {
		if k.model == key.model && unused(old, f.gates[k]) {
			stale = append(stale, old)
			delete(f.clients, k)
			delete(f.gates, k)
		}
	}
	g := newGate(c, max(f.opts.MaxQueuedRequests, 0))
	f.gates[key] = g
	f.clients[key] = c
	f.mu.Unlock()
	for _, old := range stale {
		old.Close()
	}
	return c, g, nil
}

// unused reports whether a route has no instance, no request waiting for a
// place and none running (a text whose workers are all gone).
func unused(c *plane.Client, g *gate) bool {
	if c.NumInstances() > 0 || g.queued() > 0 {
		return false
	}
	for _, n := range c.Running() {
		if n > 0 {
			return false
		}
	}
	return true
}

// migrationLimit is the frontend's own, else the largest model's instances
// declare.
func (f *Frontend) migrationLimit(model string) int {
	if f.opts.MigrationLimit >= 0 {
		return f.opts.MigrationLimit
	}
	if e := f.index().models[model]; e != nil {
		return e.migrationLimit
	}
	return 0
}

// maxModelLen is the model's context length: the smallest its instances
// declare, else Options.DefaultMaxModelLen.
func (f *Frontend) maxModelLen(model string) int {
	if e := f.index().models[model]; e != nil && e.maxModelLen > 0 {
		return e.maxModelLen
	}
	return f.opts.DefaultMaxModelLen
}

// modelNames are the models the instances serve, sorted (shared: read only).
func (f *Frontend) modelNames() []string { return f.index().names }

// hasModel reports whether a registered instance declares model, so that a
// per-model client is only made for models that exist.
func (f *Frontend) hasModel(model string) bool { return f.index().models[model] != nil }

func modelObject(name string) map[string]any {
	return map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "dynamo-ctx"}
}

func (f *Frontend) models(w http.ResponseWriter, r *http.Request) {
	data := []map[string]any{}
	for _, n := range f.modelNames() {
		data = append(data, modelObject(n))
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

// model answers GET /v1/models/{id}; the id may contain slashes.
func (f *Frontend) model(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("id")
	if !f.hasModel(name) {
		modelNotFound(w, name)
		return
	}
	writeJSON(w, modelObject(name))
}
