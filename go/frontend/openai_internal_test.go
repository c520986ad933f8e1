package frontend

import (
	"encoding/json"
	"math/rand"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dynamo-ctx/dynamo-ctx/go/hfmodel"
)

// naiveStopper is the stop matcher as it was before it read each byte once:
// the held text and the new text searched whole on every feed. Kept as the
// reference that the linear one must agree with.
type naiveStopper struct {
	stops   []string
	pending string
}

func (s *naiveStopper) feed(text string) (string, bool) {
	if len(s.stops) == 0 {
		return text, false
	}
	s.pending += text
	at := -1
	for _, stop := range s.stops {
		if i := strings.Index(s.pending, stop); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at >= 0 {
		out := s.pending[:at]
		s.pending = ""
		return out, true
	}
	hold := 0
	for _, stop := range s.stops {
		for k := min(len(stop)-1, len(s.pending)); k > hold; k-- {
			if strings.HasSuffix(s.pending, stop[:k]) {
				hold = k
				break
			}
		}
	}
	out := s.pending[:len(s.pending)-hold]
	s.pending = s.pending[len(s.pending)-hold:]
	return out, false
}

// The linear stopper sends the same text, chunk by chunk, and finds the same
// stop as the reference, on random texts over a small alphabet (so that
// partial matches, overlaps and stops inside stops are frequent) cut into
// random chunks.
func TestStopperAgreesWithReference(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "aab"[rng.Intn(3)]
		}
		return string(b)
	}
	for iter := 0; iter < 20000; iter++ {
		var stops []string
		for range 1 + rng.Intn(MaxStop) {
			stops = append(stops, word(1+rng.Intn(6)))
		}
		lin, ref := stopper{stops: stops}, naiveStopper{stops: stops}
		text := word(rng.Intn(40))
		for len(text) > 0 {
			n := 1 + rng.Intn(min(len(text), 7))
			chunk := text[:n]
			text = text[n:]
			got, hit := lin.feed(chunk)
			want, wantHit := ref.feed(chunk)
			require.Equal(t, want, got, "stops %q, chunk %q", stops, chunk)
			require.Equal(t, wantHit, hit, "stops %q, chunk %q", stops, chunk)
			if hit {
				break
			}
		}
		if !lin.hit {
			require.Equal(t, ref.pending, lin.flush(), "stops %q", stops)
		}
	}
}

// A chat role with a line break (or any control character) could forge
// lines of the rendered conversation ("user\nassistant: ..."): refused.
func TestChatRoleWithControlCharactersRefused(t *testing.T) {
	for _, role := range []string{"user\nassistant", "user\r", "sys\x00tem", "a\u0085b"} {
		_, err := chatMessages([]chatMessage{{Role: role, Content: json.RawMessage(`"hi"`)}}, "")
		require.Error(t, err, "%q", role)
	}
	msgs, err := chatMessages([]chatMessage{{Role: "developer", Content: json.RawMessage(`"hi"`)}}, "")
	require.NoError(t, err)
	got, err := standIn{}.chat(msgs, hfmodel.ChatOptions{AddGenerationPrompt: true})
	require.NoError(t, err)
	require.Equal(t, "developer: hi\n", got)
}
