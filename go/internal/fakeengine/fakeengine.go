// Package fakeengine is the stand-in engine of the tests, benchmarks and
// simulations that need a worker answering a frontend without a model: it
// continues a token request's sequence (the next token of a prompt of n
// tokens is n) with max_tokens tokens, the last one finished by "length".
// go/internal/planetest's Tokens handler and go/cmd/scalesim's workers
// both answer with it, so a benchmark's in-process workers and the
// simulation's answer alike. It imports no test package.
package fakeengine

import (
	"fmt"

	"github.com/dynamo-ctx/dynamo-ctx/go/tokens"
)

// TokenItem is the response item of the token at position k of the
// sequence: {"token_ids": [k], "finish_reason": finish}, finish null when
// "".
func TokenItem(k int, finish string) []byte {
	if finish == "" {
		return fmt.Appendf(nil, `{"token_ids":[%d],"finish_reason":null}`, k)
	}
	return fmt.Appendf(nil, `{"token_ids":[%d],"finish_reason":%q}`, k, finish)
}

// Items are the tokens at positions from, ..., from+n-1, the last one
// finished by finish.
func Items(from, n int, finish string) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		f := ""
		if i == n-1 {
			f = finish
		}
		out[i] = TokenItem(from+i, f)
	}
	return out
}

// Answer is the engine's whole answer to a token request's payload: the
// prompt continued by max_tokens tokens (none when the request sets no
// limit), the last one finished by "length". A payload it cannot read is
// an error, which a worker reports as a ValueError.
func Answer(payload []byte) ([][]byte, error) {
	p, err := tokens.ParseRequest(payload)
	if err != nil {
		return nil, err
	}
	return Items(len(p.TokenIDs), max(p.MaxTokens, 0), "length"), nil
}
