package tokens

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The continuation of a token request: token_ids extended by the tokens
// received, max_tokens reduced by their number (top level and under
// stop_conditions, never below 0), other fields kept; a payload that is not
// an object is resent unchanged.
func TestMigrationContinuation(t *testing.T) {
	three := []json.RawMessage{json.RawMessage("7"), json.RawMessage("8"), json.RawMessage("9")}
	for _, tc := range []struct {
		name     string
		payload  string
		received []json.RawMessage
		want     string // JSON; "" when an error is expected
	}{
		{name: "top-level max_tokens",
			payload: `{"token_ids":[1,2],"max_tokens":10}`, received: three,
			want: `{"token_ids":[1,2,7,8,9],"max_tokens":7}`},
		{name: "stop_conditions max_tokens, other fields kept",
			payload:  `{"token_ids":[1],"stop_conditions":{"max_tokens":5,"stop":["x"]},"sampling_options":{"temperature":0.5},"model":"m"}`,
			received: three[:1],
			want:     `{"token_ids":[1,7],"stop_conditions":{"max_tokens":4,"stop":["x"]},"sampling_options":{"temperature":0.5},"model":"m"}`},
		{name: "both places reduced",
			payload: `{"token_ids":[],"max_tokens":4,"stop_conditions":{"max_tokens":6}}`, received: three,
			want: `{"token_ids":[7,8,9],"max_tokens":1,"stop_conditions":{"max_tokens":3}}`},
		{name: "never below zero",
			payload: `{"token_ids":[1],"max_tokens":2,"stop_conditions":{"max_tokens":1}}`, received: three,
			want: `{"token_ids":[1,7,8,9],"max_tokens":0,"stop_conditions":{"max_tokens":0}}`},
		{name: "exactly zero left",
			payload: `{"token_ids":[1],"max_tokens":3}`, received: three,
			want: `{"token_ids":[1,7,8,9],"max_tokens":0}`},
		{name: "no max_tokens",
			payload: `{"token_ids":[1,2]}`, received: three[:2],
			want: `{"token_ids":[1,2,7,8]}`},
		{name: "no token_ids yet",
			payload: `{"max_tokens":5}`, received: three[:1],
			want: `{"token_ids":[7],"max_tokens":4}`},
		{name: "large token ids kept exactly",
			payload:  `{"token_ids":[151643,128000],"max_tokens":100}`,
			received: []json.RawMessage{json.RawMessage("4294967295"), json.RawMessage("151645")},
			want:     `{"token_ids":[151643,128000,4294967295,151645],"max_tokens":98}`},
		{name: "non-integer max_tokens unchanged",
			payload: `{"token_ids":[1],"max_tokens":"ten"}`, received: three[:1],
			want: `{"token_ids":[1,7],"max_tokens":"ten"}`},
		{name: "null stop_conditions unchanged",
			payload: `{"token_ids":[1],"stop_conditions":null}`, received: three[:1],
			want: `{"token_ids":[1,7],"stop_conditions":null}`},
		{name: "array payload unchanged", payload: `[1,2,3]`, received: three, want: `[1,2,3]`},
		{name: "string payload unchanged", payload: `"hello"`, received: three, want: `"hello"`},
		{name: "number payload unchanged", payload: `42`, received: three, want: `42`},
		{name: "token_ids not an array is an error",
			payload: `{"token_ids":"abc","max_tokens":3}`, received: three, want: ""},
		{name: "null max_tokens (no limit) stays null",
			payload: `{"token_ids":[1],"stop_conditions":{"max_tokens":null}}`, received: three,
			want: `{"token_ids":[1,7,8,9],"stop_conditions":{"max_tokens":null}}`},
		{name: "null payload unchanged",
			payload: `null`, received: three, want: `null`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := []byte(tc.payload)
			orig := slices.Clone(in)
			var got []byte
			var err error
			require.NotPanics(t, func() { got, err = continuation(in, tc.received) })
			assert.Equal(t, orig, in, "the original payload is not modified")
			if tc.want == "" {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.JSONEq(t, tc.want, string(got))
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A Continuation observes the items passed on and rewrites the request
// with what it saw; without tokens the request is unchanged.
func TestContinuation(t *testing.T) {
	c := New()
	payload := []byte(`{"token_ids":[1],"max_tokens":5}`)
	got, err := c.Next(payload)
	require.NoError(t, err)
	assert.Equal(t, string(payload), string(got))
	c.Observe([]byte(`{"token_ids":[7,8],"finish_reason":null}`))
	c.Observe([]byte(`{"text":"no tokens"}`))
	c.Observe([]byte(`42`))
	c.Observe([]byte(`{"token_ids":[9],"finish_reason":"length"}`))
	assert.Equal(t, 3, c.Count())
	got, err = c.Next(payload)
	require.NoError(t, err)
	assert.JSONEq(t, `{"token_ids":[1,7,8,9],"max_tokens":2}`, string(got))
}

// A Continuation says the request is complete once its last item carried
// the finish reason of a request that is done (read fast or by
// encoding/json), or once it holds every token max_tokens allows, when
// every max_tokens the request carries is an integer; never before a
// token arrived, nor for an abort.
func TestContinuationComplete(t *testing.T) {
	const limited = `{"token_ids":[1],"stop_conditions":{"max_tokens":3}}`
	const unlimited = `{"token_ids":[1],"stop_conditions":{"max_tokens":null}}`
	c := New()
	assert.False(t, c.Complete([]byte(limited)), "nothing received")
	assert.False(t, c.Complete([]byte(`{"token_ids":[1],"max_tokens":0}`)), "nothing received, none asked")
	c.Observe([]byte(`{"token_ids":[7],"finish_reason":null}`))
	c.Observe([]byte(`{"finish_reason":null,"token_ids":[8]}`))   // encoding/json's
	c.Observe([]byte(`{"finish_reason":7,"token_ids":[]}`))       // malformed: no reason
	c.Observe([]byte(`{"finish_reason":"stop","token_ids":"x"}`)) // malformed: not read
	assert.False(t, c.Complete([]byte(limited)))
	assert.False(t, c.Complete([]byte(unlimited)))
	assert.True(t, c.Complete([]byte(`{"token_ids":[1],"max_tokens":2}`)), "max_tokens received")
	assert.False(t, c.Complete([]byte(`not json`)))
	for _, ambiguous := range []string{
		`{"token_ids":[1],"max_tokens":2,"stop_conditions":{"max_tokens":null}}`, // a reader may allow more
		`{"token_ids":[1],"max_tokens":2,"stop_conditions":{"max_tokens":"2"}}`,
		`{"token_ids":[1],"max_tokens":-1}`,
		`{"token_ids":[1],"max_tokens":2.5}`,
		`{"token_ids":[1]}`,
	} {
		assert.False(t, c.Complete([]byte(ambiguous)), ambiguous)
	}
	assert.True(t, c.Complete([]byte(`{"token_ids":[1],"max_tokens":9,"stop_conditions":{"max_tokens":2}}`)), "stop_conditions' wins")
	c.Observe([]byte(`{"token_ids":[9]}`))
	assert.True(t, c.Complete([]byte(limited)), "max_tokens received, no finish reason")
	assert.False(t, c.Complete([]byte(unlimited)))

	for _, tc := range []struct {
		last string
		done bool
	}{
		{`{"token_ids":[9],"finish_reason":"stop"}`, true},                   // the fast reader's shape
		{`{"finish_reason":"length","token_ids":[9]}`, true},                 // another order: encoding/json's
		{`{"token_ids":[],"finish_reason":"eos","log_probs":[]}`, true},      // other members
		{`{"token_ids":[9],"finish_reason":"abort"}`, false},                 // not done
		{`{"token_ids":[9],"finish_reason":"cancelled","x":{"y":1}}`, false}, // Dynamo's
		{`{"token_ids":[9],"finish_reason":"error"}`, false},
		{`{"token_ids":[9],"finish_reason":""}`, false},
	} {
		c := New()
		c.Observe([]byte(`{"token_ids":[7],"finish_reason":null}`))
		c.Observe([]byte(tc.last))
		assert.Equal(t, tc.done, c.Complete([]byte(unlimited)), tc.last)
	}
	// Tokens after a finish reason undo it; an item with neither changes
	// nothing.
	c = New()
	c.Observe([]byte(`{"token_ids":[7],"finish_reason":"stop"}`))
	c.Observe([]byte(`{"note":"x"}`))
	c.Observe([]byte(`{"token_ids":[],"finish_reason":null}`))
	assert.True(t, c.Complete([]byte(unlimited)))
	c.Observe([]byte(`{"token_ids":[8],"finish_reason":null}`))
	assert.False(t, c.Complete([]byte(unlimited)))
	c.Observe([]byte(`{"finish_reason":null,"token_ids":[9]}`))
	assert.False(t, c.Complete([]byte(unlimited)))
	c.Observe([]byte(`{"finish_reason":"length","token_ids":[]}`))
	assert.True(t, c.Complete([]byte(unlimited)))
	// Keys match exactly: another spelling is not max_tokens to the worker.
	for _, other := range []string{
		`{"token_ids":[1],"max_tokens":null,"Max_Tokens":1}`,
		`{"token_ids":[1],"MAX_TOKENS":1}`,
		`{"token_ids":[1],"Stop_Conditions":{"max_tokens":1}}`,
		`{"token_ids":[1],"stop_conditions":"x","max_tokens":1}`,
	} {
		c := New()
		c.Observe([]byte(`{"token_ids":[7],"finish_reason":null}`))
		assert.False(t, c.Complete([]byte(other)), other)
	}
}

func TestParseItem(t *testing.T) {
	it, err := ParseItem([]byte(`{"token_ids":[3,4],"finish_reason":"stop"}`))
	require.NoError(t, err)
	assert.Equal(t, []int{3, 4}, it.TokenIDs)
	require.NotNil(t, it.FinishReason)
	assert.Equal(t, "stop", *it.FinishReason)
	it, err = ParseItem([]byte(`{"token_ids":[5],"finish_reason":null}`))
	require.NoError(t, err)
	assert.Nil(t, it.FinishReason)
	_, err = ParseItem([]byte(`{"token_ids":"x"}`))
	assert.Error(t, err)
}

func TestParseRequest(t *testing.T) {
	for payload, want := range map[string]Request{
		`{"token_ids":[1,2],"max_tokens":5}`:                                  {TokenIDs: []int{1, 2}, MaxTokens: 5},
		`{"token_ids":[1],"stop_conditions":{"max_tokens":3},"max_tokens":9}`: {TokenIDs: []int{1}, MaxTokens: 3},
		`{"token_ids":[4]}`: {TokenIDs: []int{4}, MaxTokens: -1},
		`{"token_ids":[],"stop_conditions":{"max_tokens":null}}`: {TokenIDs: []int{}, MaxTokens: -1},
	} {
		got, err := ParseRequest([]byte(payload))
		require.NoError(t, err, payload)
		assert.Equal(t, want, got, payload)
	}
	_, err := ParseRequest([]byte(`{"token_ids":"x"}`))
	assert.Error(t, err)
}

// referenceItem is what encoding/json makes of an item: what ParseItem and
// Observe must agree with, whichever way they read it.
func referenceItem(raw []byte) (Item, []json.RawMessage, error) {
	var it Item
	err := json.Unmarshal(raw, &it)
	var tok struct {
		TokenIDs []json.RawMessage `json:"token_ids"`
	}
	if json.Unmarshal(raw, &tok) != nil {
		tok.TokenIDs = nil
	}
	return it, tok.TokenIDs, err
}

func checkItemAgrees(t *testing.T, raw []byte) {
	t.Helper()
	want, wantIDs, wantErr := referenceItem(raw)
	got, err := ParseItem(raw)
	if wantErr != nil {
		require.Error(t, err, "%q", raw)
	} else {
		require.NoError(t, err, "%q", raw)
		assert.Equal(t, len(want.TokenIDs), len(got.TokenIDs), "%q", raw)
		for i := range want.TokenIDs {
			assert.Equal(t, want.TokenIDs[i], got.TokenIDs[i], "%q", raw)
		}
		assert.Equal(t, want.FinishReason, got.FinishReason, "%q", raw)
	}
	c := New()
	c.Observe([]byte(`{"token_ids":[1]}`))
	c.Observe(raw)
	require.Len(t, c.received, 1+len(wantIDs), "%q", raw)
	for i, id := range wantIDs {
		assert.Equal(t, string(id), string(c.received[1+i]), "%q", raw)
	}
}

// Items are read for every token without encoding/json when they have the
// shape workers write; whatever shape they have, ParseItem and Observe give
// what encoding/json gives.
func TestItemFastPathAgreesWithEncodingJSON(t *testing.T) {
	for _, raw := range itemSeeds {
		checkItemAgrees(t, []byte(raw))
	}
	// The fast path took the usual shapes (the seeds above would pass without it).
	for _, raw := range []string{`{"token_ids":[5,6]}`, `{"token_ids":[5],"finish_reason":"length"}`, ` { "token_ids" : [ -0 , 12 ] , "finish_reason" : null } `} {
		_, ok := scanItem([]byte(raw), func(int, []byte) {})
		assert.True(t, ok, raw)
	}
}

var itemSeeds = []string{
	`{"token_ids":[5,6]}`, `{"token_ids":[]}`, `{"token_ids":[5],"finish_reason":"length"}`,
	`{"token_ids":[5],"finish_reason":null}`, "\t{\n\"token_ids\"\r:[ 1 ,2 ] ,\"finish_reason\": \"stop\" }\n",
	`{"token_ids":[-0,-7]}`, `{"token_ids":[01]}`, `{"token_ids":[1.0]}`, `{"token_ids":[1e3]}`, `{"token_ids":[-]}`,
	`{"token_ids":[123456789012345678]}`, `{"token_ids":[1234567890123456789]}`, `{"token_ids":[99999999999999999999]}`,
	`{"token_ids":[1],}`, `{"token_ids":[1,]}`, `{"token_ids":[1]} x`, `{"token_ids":[1]`, `{"token_ids":[1]}}`,
	`{"TOKEN_IDS":[1]}`, `{"token_ids":[1],"token_ids":[2]}`, `{"finish_reason":"stop","token_ids":[3]}`,
	`{"token_ids":[1],"finish_reason":"st\u006fp"}`, `{"token_ids":[1],"finish_reason":"stöp"}`,
	`{"token_ids":[1],"finish_reason":"a` + "\x01" + `"}`, `{"token_ids":[1],"finish_reason":"\xff"}`,
	`{"token_ids":[1],"finish_reason":7}`, `{"token_ids":[1],"finish_reason":nul}`, `{"token_ids":[1],"finish_reason":"x}`,
	`{"token_ids":null}`, `{"token_ids":"x"}`, `{"token_ids":[1],"text":"a"}`, `{}`, `42`, `[1]`, ``, `{"token_ids":[1]}` + "\x00",
	`{"token_ids":[1,2],"finish_reason":"stop"}`, `{"token_ids":[ -1 ]}`, `{"token_ids":[--1]}`, `{"token_ids":[+1]}`,
}

func FuzzItemAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range itemSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkItemAgrees(t, raw) })
}

func BenchmarkParseItem(b *testing.B) {
	raw := []byte(`{"token_ids":[1234],"finish_reason":null}`)
	c := New()
	for b.Loop() {
		if _, err := ParseItem(raw); err != nil {
			b.Fatal(err)
		}
		c.Observe(raw)
		c.received = c.received[:0]
	}
}
