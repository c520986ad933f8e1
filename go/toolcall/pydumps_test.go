package toolcall

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The expectations are what Python 3.11's json.dumps(json.loads(in),
// ensure_ascii=False) printed for each input.
func TestPyDumps(t *testing.T) {
	for in, want := range map[string]string{
		`{"a":1,"b":[1.50,1e2,-0,0.0001,1e-5,1e16,123456789012345678901234567890,"é\n\u0001<>&` + "\u2028" + `"],"a":null}`: `{"a": null, "b": [1.5, 100.0, 0, 0.0001, 1e-05, 1e+16, 123456789012345678901234567890, "é\n\u0001<>&` + "\u2028" + `"]}`,
		`[]`: `[]`, `{}`: `{}`, `"x"`: `"x"`, `true`: `true`, `1E400`: `Infinity`,
		`{"k":{"z":1,"y":[{}]}}`: `{"k": {"z": 1, "y": [{}]}}`,
		`1.7976931348623157e308`: `1.7976931348623157e+308`, `0.1`: `0.1`, `-2.5e-7`: `-2.5e-07`,
		` { "city" : "Paris" } `: `{"city": "Paris"}`,
	} {
		got, ok := PyDumps(in)
		require.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{``, `{`, `{"a":1} {}`, `nul`} {
		_, ok := PyDumps(bad)
		assert.False(t, ok, bad)
	}
}
