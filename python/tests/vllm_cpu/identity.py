"""Text identity with vLLM's own OpenAI server: the requests, and their comparison.

Each case is sent to vLLM's server and to our frontend with the ``openai`` client,
once whole and once streamed (``stream_options.include_usage``). The same request
must give the same text of every choice, the same finish reasons and the same usage
(prompt, completion and total tokens). Ids and timestamps differ by nature and are not
compared.

A case with ``stop_from`` gets its stop string from vLLM's own greedy output of the
same request without one (the characters ``stop_from`` slices), since a random-weight
model's text cannot be foreseen: the stop string then does occur in the output.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

MODEL = "tiny"

_C = "completion"
_CH = "chat"


def _msgs(*pairs: Tuple[str, str]) -> List[Dict[str, str]]:
    return [{"role": r, "content": c} for r, c in pairs]


#: A schema whose every valid answer is short, so that a random-weight model constrained
#: to it finishes within a few tokens.
COLOUR_SCHEMA: Dict[str, Any] = {
    "type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"], "additionalProperties": False,
}

#: (name, kind, request fields); greedy unless a case says otherwise.
CASES: List[Tuple[str, str, Dict[str, Any]]] = [
    ("plain", _C, {"prompt": "Hello, my name is", "max_tokens": 24}),
    ("japanese", _C, {"prompt": "東京の天気は今日", "max_tokens": 24}),
    ("chinese", _C, {"prompt": "人工智能的未来是", "max_tokens": 24}),
    ("korean", _C, {"prompt": "안녕하세요, 저는", "max_tokens": 20}),
    ("emoji", _C, {"prompt": "I love 🍕 and 🎉 and 👩‍👩‍👧‍👦, do you", "max_tokens": 24}),
    ("accents", _C, {"prompt": "Ünïcödé façade naïve café — «quoted»", "max_tokens": 20}),
    ("code", _C, {"prompt": "def fibonacci(n):\n    \"\"\"Return the n-th number.\"\"\"\n    ", "max_tokens": 32}),
    ("markdown", _C, {"prompt": "```python\nimport os\nfor root, dirs, files in os.walk('.'):\n", "max_tokens": 24}),
    ("whitespace", _C, {"prompt": "  leading spaces\n\n\ttabs\r\nand CRLF  ", "max_tokens": 16}),
    ("one-token", _C, {"prompt": "Count: one, two,", "max_tokens": 1}),
    ("token-ids", _C, {"prompt": [128000, 9906, 11, 1917, 0, 358, 1097], "max_tokens": 16}),
    ("stop-string", _C, {"prompt": "The list of colours:", "max_tokens": 40, "stop_from": (12, 3)}),
    ("stop-two", _C, {"prompt": "Once upon a time", "max_tokens": 40, "stop_from": (20, 2)}),
    ("n2-seed", _C, {"prompt": "A random thought:", "max_tokens": 16, "n": 2, "temperature": 0.9, "seed": 7}),
    ("n3-seed-top-p", _C, {"prompt": "Tell me", "max_tokens": 12, "n": 3, "temperature": 1.0, "top_p": 0.9, "seed": 42}),
    ("seed-sampled", _C, {"prompt": "Sampling with a seed", "max_tokens": 20, "temperature": 0.7, "seed": 1234}),
    ("chat-plain", _CH, {"messages": _msgs(("user", "Hello! Who are you?")), "max_tokens": 24}),
    ("chat-system", _CH, {"messages": _msgs(("system", "You are terse."), ("user", "Explain KV caches.")), "max_tokens": 24}),
    ("chat-multi-turn", _CH, {"messages": _msgs(("user", "Hi"), ("assistant", "Hello, how can I help?"),
                                                  ("user", "Write a haiku.")), "max_tokens": 24}),
    ("chat-cjk", _CH, {"messages": _msgs(("user", "请用中文介绍一下你自己。日本語でもどうぞ。")), "max_tokens": 24}),
    ("chat-emoji", _CH, {"messages": _msgs(("user", "Reply with emoji only 🙂🚀🔥")), "max_tokens": 20}),
    ("chat-code", _CH, {"messages": _msgs(("user", "Fix this:\n```js\nconst x = [1,2,3].map(x => x*2\n```")), "max_tokens": 32}),
    ("chat-stop", _CH, {"messages": _msgs(("user", "List three fruits.")), "max_tokens": 40, "stop_from": (8, 3)}),
    ("chat-n2-seed", _CH, {"messages": _msgs(("user", "Pick a number.")), "max_tokens": 12, "n": 2, "temperature": 0.8,
                           "seed": 3}),
    ("chat-seed-top-p", _CH, {"messages": _msgs(("user", "Say something.")), "max_tokens": 16, "temperature": 1.0,
                              "top_p": 0.8, "seed": 99}),
    # vLLM's extensions (the openai client's extra_body), each honoured as vLLM's server does.
    ("ext-top-k-min-p", _C, {"prompt": "Sampling, shaped", "max_tokens": 20, "temperature": 0.8, "seed": 5,
                             "extra_body": {"top_k": 20, "min_p": 0.05}}),
    ("ext-repetition", _C, {"prompt": "Repeat after me: la la la", "max_tokens": 24, "extra_body": {"repetition_penalty": 1.5}}),
    ("ext-min-tokens-stop", _C, {"prompt": "The list of colours:", "max_tokens": 40, "stop_from": (2, 2),
                                 "extra_body": {"min_tokens": 8}}),
    ("ext-include-stop", _C, {"prompt": "Once upon a time", "max_tokens": 40, "stop_from": (12, 3),
                              "extra_body": {"include_stop_str_in_output": True}}),
    ("ext-special-tokens", _CH, {"messages": _msgs(("user", "Hi")), "max_tokens": 16, "extra_body": {"skip_special_tokens": False}}),
    ("ext-allowed", _C, {"prompt": "Only these:", "max_tokens": 12, "extra_body": {"allowed_token_ids": [1820, 374, 264, 1296, 13]}}),
    ("ext-logit-bias", _C, {"prompt": "Biased:", "max_tokens": 8, "logit_bias": {"1820": 100}}),
    ("ext-bad-words", _C, {"prompt": "The cat sat on", "max_tokens": 16, "extra_body": {"bad_words": [" the", " a"]}}),
    ("echo", _C, {"prompt": "Echo this, then go on:", "max_tokens": 8, "echo": True}),
    ("echo-token-ids", _C, {"prompt": [128000, 9906, 11, 1917], "max_tokens": 8, "echo": True}),
    # Structured output: OpenAI's response_format and vLLM's structured_outputs.
    ("struct-json-schema", _CH, {"messages": _msgs(("user", "Pick a colour as JSON.")), "max_tokens": 48,
                                 "response_format": {"type": "json_schema", "json_schema": {
                                     "name": "colour", "schema": COLOUR_SCHEMA, "strict": True}}}),
    ("struct-json-object", _CH, {"messages": _msgs(("user", "Answer in JSON.")), "max_tokens": 24,
                                 "response_format": {"type": "json_object"}}),
    ("struct-choice", _C, {"prompt": "Pick one:", "max_tokens": 8,
                           "extra_body": {"structured_outputs": {"choice": ["red", "green", "blue"]}}}),
    ("struct-regex", _C, {"prompt": "A date:", "max_tokens": 16,
                          "extra_body": {"structured_outputs": {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}}}),
]


def _fields(fields: Dict[str, Any]) -> Dict[str, Any]:
    out = {"temperature": 0.0}
    out.update({k: v for k, v in fields.items() if k != "stop_from"})
    return out


def _call(client: Any, kind: str, fields: Dict[str, Any], stream: bool) -> Dict[str, Any]:
    """One request; its choices' text and finish reasons by index, and its usage."""
    api = client.completions if kind == _C else client.chat.completions
    texts: Dict[int, str] = {}
    finish: Dict[int, Optional[str]] = {}
    usage: Any = None
    if not stream:
        r = api.create(model=MODEL, **fields)
        for ch in r.choices:
            texts[ch.index] = ch.text if kind == _C else (ch.message.content or "")
            finish[ch.index] = ch.finish_reason
        usage = r.usage
    else:
        for chunk in api.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **fields):
            for ch in chunk.choices:
                piece = ch.text if kind == _C else (ch.delta.content or "")
                texts[ch.index] = texts.get(ch.index, "") + (piece or "")
                if ch.finish_reason is not None:
                    finish[ch.index] = ch.finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
    u = None if usage is None else (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
    return {"texts": texts, "finish": finish, "usage": u}


def compare(theirs: Any, ours: Any) -> List[Dict[str, Any]]:
    """Every case, whole and streamed, on both clients: what each returned, and whether the same."""
    results = []
    for name, kind, fields in CASES:
        req = _fields(fields)
        if "stop_from" in fields:
            start, n = fields["stop_from"]
            full = _call(theirs, kind, req, False)["texts"][0]
            stop = full[start:start + n] if len(full) >= start + n else full[-n:]
            req["stop"] = [stop]
        for stream in (False, True):
            a = _call(theirs, kind, req, stream)
            b = _call(ours, kind, req, stream)
            results.append({"case": name, "stream": stream, "same": a == b, "vllm": a, "ours": b})
    return results


#: /tokenize and /detokenize requests, sent to both servers as they are (model included
#: unless a case leaves it out: both then answer for the one model they serve).
_CHAT = _msgs(("system", "Be brief."), ("user", "Hi there, café? 🍕"), ("assistant", "Sure, "))
TOKEN_CASES: List[Tuple[str, Dict[str, Any]]] = [
    ("/tokenize", {"model": MODEL, "prompt": "Hello, my name is"}),
    ("/tokenize", {"model": MODEL, "prompt": "東京の天気は今日 🍕", "return_token_strs": True}),
    ("/tokenize", {"model": MODEL, "prompt": "  leading\n\ttabs ", "add_special_tokens": False, "return_token_strs": True}),
    ("/tokenize", {"prompt": "no model named"}),
    ("/tokenize", {"model": MODEL, "messages": _CHAT[:2]}),
    ("/tokenize", {"model": MODEL, "messages": _CHAT[:2], "add_generation_prompt": False, "return_token_strs": True}),
    ("/tokenize", {"model": MODEL, "messages": _CHAT, "add_generation_prompt": False, "continue_final_message": True}),
    ("/tokenize", {"model": MODEL, "messages": _CHAT[:2], "add_special_tokens": True}),
    ("/tokenize", {"model": MODEL, "messages": _CHAT[:2], "chat_template_kwargs": {"unused_by_the_template": 1}}),
    ("/detokenize", {"model": MODEL, "tokens": [128000, 9906, 11, 1917, 0, 358, 1097]}),
    ("/detokenize", {"model": MODEL, "tokens": [128006, 882, 128007, 271, 13347, 128009]}),
    ("/detokenize", {"tokens": []}),
]


#: Requests whose logprobs are compared with vLLM's server, whole and streamed (greedy).
LOGPROB_CASES: List[Tuple[str, str, Dict[str, Any]]] = [
    ("chat-logprobs", _CH, {"messages": _msgs(("user", "Hello, 你好 🙂")), "max_tokens": 12, "logprobs": True, "top_logprobs": 3}),
    ("chat-logprobs-0", _CH, {"messages": _msgs(("user", "Count to three.")), "max_tokens": 8, "logprobs": True}),
    ("completion-logprobs", _C, {"prompt": "The capital of France is", "max_tokens": 12, "logprobs": 2}),
    ("completion-logprobs-cjk", _C, {"prompt": "東京の天気は", "max_tokens": 10, "logprobs": 0}),
    ("completion-echo-logprobs", _C, {"prompt": "Hello, my name is", "max_tokens": 6, "logprobs": 1, "echo": True}),
]


def logprobs_of(client: Any, kind: str, fields: Dict[str, Any], stream: bool) -> Any:
    """The logprobs of a request's one choice: chat, the list of token entries; completions,
    the four lists; streamed, each concatenated over the chunks."""
    api = client.completions if kind == _C else client.chat.completions
    req = dict(fields, temperature=0.0)
    chunks = api.create(model=MODEL, stream=True, **req) if stream else [api.create(model=MODEL, **req)]
    out: Any = [] if kind == _CH else {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for ch in c.choices:
            lp = ch.logprobs
            if lp is None:
                continue
            if kind == _CH:
                out += [e.model_dump() for e in (lp.content or [])]
            else:
                for k in out:
                    out[k] += list(getattr(lp, k) or [])
    return out


def same_logprobs(a: Any, b: Any, tol: float = 1e-4) -> bool:
    """Equal, floats within ``tol``."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol * max(1.0, abs(a))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_logprobs(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_logprobs(x, y, tol) for x, y in zip(a, b))
    return bool(a == b)
