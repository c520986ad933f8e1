package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// streamContext is how many prompt tokens precede the first output token
// in the decoding window.
const streamContext = 5

// StreamDecoder detokenizes one output stream incrementally. It decodes a
// small window of recent ids: the ids whose text was already returned
// (the prefix, decoded for context) and the ids after them, and returns
// the text the latter add. The window restarts after each piece of text
// returned, so each call costs O(window), not O(stream).
type StreamDecoder struct {
	t       *Tokenizer
	skip    bool
	ids     []int // the window
	prefix  int   // ids[:prefix]: context whose text is not returned again
	read    int   // ids[:read]: ids whose text has been returned
	scratch []int
}

// NewStreamDecoder starts the incremental detokenization of one output
// stream, in the manner of the Hugging Face DecodeStream: it decodes a
// small window of ids with prefix and read offsets and returns only the
// new text. prompt is the prompt's ids; its last few tokens are the context
// the first output token is decoded against, so that a decoder that strips
// a leading space at the start of a sequence does not strip it from the
// first output token.
//
// Next returns the text that became complete with the given ids. It never
// returns part of a UTF-8 character: bytes of an incomplete character
// (from byte-fallback or byte-level tokens) are held back until complete;
// a U+FFFD that is text of its own is returned like any other character.
// With ctx the context taken from prompt (none for an empty prompt), the
// concatenation of every Next's result equals Decode(ctx+out) less its
// leading Decode(ctx), out being every output id, for every split of out
// into calls, whenever that decoding does not end with an incomplete
// character; for an empty prompt that is Decode(out) itself. The one
// exception: byte-fallback tokens that form an invalid UTF-8 sequence
// spanning a point where text was already returned (Decode replaces the
// whole run of bytes, text already returned cannot be taken back).
func (t *Tokenizer) NewStreamDecoder(skipSpecialTokens bool, prompt []int) *StreamDecoder {
	d := &StreamDecoder{t: t, skip: skipSpecialTokens}
	// The context: the last prompt ids that decoding keeps, ending where
	// their text is complete.
	var ctx []int
	for i := len(prompt) - 1; i >= 0 && len(ctx) < streamContext; i-- {
		if _, ok := t.decodeToken(prompt[i], skipSpecialTokens); ok {
			ctx = append(ctx, prompt[i])
		}
	}
	for i, j := 0, len(ctx)-1; i < j; i, j = i+1, j-1 {
		ctx[i], ctx[j] = ctx[j], ctx[i]
	}
	for len(ctx) > 0 {
		if _, pending := t.decode(ctx, skipSpecialTokens); !pending {
			break
		}
		ctx = ctx[:len(ctx)-1]
	}
	// Nor may it start inside a character (the prompt's last characters
	// coded as bytes, by byte-fallback or byte-level tokens): decoders that
	// reassemble bytes would take the orphan bytes and the output's first
	// bytes for one broken run, and give U+FFFD for the output's text.
	for len(ctx) > 0 && t.startsInsideCharacter(ctx[0], skipSpecialTokens) {
		ctx = ctx[1:]
	}
	d.ids = ctx
	d.read = len(ctx)
	return d
}

// Next adds output ids to the stream and returns the text they complete:
// all of it, up to the last id after which the text is complete, even when
// the ids after that one leave a character incomplete (they wait for the
// next call). So a stream that ends returns everything complete, whatever
// the size of its calls.
func (d *StreamDecoder) Next(ids ...int) string {
	for _, id := range ids {
		// Ids that decoding skips change nothing; leaving them out keeps
		// the window small.
		if _, ok := d.t.decodeToken(id, d.skip); ok {
			d.ids = append(d.ids, id)
		}
	}
	for end := len(d.ids); end > d.read; end-- {
		full, pending := d.t.decode(d.ids[d.prefix:end], d.skip)
		if !pending {
			return d.emit(full, end)
		}
	}
	return ""
}

// emit returns the text that full, the decoding of ids[prefix:end], adds to
// what was returned, and moves the window past end: the ids after end stay
// in it, to be decoded with what comes next.
func (d *StreamDecoder) emit(full string, end int) string {
	prev, _ := d.t.decode(d.ids[d.prefix:d.read], d.skip)
	var text string
	switch {
	case strings.HasPrefix(full, prev):
		text = full[len(prev):]
		if text == "" {
			// Nothing new: the returned text still covers the window.
			d.read = end
			return ""
		}
	case len(full) > len(prev):
		// The decoder rewrote text already returned, which cannot be
		// taken back: return what lies past it.
		k := len(prev)
		for k < len(full) && !utf8.RuneStart(full[k]) {
			k++
		}
		text = full[k:]
	default:
		return ""
	}
	// The text up to end is complete: the new prefix is what was just
	// decoded, and the window drops what lies before it.
	d.prefix, d.read = d.read, end
	if d.prefix > 0 {
		d.scratch = append(d.scratch[:0], d.ids[d.prefix:]...)
		d.ids, d.scratch = d.scratch, d.ids
		d.read -= d.prefix
		d.prefix = 0
	}
	return text
}

// startsInsideCharacter reports whether the text of id, decoded alone,
// starts with bytes that continue a character begun by an earlier token
// (decoded as U+FFFD when alone).
func (t *Tokenizer) startsInsideCharacter(id int, skip bool) bool {
	text, pending := t.decode([]int{id}, skip)
	return !pending && strings.HasPrefix(text, "\uFFFD")
}
