package frontend

// POST /tokenize and POST /detokenize, answered as vLLM's OpenAI server
// answers them, for clients that count tokens before they send a request:
//
//   - /tokenize takes a completions prompt ({"prompt": "...",
//     "add_special_tokens": true}) or a conversation ({"messages": [...],
//     add_generation_prompt, continue_final_message, chat_template_kwargs,
//     tools, "add_special_tokens": false}, its tools and tool calls read
//     as in the chat API, chattools.go) and answers {"count",
//     "max_model_len", "tokens", "token_strs"} (token_strs: the
//     vocabulary's strings when "return_token_strs" is true, else null).
//   - /detokenize takes {"tokens": [...]} and answers {"prompt": text}, the
//     special tokens included.
//
// "model" may be left out when the frontend serves one model. The text is
// the model's own (text.go): the same tokens a completions or chat request
// would send to its workers.

import (
	"encoding/json"
	"net/http"

	"github.com/dynamo-ctx/dynamo-ctx/go/jsonscan"
)

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int    `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

type detokenizeResponse struct {
	Prompt string `json:"prompt"`
}

func (f *Frontend) tokenize(w http.ResponseWriter, r *http.Request) {
	req, tx, limit, ok := f.textRequest(w, r)
	if !ok {
		return
	}
	ids, err := tokenizeIDs(req, tx)
	if err != nil {
		refuse(w, err)
		return
	}
	out := tokenizeResponse{Count: len(ids), MaxModelLen: limit, Tokens: ids}
	if req.ReturnTokenStrs {
		out.TokenStrs = tx.tokenStrings(ids)
	}
	writeJSON(w, out)
}

// tokenizeIDs are the tokens of /tokenize's prompt or conversation.
func tokenizeIDs(req *completionRequest, tx text) ([]int, error) {
	if !jsonscan.IsNull(req.Prompt) {
		var s string
		if err := json.Unmarshal(req.Prompt, &s); err != nil {
			return nil, invalid("prompt", "invalid_prompt", "prompt must be a string")
		}
		return encodeAll(tx, s, req.addSpecialTokens(false))
	}
	if req.Messages == nil {
		return nil, invalid("prompt", "invalid_prompt", "either prompt (a string) or messages is required")
	}
	if err := checkChatOptions(req); err != nil {
		return nil, err
	}
	s, err := renderChat(req, tx)
	if err != nil {
		return nil, err
	}
	return encodeAll(tx, s, req.addSpecialTokens(true))
}

func encodeAll(tx text, s string, addSpecial bool) ([]int, error) {
	ids, err := tx.encode(s, addSpecial)
	if err != nil {
		return nil, invalid("prompt", "invalid_prompt", "the prompt could not be tokenized: %s", err.Error())
	}
	if ids == nil {
		ids = []int{}
	}
	return ids, nil
}

func (f *Frontend) detokenize(w http.ResponseWriter, r *http.Request) {
	req, tx, _, ok := f.textRequest(w, r)
	if !ok {
		return
	}
	if req.Tokens == nil {
		badRequest(w, "tokens (an array of token ids) is required", "tokens", "invalid_prompt")
		return
	}
	ids := make([]int, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 {
			badRequest(w, "token ids must be non-negative", "tokens", "invalid_prompt")
			return
		}
		ids[i] = int(id)
	}
	writeJSON(w, detokenizeResponse{Prompt: tx.detokenize(ids)})
}

// textRequest reads a /tokenize or /detokenize request and finds its
// model's text and context length. A request it refuses is answered, and
// ok is false.
func (f *Frontend) textRequest(w http.ResponseWriter, r *http.Request) (req *completionRequest, tx text, limit int, ok bool) {
	req, ok = f.readBody(w, r, http.NewResponseController(w))
	if !ok {
		return nil, nil, 0, false
	}
	if req.Model == "" {
		names := f.modelNames()
		if len(names) != 1 {
			badRequest(w, "model is required when the frontend serves other than one model", "model", "missing_model")
			return nil, nil, 0, false
		}
		req.Model = names[0]
	}
	if tx, _, ok = f.textFor(w, req.Model); !ok {
		return nil, nil, 0, false
	}
	return req, tx, f.maxModelLen(req.Model), true
}
