package tokenizer

import (
	"encoding/json"
	"fmt"
)

type templatePiece struct {
	seq bool  // the sequence itself
	ids []int // else a special token's ids
}

type templatePost []templatePiece

func parseTemplate(kind string, raw json.RawMessage) (postProcessor, error) {
	type pieceJSON struct {
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
	}
	var v struct {
		Single        *[]pieceJSON `json:"single"`
		Pair          *[]pieceJSON `json:"pair"`
		SpecialTokens *map[string]struct {
			ID     string   `json:"id"`
			IDs    []uint32 `json:"ids"`
			Tokens []string `json:"tokens"`
		} `json:"special_tokens"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Single == nil || v.Pair == nil || v.SpecialTokens == nil {
		return nil, orMissing(err, kind, "single/pair/special_tokens")
	}
	var t templatePost
	for _, p := range *v.Single {
		switch {
		case p.Sequence != nil && p.SpecialToken == nil:
			if p.Sequence.ID != "A" {
				return nil, fmt.Errorf("%s: the single template uses sequence %q", kind, p.Sequence.ID)
			}
			t = append(t, templatePiece{seq: true})
		case p.SpecialToken != nil && p.Sequence == nil:
			st, ok := (*v.SpecialTokens)[p.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("%s: missing special token %q", kind, p.SpecialToken.ID)
			}
			if len(st.IDs) != len(st.Tokens) {
				return nil, fmt.Errorf("%s: special token %q: ids and tokens differ in length", kind, p.SpecialToken.ID)
			}
			ids := make([]int, len(st.IDs))
			for i, id := range st.IDs {
				ids[i] = int(id)
			}
			t = append(t, templatePiece{ids: ids})
		default:
			return nil, fmt.Errorf("%s: template pieces must be {\"Sequence\": ...} or {\"SpecialToken\": ...}", kind)
		}
	}
	return t, nil
}

func (t templatePost) process(ids []int, addSpecial bool) []int {
	if len(t) == 1 && t[0].seq {
		return ids
	}
	out := make([]int, 0, len(ids)+t.added())
	for _, p := range t {
		switch {
		case p.seq:
			out = append(out, ids...)
		case addSpecial:
			out = append(out, p.ids...)
		}
	}
	return out
}

func (t templatePost) added() int {
	n := 0
	for _, p := range t {
		n += len(p.ids)
	}
	return n
}
