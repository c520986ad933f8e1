package frontend

// Logprobs, as vLLM's OpenAI server answers them. The engine parameter
// logprobs (go/modelcard) asks each output token's log probability and k
// candidates at its position; workers whose card lists it send them with
// their tokens (go/tokens' Item), and the frontend writes them in OpenAI's
// two shapes:
//
//   - chat (logprobs: true, top_logprobs 0-20): choice.logprobs.content, one
//     {token, logprob, bytes, top_logprobs} per token, top_logprobs the first
//     top_logprobs candidates (the sampled token first, then by rank);
//   - completions (logprobs 0-20): choice.logprobs {tokens, token_logprobs,
//     top_logprobs, text_offset}, each top_logprobs a map of the first
//     logprobs+1 candidates' texts to their log probabilities, text_offset
//     each token's offset in the choice's text, in code points.
//
// A token's text is the token decoded alone (hfmodel's TokenText); log
// probabilities below -9999 are written as -9999 (as OpenAI and vLLM do).
// Streamed, each chunk carries the tokens read since the last one.

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// MaxLogprobs bounds top_logprobs (chat) and logprobs (completions): vLLM's
// default max_logprobs.
const MaxLogprobs = 20

// logprobsAsked is the number of candidates the request asks per token, or
// -1 when it asks no logprobs. Chat: logprobs true with top_logprobs (0 by
// default); completions: logprobs k.
func (p *plan) logprobsAsked() (int, error) {
	req := p.req
	raw := jsonscan.Trim(req.Logprobs)
	top := 0
	if req.TopLogprobs != nil {
		top = *req.TopLogprobs
	}
	if p.chat {
		var on bool
		if !jsonscan.IsNull(raw) && json.Unmarshal(raw, &on) != nil {
			return -1, invalid("logprobs", "invalid_logprobs", "logprobs must be true or false in the chat API")
		}
		if top < 0 || top > MaxLogprobs {
			return -1, invalid("top_logprobs", "invalid_logprobs", "top_logprobs must be between 0 and %d", MaxLogprobs)
		}
		if !on {
			if top > 0 {
				return -1, invalid("top_logprobs", "invalid_logprobs", "top_logprobs needs logprobs true")
			}
			return -1, nil
		}
		return top, nil
	}
	if req.TopLogprobs != nil {
		return -1, invalid("top_logprobs", "invalid_logprobs", "top_logprobs is a chat API field; the completions API asks logprobs: k")
	}
	if jsonscan.IsNull(raw) || string(raw) == "false" {
		return -1, nil
	}
	var k int
	if json.Unmarshal(raw, &k) != nil || k < 0 || k > MaxLogprobs {
		return -1, invalid("logprobs", "invalid_logprobs", "logprobs must be a number of candidates between 0 and %d", MaxLogprobs)
	}
	return k, nil
}

// tokenLogprob is one token's logprobs as a worker sent them.
type tokenLogprob struct {
	id         int
	logprob    float64
	none       bool // no logprob (a prompt's first token)
	candidates []tokens.Candidate
}

// logprobs collects a choice's tokens' logprobs.
type logprobs struct {
	k      int // candidates asked per token
	all    []tokenLogprob
	sent   int // streamed: the tokens whose logprobs went out
	offset int // completions, streamed: the text offset of the next token
	// prompt: echo's prompt tokens, whose logprobs come first (then nil).
	prompt []int
}

// add takes an item's logprobs (an item without them adds nothing): the
// prompt's first, when echo asked them and this item carries them.
func (l *logprobs) add(it workerItem) {
	if l.prompt != nil && len(it.PromptLogProbs) > 0 {
		for i, id := range l.prompt {
			t := tokenLogprob{id: id, none: true}
			if i < len(it.PromptLogProbs) && it.PromptLogProbs[i] != nil {
				t.logprob, t.none = *it.PromptLogProbs[i], false
			}
			if i < len(it.PromptTopLogprobs) {
				t.candidates = it.PromptTopLogprobs[i]
			}
			l.all = append(l.all, t)
		}
		l.prompt = nil
	}
	for i, id := range it.TokenIDs {
		if i >= len(it.LogProbs) {
			return
		}
		t := tokenLogprob{id: id, logprob: it.LogProbs[i]}
		if i < len(it.TopLogprobs) {
			t.candidates = it.TopLogprobs[i]
		}
		l.all = append(l.all, t)
	}
}

func clampLogprob(v float64) float64 { return max(v, -9999) }

type chatTop struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatToken struct {
	chatTop
	TopLogprobs []chatTop `json:"top_logprobs"`
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// chat is OpenAI's chat logprobs object of ts.
func (l *logprobs) chat(ts []tokenLogprob, tx text) map[string]any {
	content := make([]chatToken, len(ts))
	for i, t := range ts {
		s := tx.tokenText(t.id)
		content[i] = chatToken{chatTop: chatTop{Token: s, Logprob: clampLogprob(t.logprob), Bytes: bytesOf(s)}, TopLogprobs: []chatTop{}}
		for j, c := range t.candidates {
			if j >= l.k {
				break
			}
			cs := tx.tokenText(c.TokenID)
			content[i].TopLogprobs = append(content[i].TopLogprobs, chatTop{Token: cs, Logprob: clampLogprob(c.Logprob), Bytes: bytesOf(cs)})
		}
	}
	return map[string]any{"content": content}
}

// completion is OpenAI's completions logprobs object of ts, the first
// token's text starting at offset; it returns the offset after the last.
func (l *logprobs) completion(ts []tokenLogprob, tx text, offset int) (map[string]any, int) {
	toks := make([]string, len(ts))
	lps := make([]*float64, len(ts))
	tops := make([]map[string]float64, len(ts))
	offsets := make([]int, len(ts))
	for i, t := range ts {
		offsets[i] = offset
		if t.none { // vLLM's server: the token decoded, and nulls
			toks[i] = tx.detokenize([]int{t.id})
			offset += utf8.RuneCountInString(toks[i])
			continue
		}
		lp := clampLogprob(t.logprob)
		toks[i], lps[i] = tx.tokenText(t.id), &lp
		offset += utf8.RuneCountInString(toks[i])
		tops[i] = map[string]float64{}
		for j, c := range t.candidates {
			if j > l.k {
				break
			}
			tops[i][tx.tokenText(c.TokenID)] = clampLogprob(c.Logprob)
		}
	}
	return map[string]any{"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset
}

// object is the logprobs of the choice's tokens not yet written (all of
// them for a whole response), in the request's shape; nil when none are
// asked.
func (l *logprobs) object(chat bool, tx text) any {
	if l == nil {
		return nil
	}
	ts := l.all[l.sent:]
	l.sent = len(l.all)
	if chat {
		return l.chat(ts, tx)
	}
	obj, next := l.completion(ts, tx, l.offset)
	l.offset = next
	return obj
}
