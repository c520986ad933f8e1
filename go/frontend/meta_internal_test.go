package frontend

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

// The memo gives what parsing gives, for metadata seen before or not,
// malformed included, and stays bounded.
func TestParseMetaMemo(t *testing.T) {
	cases := map[string]modelcard.Card{
		`{"model":"m","migration_limit":2,"max_model_len":8192}`: {Model: "m", MigrationLimit: 2, MaxModelLen: 8192},
		`{"model":"other"}`: {Model: "other"},
		`not json`:          {},
		``:                  {},
		`{"model":7}`:       {},
	}
	for range 2 { // parsed, then remembered
		for raw, want := range cases {
			assert.Equal(t, want, parseMeta([]byte(raw)), raw)
		}
	}
	for i := range 3 * maxParsedMetas {
		raw := fmt.Sprintf(`{"model":"m%d"}`, i)
		assert.Equal(t, fmt.Sprintf("m%d", i), parseMeta([]byte(raw)).Model)
	}
	parsedMetas.RLock()
	assert.LessOrEqual(t, len(parsedMetas.m), maxParsedMetas)
	parsedMetas.RUnlock()
}

func BenchmarkParseMeta(b *testing.B) {
	m := []byte(`{"model":"ft-mock","migration_limit":2,"max_model_len":8192,"mode":"agg"}`)
	b.ReportAllocs()
	for range b.N {
		_ = parseMeta(m)
	}
}
