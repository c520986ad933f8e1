package tokenizer

import "encoding/json"

type replaceNormalizer struct {
	m       matcher
	content string
}

// parseReplaceNormalizer parses a "Replace" normalizer.
func parseReplaceNormalizer(kind string, raw json.RawMessage) (normalizer, error) {
	m, content, err := parseReplace(kind, raw)
	if err != nil {
		return nil, err
	}
	return replaceNormalizer{m, content}, nil
}

// parseReplace parses a Replace normalizer or decoder.
func parseReplace(kind string, raw json.RawMessage) (matcher, string, error) {
	var v struct {
		Pattern *patternJSON `json:"pattern"`
		Content *string      `json:"content"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Content == nil {
		return nil, "", orMissing(err, kind, "content")
	}
	m, err := v.Pattern.matcher(kind)
	return m, *v.Content, err
}

func (n replaceNormalizer) normalize(s string) (string, error) {
	return replaceAll(s, n.m, n.content)
}

func replaceAll(s string, m matcher, content string) (string, error) {
	if s == "" {
		return s, nil
	}
	var b []byte
	last := 0
	err := m.findAll(s, func(st, en int) error {
		if b == nil {
			b = make([]byte, 0, len(s)+len(content))
		}
		b = append(b, s[last:st]...)
		b = append(b, content...)
		last = en
		return nil
	})
	if err != nil || b == nil {
		return s, err
	}
	b = append(b, s[last:]...)
	return string(b), nil
}
