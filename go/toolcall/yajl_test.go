package toolcall

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIJSONEvents checks the yajl model against ijson's parse_coro fed the
// same pieces (testdata/ijson_events.json).
func TestIJSONEvents(t *testing.T) {
	b, err := os.ReadFile("testdata/ijson_events.json")
	require.NoError(t, err)
	var texts []struct {
		Text string `json:"text"`
		Runs [][]struct {
			Piece  string       `json:"piece"`
			Events [][3]*string `json:"events"`
			OK     bool         `json:"ok"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal(b, &texts))
	names := map[jsonEventKind]string{
		evStartMap: "start_map", evMapKey: "map_key", evEndMap: "end_map",
		evStartArray: "start_array", evEndArray: "end_array", evString: "string",
	}
	for _, tx := range texts {
		for r, run := range tx.Runs {
			y := newYajl()
			for i, st := range run {
				var got [][3]*string
				ok := y.feed(st.Piece, func(e jsonEvent) {
					var v *string
					if e.kind == evString || e.kind == evMapKey {
						v = strp(e.value)
					}
					got = append(got, [3]*string{strp(strings.Join(e.path, ".")), strp(names[e.kind]), v})
				})
				want := st.Events
				if !assert.Equal(t, st.OK, ok, "%q run %d piece %d", tx.Text, r, i) ||
					!assert.Equal(t, deref3(want), deref3(got), "%q run %d piece %d", tx.Text, r, i) {
					break
				}
			}
		}
	}
}

func deref3(evs [][3]*string) []string {
	var out []string
	for _, e := range evs {
		k := *e[1]
		if k == "" || k == "number" || k == "boolean" || k == "null" {
			k = "scalar"
		}
		s := *e[0] + " " + k
		if e[2] != nil {
			s += " " + *e[2]
		}
		out = append(out, s)
	}
	return out
}
