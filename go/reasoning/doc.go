// Package reasoning splits a chat completion's reasoning (<think>...</think>)
// from its content exactly as vLLM 0.32's OpenAI server does with
// --reasoning-parser deepseek_r1 or qwen3, non-streamed and streamed. The
// response field vLLM 0.32 fills is "reasoning" (on the message and on each
// streamed delta; "reasoning_content" is only an older name it still reads
// in requests).
//
// # What is matched
//
// Non-streamed, the server gives the parser's extract_reasoning the whole
// output text (Extract); the prompt plays no part. Streamed, it runs
// Parser.parse_delta for every piece with the reasoning parser and no tool
// parser: Next, and Final for the piece that carries the finish reason.
// Both were checked step by step against vLLM's own code (testdata/gen.py
// runs it with Qwen3's and DeepSeek's real tokenizers and vLLM's incremental
// detokenizer).
//
// The prompt: on the first streamed piece the server asks is_reasoning_end of
// the prompt's ids (IsReasoningEnd); when it says the reasoning is over (for
// deepseek_r1: the last <think> or </think> in the prompt is </think>; for
// qwen3 with thinking off: always), every piece passes through as content
// and Ended is true from the start. A template that opened <think> in the
// generation prompt needs nothing more: deepseek_r1 reads output without
// <think> as reasoning until </think>, qwen3 starts in reasoning.
//
// deepseek_r1 works on token ids: a piece that is only <think> or only
// </think> gives no delta (ok false); reasoning ends at the piece holding
// the </think> id (its text is cut at "</think>", content null when empty).
// Non-streamed it cuts the text at the first "<think>" and "</think>" as
// text, so a tag typed as plain tokens splits there but not in a stream, as
// in vLLM. New fails when the vocabulary lacks either token.
//
// qwen3 is vLLM's parser engine for the Qwen3 grammar with tool-call
// parsing skipped. enable_thinking (chat_template_kwargs, absent = true,
// Python truthiness; JSON null is false) decides: off, Extract gives all
// the text as content and no reasoning, and a stream is all content. On,
// the output is reasoning from its first token; a <think> in it is dropped,
// </think> or a <tool_call> ends it (the <tool_call> stays in the content),
// a second </think> after it is dropped (non-streamed, or within the same
// streamed piece: later pieces pass through whole), and the tokenizer's
// special tokens
// (Options.SpecialTokens) are dropped. Streamed, the markers count only
// by token id; text that may be the start of a marker ("<", "</thi") is
// held back until the next piece tells, and flushed by Final. The server
// detokenizes a qwen3 request with skip_special_tokens=false (the parser's
// adjust_request), so the pieces carry "<think>" and "</think>"; for
// deepseek_r1 it keeps vLLM's default true, and "<think>" still shows,
// being an added but not special token in these tokenizers. The stop token
// is not detokenized: its piece has empty text.
//
// Ended is the stream's reasoning_ended: from then on the server hands the
// text to the tool-call parser (the content of the piece that ended the
// reasoning, then each piece's text as it is) and no longer asks the
// reasoning parser. Non-streamed, the tool-call parser gets Extract's content.
// The frontend must pass as Vars the effective chat_template_kwargs: the
// request's, plus enable_thinking = (reasoning_effort != "none") when the
// request set reasoning_effort and not enable_thinking, over the server's
// default kwargs.
//
// Keys says which keys vLLM's delta sets, for a byte-equal chunk: deepseek_r1
// sets "content": null beside the reasoning of the piece that ends it.
// CountReasoningTokens is the usage's reasoning_tokens. With
// include_reasoning=false vLLM drops the reasoning and the deltas left
// empty; that is the frontend's to do.
//
// # Known differences
//
// The qwen3 engine decodes each token id to place markers in a piece of
// several tokens; this package has no decoder, so in such a piece it splits
// the text at the markers' own text (vLLM's fallback path). The split only
// differs when a piece holds a marker token and the same marker typed as
// text after it. For the same reason the streamed qwen3 reasoning-token
// count may differ by the tokens whose own decoding is empty, and the
// non-streamed one is counted from the ids alone (tokens before the first
// </think> or <tool_call>, markers and special tokens left out). Pieces of a
// stream whose marker text never arrives are kept, as vLLM keeps them,
// until it does or the stream ends.
package reasoning
