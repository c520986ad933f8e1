package plane

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The envelope carries where the abort is confirmed, and names nothing
// but a caller's abort subject.
func TestEnvelopeAbortSubject(t *testing.T) {
	env := envelope{ID: "a", Key: NewKey(), Addr: "h:1", Token: NewKey(), Request: json.RawMessage(`{}`), Aborts: AbortSubjectOf(NewKey())}
	got, err := readEnvelope(env.encode())
	require.NoError(t, err)
	assert.Equal(t, env, got)
	assert.NoError(t, got.check())
	var marshalled envelope
	require.NoError(t, json.Unmarshal(env.encode(), &marshalled))
	assert.Equal(t, env.Aborts, marshalled.Aborts)

	for _, bad := range []string{AbortedSubject, AbortedSubject + ".", "dc.req.x", AbortedSubject + ".*", AbortedSubject + ".>",
		AbortSubjectOf(NewKey()) + ".x", AbortSubjectOf("ABC"), "x" + AbortSubjectOf(NewKey())} {
		env.Aborts = bad
		assert.ErrorIs(t, env.check(), errMalformedEnvelope, "%q", bad)
	}
}
