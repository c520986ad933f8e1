"""Model outputs the vectors are generated from (see gen.py)."""

W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
S = '{"name": "search", "arguments": {"q": "caf\u00e9 \\"best\\" \u6771\u4eac \U0001f642", "f": {"tags": ["a", {"deep": [1, 2.5, null, true, {"x": {"y": []}}]}], "n": -3}}}'
NUM = '{"name": "calc", "arguments": {"a": 1.0, "b": 1e5, "c": -0, "d": 12345678901234567890, "e": 0.1, "f": 1E-7, "g": 2.50, "h": "\\u00e9\\n\\t\\\\"}}'

HERMES = [
    ("no_calls", "Hello! How can I help you today?"),
    ("one_call", f"<tool_call>\n{W}\n</tool_call>"),
    ("two_calls", f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{S}\n</tool_call>"),
    ("nested_unicode", f"<tool_call>\n{S}\n</tool_call>"),
    ("numbers", f"<tool_call>\n{NUM}\n</tool_call>"),
    ("text_before", f"Let me check that for you.\n<tool_call>\n{W}\n</tool_call>"),
    ("text_after", f"<tool_call>\n{W}\n</tool_call>\nDone."),
    ("cut_off", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),
    ("cut_after_name", '<tool_call>\n{"name": "get_weather", "argu'),
    ("malformed", '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'),
    ("missing_arguments", '<tool_call>\n{"name": "ping"}\n</tool_call>'),
    ("empty_arguments", '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'),
    ("args_first", '<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>'),
    ("no_end_tag", f"<tool_call>\n{W}"),
    ("partial_tag_text", "a < b and <tool is not <tool_call"),
    ("lt_in_text", "x <t y <tool_ z"),
    ("string_args", '<tool_call>\n{"name": "echo", "arguments": "raw text"}\n</tool_call>'),
    ("empty_call", "<tool_call></tool_call>"),
    ("space_only_before", f"  \n<tool_call>\n{W}\n</tool_call>"),
]

LLAMA = [
    ("no_calls", "The weather in Paris is sunny."),
    ("one_call", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}'),
    ("arguments_key", W),
    ("two_calls", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_weather", "parameters": {"city": "Rome"}}'),
    ("three_calls", '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}; {"name": "c", "parameters": {"y": [1, 2]}}'),
    ("nested_unicode", S),
    ("numbers", NUM),
    ("text_before", 'Sure, calling it: {"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("cut_off", '{"name": "get_weather", "parameters": {"city": "Par'),
    ("cut_in_number", '{"name": "calc", "parameters": {"a": 12'),
    ("malformed", '{"name": "get_weather", "parameters": {"city": Paris}}'),
    ("missing_name", '{"parameters": {"city": "Paris"}}'),
    ("both_keys", '{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 2}}'),
    ("empty_params", '{"name": "ping", "parameters": {}}'),
    ("string_param", '{"name": "echo", "parameters": {"text": "line1\\nline2 \\"q\\""}}'),
    ("trailing_text", '{"name": "get_weather", "parameters": {"city": "Paris"}} thanks'),
    ("python_tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("array_value", '{"name": "sum", "parameters": {"xs": [1, 2, 3], "ok": false}}'),
]

LLAMA_TAGGED = [
    ("python_tag", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("python_tag_two", '<|python_tag|>{"name": "a", "parameters": {"x": "1"}}; {"name": "b", "parameters": {"y": 2}}'),
    ("python_tag_cut", '<|python_tag|>{"name": "get_weather", "parameters": {"ci'),
    ("python_tag_text", "<|python_tag|>print('hi')"),
]

DS_B, DS_E = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
DC_B, DC_E = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"


def ds_call(name, args, typ="function"):
    return f"{DC_B}{typ}{SEP}{name}\n```json\n{args}\n```{DC_E}"


DEEPSEEK = [
    ("no_calls", "The weather in Paris is sunny."),
    ("one_call", DS_B + ds_call("get_weather", '{"city": "Paris", "unit": "celsius"}') + DS_E),
    ("two_calls", DS_B + ds_call("get_weather", '{"city": "Paris"}') + "\n" + ds_call("get_weather", '{"city": "Rome"}') + DS_E),
    ("text_before", "Let me look.\n\n" + DS_B + ds_call("get_weather", '{"city": "Paris"}') + DS_E),
    ("nested_unicode", DS_B + ds_call("search", '{"q": "caf\u00e9 \\"best\\" \u6771\u4eac", "f": {"tags": ["a", {"deep": [1, null]}]}}') + DS_E),
    ("cut_off", DS_B + DC_B + "function" + SEP + 'get_weather\n```json\n{"city": "Par'),
    ("malformed", DS_B + ds_call("get_weather", '{"city": Paris}') + DS_E),
    ("bad_type", DS_B + ds_call("get_weather", '{"city": "Paris"}', "tool") + DS_E),
    ("no_newline", DS_B + DC_B + "function" + SEP + 'get_weather```json{"city": "Paris"}```' + DC_E + DS_E),
    ("empty_args", DS_B + ds_call("ping", "{}") + DS_E),
    ("text_after", DS_B + ds_call("get_weather", '{"city": "Paris"}') + DS_E + " ok"),
]

# Texts whose every prefix is read by vLLM's partial_json_loads (the
# llama3_json streaming reader), with and without partial strings.
PARTIAL = [
    '{"name": "f", "parameters": {"a": [1, -2.5e+3, "x\\"y", {"b": null}], "c": true, "d": "\\u00e9\\ud83d\\ude42"}}',
    '{"name": "g", "arguments": {"s": "a,b:c", "n": [1, 2, [3, [4]]], "e": {}}}; {"name": "h", "parameters": {}}',
    '[{"name": "f"}, "k", 12, false, NaN, -Infinity]',
    '{"a" : { "b" : [ "c" , 1.0 ] } , "k": "v\\\\"}',
    '"just a string", 1',
    '{"x": 1} trailing',
    '{"x": -}',
    '  {"x": 1}',
]

TC, ARGS = "[TOOL_CALLS]", "[ARGS]"
MW = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'

# Mistral before tokenizer v11: [TOOL_CALLS] then a JSON array of calls.
MISTRAL = [
    ("no_calls", "Hello! How can I help you today?"),
    ("one_call", f"{TC}[{MW}]"),
    ("two_calls", f'{TC}[{MW}, {{"name": "search", "arguments": {{"q": "caf\u00e9 \\"b\\" \u6771 \U0001f642", "f": [1, {{"x": null}}]}}}}]'),
    ("bare_object", f"{TC}{MW}"),
    ("numbers", f'{TC}[{{"name": "calc", "arguments": {{"a": 1.0, "b": -1e5, "c": true, "h": "\\u00e9\\n"}}}}]'),
    ("text_before", f"Let me check that.{TC}[{MW}]"),
    ("text_after", f"{TC}[{MW}] Done."),
    ("space_after_token", f"{TC} [{MW}]"),
    ("space_only_before", f"  \n{TC}[{MW}]"),
    ("string_args", f'{TC}[{{"name": "echo", "arguments": "{{\\"a\\": 1}}"}}]'),
    ("args_first", f'{TC}[{{"arguments": {{"city": "Oslo"}}, "name": "get_weather"}}]'),
    ("missing_arguments", f'{TC}[{{"name": "ping"}}]'),
    ("empty_arguments", f'{TC}[{{"name": "ping", "arguments": {{}}}}]'),
    ("nested_args", f'{TC}[{{"name": "f", "arguments": {{"a": {{"b": [1, {{"c": "}}"}}]}}, "d": "x,y"}}}}]'),
    ("cut_off", f'{TC}[{{"name": "get_weather", "arguments": {{"city": "Par'),
    ("cut_after_name", f'{TC}[{{"name": "get_weather", "argu'),
    ("malformed", f'{TC}[{{"name": "get_weather", "arguments": {{"city": Paris}}}}]'),
    ("not_json", f"{TC}hello there"),
    ("not_calls", f"{TC}[1, 2]"),
    ("name_not_string", f'{TC}[{{"name": 5, "arguments": {{"a": 1}}}}]'),
    ("repeated_token", f"{TC}{TC}[{MW}]"),
    ("two_tokens", f'{TC}[{MW}]{TC}[{{"name": "b", "arguments": {{}}}}]'),
    ("trailing_garbage", f"{TC}[{MW}]]]"),
    ("name_args_form", f'{TC}get_weather{{"city": "Paris"}}'),
]

# Mistral from tokenizer v11 ([ARGS] in the vocabulary): [TOOL_CALLS]name[ARGS]{...}.
MISTRAL_ARGS = [
    ("no_calls", "Hello! How can I help you today?"),
    ("one_call", f'{TC}get_weather{ARGS}{{"city": "Paris", "unit": "celsius"}}'),
    ("two_calls", f'{TC}get_weather{ARGS}{{"city": "Paris"}}{TC}search{ARGS}{{"q": "caf\u00e9 \\"best\\" \u6771\u4eac \U0001f642", "f": {{"tags": ["a", {{"deep": [1, null]}}]}}}}'),
    ("text_before", f'Let me check.{TC}get_weather{ARGS}{{"city": "Paris"}}'),
    ("text_after", f'{TC}get_weather{ARGS}{{"city": "Paris"}} Done.'),
    ("space_only_before", f'  \n{TC}get_weather{ARGS}{{"city": "Paris"}}'),
    ("numbers", f'{TC}calc{ARGS}{{"a": 1.0, "b": -1e5, "h": "\\u00e9\\n"}}'),
    ("empty_arguments", f"{TC}ping{ARGS}{{}}"),
    ("no_arguments", f"{TC}ping"),
    ("brace_form", f'{TC}get_weather{{"city": "Paris"}}'),
    ("cut_off", f'{TC}get_weather{ARGS}{{"city": "Par'),
    ("malformed", f'{TC}get_weather{ARGS}{{"city": Paris}}'),
    ("coerced", f'{TC}get_weather{ARGS}{{"city": 75, "days": "3"}}'),
    ("array_args", f"{TC}f{ARGS}[1, 2]"),
    ("literal_tag_text", 'a [TOOL x { y } <s'),
]

# Texts fed to ijson (the mistral pre-v11 streaming reader) in pieces.
YAJL = [
    '[{"name": "f", "arguments": {"a": [-2.5e+3, true, null], "": "\\ud83d\\ude42\\n"}}]',
    '{"a": 01}',
    "[1,]",
    '{"a" 1}',
    '["s\x01"]',
    "[truex]",
    "[1.]",
    "[1.e5, 1e, 1e+]",
    "[1] 2 ",
    " \v\f[0, -0.5E-2]\t",
    '{"\\ud800x": "\\udc00"}',
    '{"k": "\\q"}',
    "{1: 2}",
    '{"": {"": [[], {}]}}',
    "/* c */[]",
    '"a.b"',
]
