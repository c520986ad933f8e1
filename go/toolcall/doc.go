// Package toolcall parses tool calls out of a model's output as vLLM 0.32's
// OpenAI chat server does with --enable-auto-tool-choice and
// --tool-call-parser NAME, for tool_choice "auto" (or absent).
//
// # Parsers
//
//   - hermes (Hermes2ProToolParser): JSON objects {"name", "arguments"}
//     between <tool_call> and </tool_call>. Non-streamed, every region must
//     decode (json.loads) to an object with a string "name" and an
//     "arguments" key, else the whole output is content; arguments are
//     re-serialized as Python's json.dumps(ensure_ascii=False) writes them
//     (", " and ": " separators, repr floats, unicode kept). Streamed, the
//     text before the first <tool_call> is content (a suffix that may begin
//     the tag is held back); a call opens when `"name": "..."` has appeared,
//     and its arguments are the raw text after `"arguments":` (less the
//     call's closing brace once the region is complete JSON), sent as it
//     grows. KeepSpecialTokens is true.
//   - llama3_json (Llama3JsonToolParser): one JSON object, or several joined
//     by "; ", optionally after <|python_tag|>, with "parameters" or
//     "arguments". Non-streamed, every '{' not inside an earlier object
//     starts a raw_decode; any failure makes the whole output content.
//     Streamed, only an output that starts with '{' or <|python_tag|> is
//     parsed (otherwise each piece is content); it is read with a port of
//     partial_json_parser 0.2.1.1.post7 (fix_fast, quirks included) and the
//     arguments are streamed as vLLM diffs successive json.dumps. vLLM's
//     adjust_request keeps skip_special_tokens for this parser, so
//     KeepSpecialTokens is false and a special <|python_tag|> never reaches
//     the parser; New still requires the token in the vocabulary, as vLLM.
//   - deepseek_v3 (DeepSeekV3ToolParser): <｜tool▁calls▁begin｜> then
//     <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//     per call. Arguments are the raw ARGS line. Streaming is driven by the
//     token ids (the begin/end tokens counted in the ids so far), exactly as
//     vLLM's. KeepSpecialTokens is false (the tokens are not special in
//     DeepSeek's vocabulary).
//   - mistral (MistralToolParser, in 0.32 vllm/parser/mistral.py run through
//     the parser engine's tool adapter), for Hugging Face tokenizers. New
//     requires [TOOL_CALLS] in the vocabulary; KeepSpecialTokens is true.
//     Which format it reads depends on the vocabulary, as vLLM's:
//     Without [ARGS] (tokenizers before v11, e.g. Mistral 7B v0.3, Nemo):
//     content, [TOOL_CALLS], then a JSON array of {"name", "arguments"}
//     objects (or one bare object). Non-streamed, the first non-blank
//     segment after a [TOOL_CALLS] is raw_decoded (else the text from its
//     first "[{" to its last "}]" is json.loads'ed); entries that are not
//     objects with a name or arguments are skipped, a non-string name is
//     "", missing or null arguments are "{}", string arguments are kept and
//     others json.dumps'ed. With no call found the content is that segment.
//     Streamed, the text before the first [TOOL_CALLS] is content as it
//     comes; after it each piece is split at the characters where the
//     state may change and fed to ijson (yajl.go models its yajl2_c
//     backend: events as yajl completes tokens, failure on invalid JSON
//     and on every later piece); a call opens with its first name or
//     arguments, the arguments are the raw text of the object (its first
//     piece left-stripped) or a string argument's value; once the array or
//     bare object closes, the rest is content. A piece whose JSON fails
//     sends nothing (vLLM logs the exception and returns None).
//     With [ARGS] (tokenizers v11+): [TOOL_CALLS]NAME[ARGS]{...} per call
//     (or NAME{...}), run by vLLM's parser engine (mistral_engine.go,
//     mistral_events.go): special tokens are terminals by their ids once
//     any id has been seen (their text alone is then content), a suffix
//     that may begin a terminal is held back, as is a closing brace that
//     ends the arguments; the name goes out with the arguments' first
//     character, text after the arguments' JSON streams as arguments.
//     Non-streamed, the arguments are the first JSON value after the name
//     (else the stripped text), corrected to the tool schema's types
//     (_fix_arg_types, coerce.go). The end of the stream (finish_streaming)
//     can release held-back text and arguments or name a call: FinalDelta
//     carries it (see Finish).
//
// # Server behaviour matched
//
// Extract is the non-streamed path: when the parser reports a call, the
// content is its content, nil when empty or all whitespace, and the calls
// are its calls; otherwise the content is the text as is (for mistral,
// which vLLM runs as an engine-based parser, the parser's content, nil
// when empty).
//
// Next is one Parser.parse_delta step (previous text and ids accumulated,
// no reasoning parser): ok false is the parser's None. The delta's Content
// may be a non-nil empty string, which vLLM sends as "content": "".
// Finish/FinalDelta are finalize_generation: only when the final step's
// delta carries tool calls, the rest of the last parsed call's arguments
// (get_remaining_unstreamed_args) is appended to that delta's last call.
// Called is the server's tools_streamed; see its doc for the finish_reason
// rule.
//
// Texts are read as Python strings: indexes and lengths count code points,
// whitespace is str.isspace, and invalid UTF-8 is read as U+FFFD per bad
// byte.
//
// # Known differences
//
//   - A JSON "\ud800"-style lone surrogate escape decodes to U+FFFD (a Python
//     str keeps the surrogate, which then cannot be sent as UTF-8).
//   - Python raises RecursionError on deep nesting at a depth that depends on
//     its stack; here nesting deeper than 900 fails to decode. Either way the
//     step yields nothing or the output is content.
//   - tool_choice "none", "required" and a named function use vLLM's generic
//     paths, not these parsers; they are the frontend's. So is
//     parallel_tool_calls=false (vLLM drops deltas with index > 0).
//   - Tool call ids are the frontend's (CallDelta.Opens marks where vLLM
//     adds one; mistral's are 9 random alphanumerics).
//   - mistral without [ARGS], tool_choice "required" or a named function:
//     vLLM guides the model to a bare JSON array and then also reads one
//     without [TOOL_CALLS] (Options carries no tool_choice; the frontend
//     reads these outputs as for auto).
//   - mistral: ijson raises on a \uXXXX lone low surrogate and yajl writes
//     '?' for a lone high one, as here; a lone surrogate in the text
//     itself cannot occur (the text is UTF-8).
//   - mistral with [ARGS]: vLLM decodes each token id alone to place the
//     special tokens in a piece's text; here they are found in the text
//     from the right (vLLM's own fallback), which differs only if a piece
//     also spells a marker in plain text after it. The dropped special
//     tokens are <s>, </s> and <unk> when in the vocabulary (vLLM: the
//     tokenizer's all_special_tokens, which is these for Mistral's
//     tokenizers). Token counts (for reasoning-token usage) are not kept.
//     Schema coercion reads int/float numerals in ASCII only (Python's
//     int() and float() also take other Unicode digits).
package toolcall
