// Package anchorsplit places a stream step's marker tokens in the step's text,
// as vLLM's token-id scanners rebuild a step from its anchors: the reasoning
// parsers' (go/reasoning) and the Mistral tool-call parser's (go/toolcall).
package anchorsplit

import "strings"

// Part is one piece of a step's text, in order: the anchor Index itself, or
// (Anchor false) Text, the content just before anchor Index (Index is the
// number of anchors for the content after the last one placed).
type Part struct {
	Index  int
	Anchor bool
	Text   string
}

// Split places anchors (their texts, in the order their tokens came) in
// text. Each is found right to left, at its last occurrence before the
// next one's, which is where it is whenever the detokenized pieces agree
// with the text. What it returns:
//   - parts: the content and the anchors that were found, in order;
//   - deferred: the anchors not found (they wait for text of a later step),
//     by index, in order;
//   - post: the text after the last anchor found that belongs after a
//     deferred anchor rather than before it (unless drop says that anchor
//     is dropped with its text), which is then no content of this step.
func Split(text string, anchors []string, drop func(i int) bool) (parts []Part, deferred []int, post string) {
	pos := make([]int, len(anchors))
	end := len(text)
	for i := len(anchors) - 1; i >= 0; i-- {
		pos[i] = strings.LastIndex(text[:end], anchors[i])
		if pos[i] >= 0 {
			end = pos[i]
		}
	}
	used := 0
	for i, a := range anchors {
		if pos[i] >= used {
			if pos[i] > used {
				parts = append(parts, Part{Index: i, Text: text[used:pos[i]]})
			}
			parts = append(parts, Part{Index: i, Anchor: true})
			used = pos[i] + len(a)
			continue
		}
		later := false
		for _, p := range pos[i+1:] {
			later = later || p >= 0
		}
		if !later && used < len(text) && !drop(i) {
			post = text[used:]
			used = len(text)
		}
		deferred = append(deferred, i)
	}
	if used < len(text) {
		parts = append(parts, Part{Index: len(anchors), Text: text[used:]})
	}
	return parts, deferred, post
}
