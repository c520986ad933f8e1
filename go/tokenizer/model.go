package tokenizer

import "errors"

// model turns a pre-tokenized piece into token ids, appended to out (w
// is not retained).
type model interface {
	tokenize(w []byte, out []int) ([]int, error)
	tokenToID(tok string) (int, bool)
	idToToken(id int) (string, bool)
	// size is the number of entries of the vocabulary (what new added
	// tokens are numbered from), maxID the highest id (-1 when empty).
	size() int
	maxID() int
}

// vocabulary maps tokens to ids and back.
type vocabulary struct {
	ids   map[string]uint32
	dense []string // id -> token, when the ids are dense enough
	has   []bool
	rev   map[uint32]string // otherwise
	max   int
}

func newVocabulary(v map[string]uint32) *vocabulary {
	voc := &vocabulary{ids: v, max: -1}
	for _, id := range v {
		voc.max = max(voc.max, int(id))
	}
	if voc.max < 2*len(v)+1024 {
		voc.dense = make([]string, voc.max+1)
		voc.has = make([]bool, voc.max+1)
		for tok, id := range v {
			// Two tokens with one id: keep one, deterministically.
			if !voc.has[id] || tok < voc.dense[id] {
				voc.dense[id], voc.has[id] = tok, true
			}
		}
	} else {
		voc.rev = make(map[uint32]string, len(v))
		for tok, id := range v {
			if old, ok := voc.rev[id]; !ok || tok < old {
				voc.rev[id] = tok
			}
		}
	}
	return voc
}

func (v *vocabulary) tokenToID(tok string) (int, bool) {
	id, ok := v.ids[tok]
	return int(id), ok
}

func (v *vocabulary) idToToken(id int) (string, bool) {
	if id < 0 || id > v.max {
		return "", false
	}
	if v.dense != nil {
		return v.dense[id], v.has[id]
	}
	s, ok := v.rev[uint32(id)]
	return s, ok
}

func (v *vocabulary) size() int  { return len(v.ids) }
func (v *vocabulary) maxID() int { return v.max }

var errMissingUnk = errors.New("unknown token, and the model's unk token is not in its vocabulary")
