package anchorsplit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/dynamo-ctx/dynamo-ctx/go/internal/anchorsplit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func never(int) bool { return false }

func TestSplitPlacesAnchorsRightToLeft(t *testing.T) {
	// "<a>" occurs twice: the one before "<b>" is its place.
	parts, deferred, post := anchorsplit.Split("x<a>y<a>z<b>w", []string{"<a>", "<b>"}, never)
	assert.Equal(t, []anchorsplit.Part{
		{Index: 0, Text: "x<a>y"}, {Index: 0, Anchor: true}, {Index: 1, Text: "z"}, {Index: 1, Anchor: true},
		{Index: 2, Text: "w"},
	}, parts)
	assert.Empty(t, deferred)
	assert.Empty(t, post)
}

func TestSplitDefersAnchorsItCannotPlace(t *testing.T) {
	// "<b>" is not in the text: it waits, and the text after "<a>" is its.
	parts, deferred, post := anchorsplit.Split("x<a>y", []string{"<a>", "<b>"}, never)
	assert.Equal(t, []anchorsplit.Part{{Index: 0, Text: "x"}, {Index: 0, Anchor: true}}, parts)
	assert.Equal(t, []int{1}, deferred)
	assert.Equal(t, "y", post)

	// A dropped anchor takes no text: what follows stays content.
	parts, deferred, post = anchorsplit.Split("x<a>y", []string{"<a>", "<b>"}, func(i int) bool { return i == 1 })
	assert.Equal(t, []anchorsplit.Part{{Index: 0, Text: "x"}, {Index: 0, Anchor: true}, {Index: 2, Text: "y"}}, parts)
	assert.Equal(t, []int{1}, deferred)
	assert.Empty(t, post)

	// One not placed before one that is: it waits, the content stays.
	parts, deferred, post = anchorsplit.Split("x<b>y", []string{"<a>", "<b>"}, never)
	assert.Equal(t, []anchorsplit.Part{{Index: 1, Text: "x"}, {Index: 1, Anchor: true}, {Index: 2, Text: "y"}}, parts)
	assert.Equal(t, []int{0}, deferred)
	assert.Empty(t, post)
}
