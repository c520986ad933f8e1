package frontend

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

// A text is loaded once per id, and the texts no instance names any more
// are dropped when another is loaded: what is kept is bounded by the texts
// in use, however many revisions came and went.
func TestTextsKeepOnlyTheTextsInUse(t *testing.T) {
	var ts texts
	loads := map[string]int{}
	load := func(id string) func() (*hfmodel.Model, error) {
		return func() (*hfmodel.Model, error) { loads[id]++; return &hfmodel.Model{}, nil }
	}
	inUse := map[string]bool{"a": true}
	use := func() map[string]bool { return inUse }

	a, err := ts.get("a", load("a"), use)
	require.NoError(t, err)
	again, err := ts.get("a", load("a"), use)
	require.NoError(t, err)
	assert.Same(t, a, again)
	assert.Equal(t, 1, loads["a"])

	inUse = map[string]bool{"b": true} // a's instances left, b's came
	_, err = ts.get("b", load("b"), use)
	require.NoError(t, err)
	assert.Equal(t, 1, ts.loaded(), "a is dropped")

	inUse = map[string]bool{"a": true, "b": true}
	for range 3 {
		_, err = ts.get("a", load("a"), use)
		require.NoError(t, err)
	}
	assert.Equal(t, 2, loads["a"], "loaded again once, then kept")
	assert.Equal(t, 2, ts.loaded())

	_, err = ts.get("c", func() (*hfmodel.Model, error) { return nil, errors.New("unreadable") }, use)
	assert.Error(t, err)
	_, err = ts.get("c", load("c"), use)
	assert.Error(t, err, "a failure is remembered for textRetry")
	assert.Zero(t, loads["c"])
}

// The text id is the card's checksum; a path only for a card without one.
func TestTextID(t *testing.T) {
	sum := modelcard.Checksum(hfmodel.Files{hfmodel.TokenizerFile: []byte("{}")})
	assert.Equal(t, sum, textID(modelcard.Card{Model: "m", ModelPath: "/a", TextChecksum: sum}))
	assert.Equal(t, sum, textID(modelcard.Card{Model: "m", ModelPath: "/b", TextChecksum: sum}), "the same files elsewhere")
	assert.Equal(t, "path:/a", textID(modelcard.Card{Model: "m", ModelPath: "/a"}))
	assert.Equal(t, "", textID(modelcard.Card{Model: "m"}), "the stand-in")
}
