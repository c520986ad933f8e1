package tokenizer

import (
	"encoding/json"
	"strings"
)

type wordPieceDecoder struct {
	prefix  string
	cleanup bool
}

// parseWordPieceDecoder parses a "WordPiece" decoder.
func parseWordPieceDecoder(kind string, raw json.RawMessage) (decoder, error) {
	var v struct {
		Prefix  *string `json:"prefix"`
		Cleanup *bool   `json:"cleanup"`
	}
	if err := decodeInto(kind, raw, &v); err != nil || v.Prefix == nil || v.Cleanup == nil {
		return nil, orMissing(err, kind, "prefix/cleanup")
	}
	return wordPieceDecoder{*v.Prefix, *v.Cleanup}, nil
}

var cleanupReplacer = []struct{ from, to string }{
	{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
	{" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
}

// cleanupText is the WordPiece decoder's cleanup, which the CTC decoder's
// applies too.
func cleanupText(s string) string {
	for _, r := range cleanupReplacer {
		s = strings.ReplaceAll(s, r.from, r.to)
	}
	return s
}

func (d wordPieceDecoder) decodeChain(toks []string, _ *bool) []string {
	return mapTokens(toks, func(i int, t string) string {
		if i != 0 {
			if rest, ok := strings.CutPrefix(t, d.prefix); ok {
				t = rest
			} else {
				t = " " + t
			}
		}
		if d.cleanup {
			t = cleanupText(t)
		}
		return t
	})
}
