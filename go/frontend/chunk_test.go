package frontend

import (
	"encoding/json"
	"fmt"
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
			for _, text := range []string{"", "plain text", "hé <b>&\"\\\n\u2028", "\x00\x7f\xff\b\f"} {
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
						assert.Equal(t, string(p.chunk([]chunkChoice{ch}, nil)), string(p.appendChunk([]byte("x"), ch)[1:]))
					}
				}
			}
			u := map[string]any{"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
			assert.Equal(t, string(asMap(p, nil, u, false)), string(p.chunk([]chunkChoice{}, u)))
		}
	}
}

// The per-token encoding (appendChunk) gives encoding/json's bytes for any
// text and finish reason, chat or not, whatever the response's id and model.
func FuzzAppendChunkAgreesWithEncodingJSON(f *testing.F) {
	f.Add("hello", "length", "m", true, false, 0)
	f.Add("a\u2028<b>&\"\\\x00\xff", "", "mo<&>del\xfe", false, true, 3)
	f.Fuzz(func(t *testing.T, text, finish, model string, chat, first bool, index int) {
		p := &response{id: "cmpl-" + model, model: model, created: 1700000000,
			plan: &plan{chat: chat, includeUsage: first, req: &completionRequest{Stream: true}}}
		ch := chunkChoice{Index: index}
		if finish != "" {
			ch.FinishReason = &finish
		}
		if chat {
			ch.Delta = &chunkDelta{Content: text}
			if first {
				ch.Delta.Role = "assistant"
			}
		} else {
			ch.Text = &text
		}
		want := p.chunk([]chunkChoice{ch}, nil)
		assert.Equal(t, string(want), string(p.appendChunk(nil, ch)))
		assert.Equal(t, string(want), string(p.appendChunk(nil, ch)), "the second chunk of a response")
	})
}

func BenchmarkChunk(b *testing.B) {
	p := &response{id: "cmpl-0123456789", model: "mock-model", created: 1700000000,
		plan: &plan{req: &completionRequest{Stream: true}}}
	text := " w12"
	ch := chunkChoice{Text: &text}
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			_ = fmt.Appendf(nil, "data: %s\n\n", p.chunk([]chunkChoice{ch}, nil))
		}
	})
	b.Run("appendChunk", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf = append(buf[:0], "data: "...)
			buf = append(p.appendChunk(buf, ch), "\n\n"...)
		}
	})
}
