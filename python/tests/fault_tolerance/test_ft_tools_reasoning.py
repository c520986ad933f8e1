"""Tools and reasoning end to end on the mock engine: a worker started with
``--tool-call-parser hermes --reasoning-parser deepseek_r1`` on a model directory whose
vocabulary spells, in id order, a reasoning and a Hermes tool call, so that the mock (which
walks its vocabulary from a point the request's seed picks) says exactly that. The frontend
splits the reasoning off, parses the call into ``tool_calls`` (whole and streamed), and
refuses what the mock cannot honour (``tool_choice`` required: structured output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from harness import http_json

pytest.importorskip("tokenizers")

MODEL = "tool-model"

#: The output the mock says, a token each, in id order.
PIECES = ["<think>", "Let", " me", " think.", "</think>", "\n\n", "<tool_call>", "\n",
          '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}', "\n ", "</tool_call>"]
#: Tokens the template needs; the first, the end of a turn, ends the output as a stop token.
MORE = ["<|end|>", "<|user|>", "<|assistant|>", "<|tools|>"]
END_ID = len(PIECES)
MARKERS = {"<think>", "</think>", "<tool_call>", "</tool_call>"}
TEMPLATE = ("{% if tools %}<|tools|>{{ tools | tojson }}<|end|>{% endif %}"
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def make_dir(path: Path) -> Path:
    """A WordLevel tokenizer: PIECES then MORE by id, the markers as added tokens that are
    not special (as Qwen3's are), [UNK] for anything else; decoded by concatenation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {p: i for i, p in enumerate(PIECES + MORE)}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.Fuse()
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken(m, special=False, normalized=False) for m in sorted(MARKERS | set(MORE))])
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return path


@pytest.fixture
def model(tmp_path):
    return make_dir(tmp_path / "model")


def seed_for(frontend: Any, messages: List[Dict[str, Any]], tools: Any, size: int) -> int:
    """The seed after which the mock's output starts at id 0 (PIECES[0]) for this chat."""
    count = http_json("POST", frontend.url + "/tokenize", {"model": MODEL, "messages": messages, "tools": tools})["count"]
    return int(-count % size)


def vocabulary_size(path: Path) -> int:
    from dynamo_ctx.backends import model_dir

    return len(model_dir.vocabulary(str(path)))


def test_reasoning_and_tool_calls(stack, model):
    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0,
                  "args": ["--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"]}])
    client = stack.frontend.openai()
    seed = seed_for(stack.frontend, MESSAGES, TOOLS, vocabulary_size(model))
    kw: Dict[str, Any] = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=len(PIECES) + 1, seed=seed,
                              extra_body={"stop_token_ids": [END_ID]})

    whole = client.chat.completions.create(**kw)
    ch = whole.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    assert ch.message.model_extra.get("reasoning_content") == "Let me think."
    assert ch.message.model_extra.get("reasoning") == "Let me think."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in ch.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2})]
    assert ch.message.tool_calls[0].id.startswith("chatcmpl-tool-") and ch.message.tool_calls[0].type == "function"
    assert whole.usage.completion_tokens == len(PIECES) + 1, "the stop token counts, as the reasoning does"

    reasoning, content, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            d = c.delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert entry["id"] is None, "a call's id comes once"
                    entry["id"] = tc.id
                if tc.function and tc.function.name:
                    entry["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    entry["arguments"] += tc.function.arguments
            finish = c.finish_reason or finish
    assert reasoning == "Let me think."
    assert content.strip() == ""
    assert finish == "tool_calls"
    assert [(e["name"], json.loads(e["arguments"])) for e in calls.values()] == [("get_weather", {"city": "Paris", "days": 2})]

    # tool_choice none: the text is content (the reasoning still split off).
    none = client.chat.completions.create(tool_choice="none", **kw).choices[0]
    assert none.finish_reason == "stop" and not none.message.tool_calls
    assert none.message.content.startswith("\n\n<tool_call>")
    # include_reasoning false: no reasoning in the answer.
    hidden = client.chat.completions.create(**dict(kw, extra_body={"stop_token_ids": [END_ID], "include_reasoning": False})).choices[0]
    assert hidden.message.model_extra.get("reasoning_content") is None


def test_what_the_mock_cannot_honour_is_refused(stack, model):
    import openai

    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0, "args": ["--tool-call-parser", "hermes"]}])
    client = stack.frontend.openai()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=4)
        err = e.value.body
        assert (err["code"], err["param"]) == ("unsupported_parameter", "tool_choice"), err
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[], max_tokens=4)
    assert e.value.body["param"] == "tools"


def test_auto_needs_a_tool_call_parser(stack, model):
    import openai

    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0}])
    client = stack.frontend.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=4)
    assert (e.value.body["code"], e.value.body["param"]) == ("unsupported_parameter", "tool_choice")
    # tool_choice none renders the tools and answers as text.
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert out.choices[0].message.content and not out.choices[0].message.tool_calls
