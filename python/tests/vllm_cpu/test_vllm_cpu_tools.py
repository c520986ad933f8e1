"""Tools and reasoning on the real engine, side by side with vLLM's own server.

A random-weight model with Qwen3's own tokenizer and chat template (make_model.py
``--kind qwen3``: its template renders tools, its vocabulary has ``<tool_call>`` and
``<think>``). vLLM's server runs with ``--enable-auto-tool-choice --tool-call-parser hermes
--reasoning-parser qwen3``; our worker with ``--tool-call-parser hermes --reasoning-parser
qwen3``. Both on the same engine arguments, greedy, so both engines write the same tokens.

A random model never writes a tool call of its own, so the outputs are steered: a
``structured_outputs`` choice makes both engines write one given text (a reasoning, a
Hermes call), and tool_choice ``required`` and a named function constrain them with the
tools' JSON schema. Then the two servers' answers are compared, whole and streamed (the
streamed deltas gathered per call), less ids.

vLLM 0.32 by default constrains Hermes tool calls with xgrammar structural tags
(VLLM_ENFORCE_STRICT_TOOL_CALLING=1); our frontend does what vLLM does with that variable
0 (a JSON schema for required and named functions, docs/openai-api.md), so its server
runs with it 0 here.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm-cpu",
        allow_module_level=True,
    )

import json  # noqa: E402
from typing import Any, Dict, List, Tuple  # noqa: E402

import harness  # noqa: E402
from cpu_stack import ENGINE_START, MODEL, VllmServer, engine_flags, environment, model_dir  # noqa: E402
from harness import Frontend, Stack, Worker, http_json, http_request  # noqa: E402

PARSERS = ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                    "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2]}, "b": {"type": "integer", "enum": [3]}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
MESSAGES = [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "Weather in Paris? Then 1+3."}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
#: (name, request fields) compared between the two servers, whole and streamed.
CASES: List[Tuple[str, Dict[str, Any]]] = [
    ("auto, a forced call", {"tools": TOOLS, "extra_body": {"structured_outputs": {"choice": [CALL]}}}),
    ("auto, text and two calls", {"tools": TOOLS, "extra_body": {"structured_outputs": {"choice": [
        "Sure.\n" + CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 3}}\n</tool_call>']}}}),
    ("auto, no call", {"tools": TOOLS, "extra_body": {"structured_outputs": {"choice": ["No tool is needed."]}}}),
    ("auto, one call only", {"tools": TOOLS, "parallel_tool_calls": False, "extra_body": {"structured_outputs": {"choice": [
        CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>']}}}),
    ("reasoning then a call", {"tools": TOOLS, "extra_body": {"structured_outputs": {"choice": [
        "<think>\nThe user wants the weather.\n</think>\n\n" + CALL]}}}),
    ("reasoning only", {"extra_body": {"structured_outputs": {"choice": ["<think>\nTwo and two.\n</think>\n\nIt is 4."]}}}),
    ("reasoning cut by max_tokens", {"max_tokens": 5, "extra_body": {"structured_outputs": {"choice": [
        "<think>\nA long thought that goes on.\n</think>\n\nDone."]}}}),
    ("thinking disabled", {"extra_body": {"chat_template_kwargs": {"enable_thinking": False},
                                          "structured_outputs": {"choice": ["Plain answer."]}}}),
    # Thinking off: with it on, Qwen3's parser reads the whole output as reasoning (no </think>).
    ("required", {"tools": TOOLS, "tool_choice": "required", "extra_body": NO_THINKING}),
    ("required, one call", {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "extra_body": NO_THINKING}),
    ("named", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}, "extra_body": NO_THINKING}),
    ("required, thinking on", {"tools": TOOLS, "tool_choice": "required"}),
    ("none", {"tools": TOOLS, "tool_choice": "none", "extra_body": {"structured_outputs": {"choice": [CALL]}}}),
]


def flags() -> List[str]:
    """The suite's engine arguments, structured output also inside the reasoning (so a
    choice steers the whole output), and the parsers."""
    out = engine_flags(max_num_seqs=4)
    i = out.index("--structured-outputs-config")
    out[i + 1] = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True, "enable_in_reasoning": True})
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """vLLM's server and our stack (one worker) on the qwen3 model."""
    log_dir = tmp_path_factory.mktemp("vllm-cpu-tools")
    env = environment({"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"})
    stack = Stack(log_dir=log_dir, prefix="vt")
    stack.env.update(env)
    path = model_dir("qwen3")
    server = VllmServer("vllm-server-tools", path, stack.env, [*flags(), "--enable-auto-tool-choice", *PARSERS], log_dir=log_dir)
    harness.STARTED.remove(server)
    worker = Worker("agg-tools", stack.env, namespace=stack.namespace, model=MODEL, model_dir=path, engine="vllm",
                    args=[*flags(), *PARSERS], log_dir=log_dir)
    harness.STARTED.remove(worker)
    stack.procs.append(worker)
    stack.frontend = Frontend("frontend-tools", stack.env, namespace=stack.namespace, log_dir=log_dir)
    harness.STARTED.remove(stack.frontend)
    stack.procs.append(stack.frontend)
    try:
        server.ready()
        worker.ready(ENGINE_START)
        stack.workers.append(worker)
        stack.frontend.ready()
        stack.frontend.wait_instances(1, MODEL)
        yield server, stack.frontend
    finally:
        server.stop()
        stack.close()


def answer(client: Any, fields: Dict[str, Any], stream: bool) -> Dict[str, Any]:
    """A chat answer as comparable fields: content, reasoning, tool calls (name and
    arguments, ids left out), finish reason. 200 tokens at most by default: a random model
    steered to a text may spell it in many short tokens (the prompt is 274 of the 512)."""
    req = dict(model=MODEL, messages=MESSAGES, temperature=0.0, max_tokens=fields.get("max_tokens", 200))
    req.update({k: v for k, v in fields.items() if k != "max_tokens"})
    if not stream:
        ch = client.chat.completions.create(**req).choices[0]
        m = ch.message
        calls = [(c.function.name, c.function.arguments, c.type, bool(c.id)) for c in (m.tool_calls or [])]
        return {"content": m.content, "reasoning": (m.model_extra or {}).get("reasoning"), "calls": calls,
                "finish": ch.finish_reason}
    content, reasoning, finish = None, None, None
    calls: Dict[int, List[Any]] = {}
    for chunk in client.chat.completions.create(stream=True, **req):
        for ch in chunk.choices:
            d = ch.delta
            if d.content:
                content = (content or "") + d.content
            r = (d.model_extra or {}).get("reasoning")
            if r:
                reasoning = (reasoning or "") + r
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, ["", "", None, 0])
                e[0] += (tc.function.name or "") if tc.function else ""
                e[1] += (tc.function.arguments or "") if tc.function else ""
                e[2] = tc.type or e[2]
                e[3] += 1 if tc.id else 0
            finish = ch.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "finish": finish,
            "calls": [(n, a, t, ids == 1) for _, (n, a, t, ids) in sorted(calls.items())]}


def test_tools_and_reasoning_as_vllms_server(pair):
    """Every case, whole and streamed: the same content, reasoning, tool calls and finish
    reason as vLLM's server. Required and named calls are valid calls of the tools."""
    server, fe = pair
    theirs, ours = server.openai(), fe.openai()
    bad, answers = [], {}
    for name, fields in CASES:
        for stream in (False, True):
            a, b = answer(theirs, fields, stream), answer(ours, fields, stream)
            answers[name, stream] = b
            if a != b:
                bad.append((name, stream, a, b))
    print(f"tools and reasoning: {2 * len(CASES) - len(bad)}/{2 * len(CASES)} answers the same as vLLM's server")
    for b in bad:
        print("DIFFERENT", json.dumps(b, ensure_ascii=False))
    assert not bad, bad
    for name in ("required", "required, one call", "named"):
        b = answers[name, False]
        assert b["calls"], (name, b)
        for fn, args, _, _ in b["calls"]:
            assert fn in ("get_weather", "add") and isinstance(json.loads(args), dict), (name, b)
    assert len(answers["required, one call", False]["calls"]) == 1
    # The steered outputs are what they were steered to (not a vacuous agreement), whole.
    # Streamed, both servers find the markers by token id, and a random model steered to
    # a text may spell "<think>" or "<tool_call>" in ordinary tokens: then both stream it
    # all as reasoning or content (go/reasoning's and go/toolcall's vectors cover the
    # streamed paths with the marker tokens).
    forced = answers["reasoning then a call", False]
    assert forced["reasoning"] and [c[0] for c in forced["calls"]] == ["get_weather"], forced
    assert [c[0] for c in answers["auto, text and two calls", False]["calls"]] == ["get_weather", "add"]
    assert answers["auto, no call", False]["calls"] == []


def test_tools_rendered_as_vllms_server(pair):
    """/tokenize with tools and a conversation of tool calls and results: the same tokens
    as vLLM's server renders with the model's own template."""
    server, fe = pair
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    for body in ({"model": MODEL, "messages": MESSAGES, "tools": TOOLS},
                 {"model": MODEL, "messages": history, "tools": TOOLS},
                 {"model": MODEL, "messages": history, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}):
        a = http_json("POST", server.url + "/tokenize", body)
        b = http_json("POST", fe.url + "/tokenize", body)
        assert a == b, (body, a, b)


def test_refusals_as_vllms_server(pair):
    """Requests vLLM's server refuses are refused too, naming the same field."""
    server, fe = pair
    for body in ({"tools": []}, {"tool_choice": "auto"}, {"tools": TOOLS, "tool_choice": "sometimes"},
                 {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}):
        req = dict({"model": MODEL, "messages": MESSAGES, "max_tokens": 4}, **body)
        a = http_request("POST", server.url + "/v1/chat/completions", req)
        b = http_request("POST", fe.url + "/v1/chat/completions", req)
        assert a[0] == b[0] == 400, (body, a, b)
