package tokenizer

import "encoding/json"

type wordLevelModel struct {
	*vocabulary
	unk string
}

// parseWordLevelModel parses a "WordLevel" model.
func parseWordLevelModel(kind string, raw json.RawMessage) (model, error) {
	var v struct {
		Vocab *map[string]uint32 `json:"vocab"`
		Unk   *string            `json:"unk_token"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Vocab == nil || v.Unk == nil {
		return nil, orMissing(err, kind, "vocab/unk_token")
	}
	return &wordLevelModel{vocabulary: newVocabulary(*v.Vocab), unk: *v.Unk}, nil
}

func (m *wordLevelModel) tokenize(s []byte, out []int) ([]int, error) {
	if id, ok := m.ids[string(s)]; ok {
		return append(out, int(id)), nil
	}
	if id, ok := m.ids[m.unk]; ok {
		return append(out, int(id)), nil
	}
	return out, errMissingUnk
}
