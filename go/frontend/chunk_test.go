package frontend

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The typed chunk encodes to the same bytes as the map it replaced, for
// chat and completions, first and later tokens, the finish, with and
// without usage, and text that JSON escapes.
func TestChunkBytesUnchanged(t *testing.T) {
	asMap := func(p *response, ch map[string]any, usage any, withChoice bool) []byte {
		choices := []any{}
		if withChoice {
			choices = []any{ch}
		}
		m := map[string]any{"id": p.id, "object": p.object(), "created": p.created, "model": p.model, "choices": choices}
		if p.plan.includeUsage {
			m["usage"] = usage
		}
		b, err := json.Marshal(m)
		assert.NoError(t, err)
		return b
	}
	for _, chat := range []bool{false, true} {
		for _, usage := range []bool{false, true} {
			p := &response{id: "chatcmpl-x", model: "m<&>", created: 1700000000,
				plan: &plan{chat: chat, includeUsage: usage, req: &completionRequest{Stream: true}}}
			for _, text := range []string{"", "hé <b>&\"\\\n\u2028"} {
				for _, first := range []bool{false, true} {
					for _, finish := range []string{"", "length"} {
						ch := chunkChoice{Index: 2}
						m := map[string]any{"index": 2, "finish_reason": nil}
						if finish != "" {
							f := finish
							ch.FinishReason = &f
							m["finish_reason"] = finish
						}
						if chat {
							ch.Delta = &chunkDelta{Content: text}
							d := map[string]any{"content": text}
							if first {
								ch.Delta.Role = "assistant"
								d["role"] = "assistant"
							}
							m["delta"] = d
						} else {
							tx := text
							ch.Text = &tx
							m["text"] = text
						}
						assert.Equal(t, string(asMap(p, m, nil, true)), string(p.chunk([]chunkChoice{ch}, nil)))
					}
				}
			}
			u := map[string]any{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
			assert.Equal(t, string(asMap(p, nil, u, false)), string(p.chunk([]chunkChoice{}, u)))
		}
	}
}
