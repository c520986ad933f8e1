package frontend

// The model index: what a request reads of the instances (its model's
// cards, their text groups, the context length and migration limit they
// declare; the model names /v1/models lists), derived once per change of
// the instances (plane.InstanceSet), never per request. A request then
// costs the same whatever the number of instances: no copy of the
// instances, no walk over them, no parse of their metadata.

import (
	"sort"

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
	"github.com/dynamo-ctx/dynamo-ctx/go/plane"
)

// modelIndex is derived from one InstanceSet; immutable.
type modelIndex struct {
	set    plane.InstanceSet
	models map[string]*modelEntry
	names  []string        // the models, sorted
	texts  map[string]bool // the text ids the instances name (textID)
}

// modelEntry is one model's part of an index; read only.
type modelEntry struct {
	cards   []modelcard.Card // its instances' cards, in the instances' order
	groups  []textGroup      // its instances by text, in order of first appearance
	groupOf []int            // the group of cards[i]
	// maxModelLen is the smallest context length a card declares (0: none
	// does); migrationLimit the largest migration limit.
	maxModelLen, migrationLimit int
}

func newModelIndex(set plane.InstanceSet) *modelIndex {
	ix := &modelIndex{set: set, models: map[string]*modelEntry{}, texts: map[string]bool{}}
	for _, in := range set.Instances() {
		c := parseMeta(in.Meta)
		ix.texts[textID(c)] = true
		if c.Model == "" {
			continue
		}
		e := ix.models[c.Model]
		if e == nil {
			e = &modelEntry{}
			ix.models[c.Model] = e
			ix.names = append(ix.names, c.Model)
		}
		e.add(c)
	}
	sort.Strings(ix.names)
	return ix
}

// add appends card c to e.
func (e *modelEntry) add(c modelcard.Card) {
	id, g := textID(c), -1
	for j := range e.groups {
		if e.groups[j].id == id {
			g = j
			break
		}
	}
	if g < 0 {
		g = len(e.groups)
		e.groups = append(e.groups, textGroup{id: id})
	}
	e.groups[g].cards = append(e.groups[g].cards, c)
	e.cards = append(e.cards, c)
	e.groupOf = append(e.groupOf, g)
	if c.MaxModelLen > 0 && (e.maxModelLen == 0 || c.MaxModelLen < e.maxModelLen) {
		e.maxModelLen = c.MaxModelLen
	}
	e.migrationLimit = max(e.migrationLimit, c.MigrationLimit)
}

// index is the model index of the frontend's current instances, made on
// the first call after they change.
func (f *Frontend) index() *modelIndex {
	set := f.client.Current()
	if ix := f.modelIx.Load(); ix != nil && ix.set.Same(set) {
		return ix
	}
	f.modelIxMu.Lock()
	defer f.modelIxMu.Unlock()
	set = f.client.Current() // the newest, not the one a caller waited with
	if ix := f.modelIx.Load(); ix != nil && ix.set.Same(set) {
		return ix
	}
	ix := newModelIndex(set)
	f.modelIx.Store(ix)
	return ix
}
