package plane

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/ctxtree"
	"github.com/dynamo-ctx/dynamo-ctx/go/tracing"
)

// encode writes what json.Marshal would, up to the whitespace of the request
// and metadata it copies as they are.
func TestEnvelopeEncodeIsMarshal(t *testing.T) {
	for _, env := range []envelope{
		{ID: "plain", Key: NewKey(), Addr: "127.0.0.1:4000", Token: NewKey(), Request: json.RawMessage(`{"a": [1, 2]}`)},
		{ID: `quote " back \ <tag> & é 🎈`, Key: NewKey(), Addr: "[::1]:1", Token: NewKey(), State: ctxtree.Stopped, Request: json.RawMessage(" \n7\t")},
		{ID: "x", Key: NewKey(), Addr: "h:2", Token: NewKey(), State: ctxtree.Killed, Request: json.RawMessage(`null`), Metadata: json.RawMessage(`{"k": {"n": [true]}}`)},
	} {
		got := env.encode()
		require.True(t, json.Valid(got), "%s", got)
		want, err := json.Marshal(env)
		require.NoError(t, err)
		var a, b map[string]any
		require.NoError(t, json.Unmarshal(got, &a))
		require.NoError(t, json.Unmarshal(want, &b))
		assert.Equal(t, b, a)
		var back envelope
		require.NoError(t, json.Unmarshal(got, &back))
		assert.NoError(t, back.check())
		assert.Equal(t, env.ID, back.ID)
		assert.Equal(t, env.State, back.State)
	}
}

// A request that is not there is refused; one that is there is JSON, since
// the worker checks the whole envelope (readEnvelope).
func TestEnvelopeWithoutRequestIsRefused(t *testing.T) {
	var env envelope
	require.NoError(t, json.Unmarshal([]byte(`{"id":"a","key":"`+NewKey()+`","addr":"h:1","token":"`+NewKey()+`"}`), &env))
	assert.Error(t, env.check())
	_, err := readEnvelope([]byte(`{"id":"a","request":{"x":}`))
	assert.Error(t, err)
}

// The time left an envelope may carry is ctxtree's timeout range, in
// microseconds: up to the last one below ctxtree.MaxTimeout.
func TestEnvelopeTimeoutIsCtxtreeRange(t *testing.T) {
	last := ctxtree.MaxTimeout.Microseconds() - 1
	for us, ok := range map[int64]bool{0: true, 2500000: true, last: true, -1: false, last + 1: false} {
		env := envelope{ID: "t", Key: NewKey(), Addr: "127.0.0.1:1", Token: NewKey(), Request: json.RawMessage(`{}`), TimeoutUs: &us}
		_, inRange := ctxtree.TimeoutMicros(us)
		assert.Equal(t, ok, env.check() == nil, us)
		assert.Equal(t, ok, inRange == nil, us)
	}
}

// Whatever readEnvelope accepts, json.Unmarshal reads the same way; and it
// accepts whatever encode writes.
func FuzzReadEnvelope(f *testing.F) {
	key, token := NewKey(), NewKey()
	for _, env := range []envelope{
		{ID: "plain", Key: key, Addr: "127.0.0.1:4000", Token: token, Request: json.RawMessage(`{"a": [1, "]}", {"b": null}]}`)},
		{ID: `q " \ é`, Key: key, Addr: "[::1]:1", Token: token, State: ctxtree.Killed, Request: json.RawMessage(`-1.5e3`), Metadata: json.RawMessage(`{"k":"}"}`)},
		{ID: "t", Key: key, Addr: "127.0.0.1:1", Token: token, Request: json.RawMessage(`{}`), TimeoutUs: new(int64(2500000))},
		{ID: "tr", Key: key, Addr: "127.0.0.1:1", Token: token, Request: json.RawMessage(`1`),
			Trace: &tracing.Remote{TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Op: "chat", Model: "m"}},
	} {
		f.Add(env.encode())
	}
	for _, s := range []string{
		`{"id":"a","ID":"b"}`, `{"id":"a","id":"b"}`, `{"\u0069d":"a"}`, `{"ſtate":1}`, `{"state":-1}`, `{"state":1.0}`,
		`{"request":[1,2],"x":{"y":[]},"request":3}`, `[1]`, `null`, ` {"id" : "a" , "state" : 2 } `, `{"id":1}`,
		`{"metadata":null,"request":null}`, `{"token":"\"}"}`, `{}`, `{"a":"b\\"}`, `{"timeout_us":1e3}`, `{"timeout_us":-5}`,
		`{"trace":5}`, `{"trace":null}`, `{"trace":{"TraceParent":"x","op":1}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := readEnvelope(data)
		if err != nil {
			return
		}
		var want envelope
		require.NoError(t, json.Unmarshal(data, &want), "%q", data)
		assert.Equal(t, want.ID, got.ID)
		assert.Equal(t, want.Key, got.Key)
		assert.Equal(t, want.Addr, got.Addr)
		assert.Equal(t, want.Token, got.Token)
		assert.Equal(t, want.State, got.State)
		assert.Equal(t, string(want.Request), string(got.Request))
		assert.Equal(t, string(want.Metadata), string(got.Metadata))
		assert.Equal(t, want.TimeoutUs, got.TimeoutUs)
		assert.Equal(t, want.Trace, got.Trace)
	})
}

func TestReadEnvelopeReadsEncode(t *testing.T) {
	env := envelope{ID: `q " \ é <&>`, Key: NewKey(), Addr: "h:1", Token: NewKey(), State: ctxtree.Stopped, Request: json.RawMessage(`{"t":[1,2]}`), Metadata: json.RawMessage(`{"m":{}}`),
		Trace: &tracing.Remote{TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "k=v", Op: "chat", Model: "m"}}
	got, err := readEnvelope(env.encode())
	require.NoError(t, err)
	assert.Equal(t, env, got)
	for _, bad := range []string{`{"id":"a","ID":"b"}`, `{"id":"a","id":"b"}`, `{"\u0069d":"a"}`, `{"state":-1}`, `[1]`, `{"id":1}`, `{"id":"a"`} {
		_, err := readEnvelope([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// BenchmarkReadEnvelope reads the envelope of a 10 kB request (a prompt of
// 2,000 tokens), what a worker does for every request before acknowledging it.
func BenchmarkReadEnvelope(b *testing.B) {
	payload := []byte(`{"token_ids":[` + strings.Repeat("1234,", 2000) + `1],"sampling_options":{"temperature":0.5}}`)
	env := (&envelope{ID: "abc", Key: NewKey(), Addr: "127.0.0.1:4000", Token: NewKey(), Request: payload}).encode()
	b.SetBytes(int64(len(env)))
	for range b.N {
		e, err := readEnvelope(env)
		if err != nil || e.check() != nil {
			b.Fatal(err)
		}
	}
}

// An envelope carries its request, or the size of the request the worker
// fetches from the caller, never both; a size over MaxRequestBytes is
// refused as too large before anything is allocated for it.
func TestEnvelopeRequestBytes(t *testing.T) {
	env := envelope{ID: "f", Key: NewKey(), Addr: "127.0.0.1:1", Token: NewKey(), RequestBytes: 7 << 20}
	got, err := readEnvelope(env.encode())
	require.NoError(t, err)
	assert.Equal(t, 7<<20, got.RequestBytes)
	assert.Empty(t, got.Request)
	assert.NoError(t, got.check())
	head := `{"id":"f","key":"` + NewKey() + `","addr":"h:1","token":"` + NewKey() + `"`
	for body, want := range map[string]error{
		`,"request_bytes":10}`:                   nil,
		`,"request":1,"request_bytes":10}`:       errMalformedEnvelope,
		`,"request":null,"request_bytes":10}`:    errMalformedEnvelope,
		`,"request_bytes":-1}`:                   errMalformedEnvelope,
		`,"request_bytes":0}`:                    errMalformedEnvelope,
		`,"request_bytes":1e3}`:                  errMalformedEnvelope,
		`,"request_bytes":268435457}`:            errRequestTooLarge,
		`,"request_bytes":99999999999999999999}`: errMalformedEnvelope,
	} {
		env, err := readEnvelope([]byte(head + body))
		if err == nil {
			err = env.check()
		}
		assert.Equal(t, want, err, body)
	}
}
