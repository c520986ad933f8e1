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
//
// mistral is not implemented: in vLLM 0.32 it is an engine-based parser
// (vllm/parser/mistral.py) whose pre-v11 path streams through ijson events;
// New refuses the name.
//
// # Server behaviour matched
//
// Extract is the non-streamed path: when the parser reports a call, the
// content is its content, nil when empty or all whitespace, and the calls
// are its calls; otherwise the content is the text as is.
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
//     adds one).
package toolcall
