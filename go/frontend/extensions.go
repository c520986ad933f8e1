package frontend

// vLLM's extensions of the OpenAI request that users pass through the openai
// client's extra_body. None is ignored: each is honoured or refused.
//
//   - Engine parameters (go/modelcard's EngineParams: top_k, min_p,
//     repetition_penalty, min_tokens, logit_bias, allowed_token_ids,
//     bad_words) are checked against vLLM's ranges and sent in
//     sampling_options, to the workers whose model card lists them
//     (supports); a request that asks one the model's engine does not honour
//     is refused with 400 unsupported_parameter naming it. A neutral value
//     (top_k -1 or 0, min_p 0, repetition_penalty 1, min_tokens 0, an empty
//     list or map) asks nothing and is not sent.
//   - The frontend's own, since it makes the text: skip_special_tokens
//     (false: special tokens are text too), include_stop_str_in_output (the
//     stop string ends the text rather than being cut), and
//     spaces_between_special_tokens (true, or with skip_special_tokens true,
//     where it changes nothing; false with special tokens in the text is
//     refused).

import (
	"math"
	"strconv"

	"github.com/dynamo-ctx/dynamo-ctx/go/modelcard"
)

// Bounds of the extensions' lists: every worker request of the HTTP request
// (up to MaxChoices) carries them.
const (
	MaxLogitBias       = 1024
	MaxAllowedTokenIDs = 1024
	MaxBadWords        = 64
)

// Extensions are vLLM's extensions of a completions or chat request.
type Extensions struct {
	TopK                       *int               `json:"top_k"`
	MinP                       *float64           `json:"min_p"`
	RepetitionPenalty          *float64           `json:"repetition_penalty"`
	MinTokens                  *int               `json:"min_tokens"`
	LogitBias                  map[string]float64 `json:"logit_bias"`
	AllowedTokenIDs            []int              `json:"allowed_token_ids"`
	BadWords                   []string           `json:"bad_words"`
	StructuredOutputs          *structuredOutputs `json:"structured_outputs"`
	IncludeStopStrInOutput     bool               `json:"include_stop_str_in_output"`
	SkipSpecialTokens          *bool              `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens *bool              `json:"spaces_between_special_tokens"`
}

// engineParams checks the engine parameters the request asks (vLLM's
// ranges) and returns them as sampling_options entries, neutral ones left
// out. vocab is the model's vocabulary size (0: not known, no id check).
func (x *Extensions) engineParams(vocab int) (map[string]any, error) {
	out := map[string]any{}
	if v := x.TopK; v != nil && *v != -1 && *v != 0 {
		if *v < -1 {
			return nil, invalid("top_k", "invalid_top_k", "top_k must be -1 or 0 (disabled), or at least 1")
		}
		out["top_k"] = *v
	}
	if v := x.MinP; v != nil && *v != 0 {
		if math.IsNaN(*v) || *v < 0 || *v > 1 {
			return nil, invalid("min_p", "invalid_min_p", "min_p must be between 0 and 1")
		}
		out["min_p"] = *v
	}
	if v := x.RepetitionPenalty; v != nil && *v != 1 {
		if math.IsNaN(*v) || math.IsInf(*v, 0) || *v <= 0 {
			return nil, invalid("repetition_penalty", "invalid_repetition_penalty", "repetition_penalty must be a finite number greater than 0")
		}
		out["repetition_penalty"] = *v
	}
	if v := x.MinTokens; v != nil && *v != 0 {
		if *v < 0 {
			return nil, invalid("min_tokens", "invalid_min_tokens", "min_tokens must be 0 or more")
		}
		out["min_tokens"] = *v
	}
	idOK := func(id int) bool { return id >= 0 && (vocab == 0 || id < vocab) }
	if len(x.LogitBias) > 0 {
		if len(x.LogitBias) > MaxLogitBias {
			return nil, invalid("logit_bias", "invalid_logit_bias", "logit_bias may have at most %d tokens", MaxLogitBias)
		}
		bias := make(map[string]float64, len(x.LogitBias))
		for k, v := range x.LogitBias {
			id, err := strconv.Atoi(k)
			if err != nil || !idOK(id) || math.IsNaN(v) {
				return nil, invalid("logit_bias", "invalid_logit_bias", "logit_bias maps token ids of the model's vocabulary to numbers; %q is not one", k)
			}
			bias[strconv.Itoa(id)] = min(100, max(-100, v)) // as vLLM clamps it
		}
		out["logit_bias"] = bias
	}
	if len(x.AllowedTokenIDs) > 0 {
		if len(x.AllowedTokenIDs) > MaxAllowedTokenIDs {
			return nil, invalid("allowed_token_ids", "invalid_allowed_token_ids", "allowed_token_ids may have at most %d ids", MaxAllowedTokenIDs)
		}
		for _, id := range x.AllowedTokenIDs {
			if !idOK(id) {
				return nil, invalid("allowed_token_ids", "invalid_allowed_token_ids", "allowed_token_ids: %d is not a token id of the model's vocabulary", id)
			}
		}
		out["allowed_token_ids"] = x.AllowedTokenIDs
	}
	if len(x.BadWords) > 0 {
		if len(x.BadWords) > MaxBadWords {
			return nil, invalid("bad_words", "invalid_bad_words", "bad_words may have at most %d words", MaxBadWords)
		}
		for _, w := range x.BadWords {
			if w == "" || len(w) > MaxStopLen {
				return nil, invalid("bad_words", "invalid_bad_words", "a bad word must have 1 to %d bytes", MaxStopLen)
			}
		}
		out["bad_words"] = x.BadWords
	}
	return out, nil
}

// checkHonoured refuses the engine parameters asked that an instance the
// request may go to (cards) does not honour; from names the request field
// that asked one, where it is not the parameter's own name.
func checkHonoured(model string, asked map[string]any, from map[string]string, cards []modelcard.Card) error {
	for _, name := range modelcard.EngineParams {
		if _, ok := asked[name]; !ok {
			continue
		}
		param := name
		if f, ok := from[name]; ok {
			param = f
		}
		for _, c := range cards {
			if !c.Honours(name) {
				return invalid(param, "unsupported_parameter",
					"%s is not supported by the engine of model %q: its workers' model cards do not list %s", param, model, name)
			}
		}
	}
	return nil
}

// skipSpecial: whether special tokens are left out of the text (vLLM's
// default), and an error for spaces_between_special_tokens false where it
// would matter.
func (x *Extensions) skipSpecial() (bool, error) {
	skip := x.SkipSpecialTokens == nil || *x.SkipSpecialTokens
	if !skip && x.SpacesBetweenSpecialTokens != nil && !*x.SpacesBetweenSpecialTokens {
		return false, invalid("spaces_between_special_tokens", "unsupported_parameter",
			"spaces_between_special_tokens false with skip_special_tokens false is not supported: the frontend decodes special tokens as the tokenizer does")
	}
	return skip, nil
}

// minTokensFits refuses min_tokens above a choice's max_tokens (vLLM's rule).
func (x *Extensions) minTokensFits(budget int) error {
	if x.MinTokens != nil && *x.MinTokens > budget {
		return invalid("min_tokens", "invalid_min_tokens", "min_tokens must be at most max_tokens (%d)", budget)
	}
	return nil
}

// minTokens is the request's min_tokens (0: none).
func (p *plan) minTokens() int {
	if v := p.req.MinTokens; v != nil && *v > 0 {
		return *v
	}
	return 0
}
