"""OpenAI compatibility of the frontend, through the ``openai`` client, over one mock worker.

The mock is deterministic: a request with seed ``1000 + k`` gets the tokens a
prompt ``k`` tokens longer gets without one (see harness.expected_tokens), which
is how the texts of seeded choices are checked without another copy of the
stand-in detokenizer.
"""

from __future__ import annotations

import re

import openai
import pytest

PROMPT = "hello"


def _seeded_text(stack, prompt_len: int, n: int, seed: int) -> str:
    """The text of ``n`` tokens for a prompt of ``prompt_len`` tokens with ``seed`` (>= 1000)."""
    return stack.expected_text("x" * (prompt_len + seed - 1000), n)


def _assert_error_shape(body, code):
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, body
    assert err["code"] == code, body
    assert err["message"], body


def test_usage_ids_and_prompt_forms(stack):
    fe = stack.start([{"mode": "agg"}]).frontend
    client = fe.openai()

    # usage and cmpl- ids; x-request-id still echoes the client's id.
    rid = stack.new_id("usage")
    raw = client.completions.with_raw_response.create(model=stack.model, prompt=PROMPT, max_tokens=5, extra_headers={"x-request-id": rid})
    assert raw.headers["x-request-id"] == rid
    c = raw.parse()
    assert c.id == "cmpl-" + rid
    assert c.choices[0].text == stack.expected_text(PROMPT, 5)
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (5, 5, 10)

    messages = [{"role": "user", "content": "hi"}]  # rendered "user: hi\n": 9 tokens
    rid = stack.new_id("chat-usage")
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=messages, max_tokens=3, extra_headers={"x-request-id": rid}
    )
    chat = raw.parse()
    assert chat.id == "chatcmpl-" + rid and raw.headers["x-request-id"] == rid
    assert (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens) == (9, 3, 12)

    # Streaming with include_usage: a last chunk with no choices and the usage.
    for kind in ("completion", "chat"):
        if kind == "completion":
            stream = client.completions.create(
                model=stack.model, prompt=PROMPT, max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
        else:
            stream = client.chat.completions.create(
                model=stack.model, messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
            )
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage is not None, chunks[-1]
        prompt_tokens = 5 if kind == "completion" else 9
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens, chunks[-1].usage.total_tokens) == (
            prompt_tokens,
            4,
            prompt_tokens + 4,
        )
        assert all(ch.usage is None for ch in chunks[:-1])
        prefix = "cmpl-" if kind == "completion" else "chatcmpl-"
        assert all(ch.id.startswith(prefix) for ch in chunks)
    # Without include_usage there is no usage chunk.
    chunks = list(client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, stream=True))
    assert all(ch.choices for ch in chunks)

    # A batch of prompts: one choice per prompt, index i.
    c = client.completions.create(model=stack.model, prompt=["a", "bbb", "cc"], max_tokens=3)
    assert [ch.index for ch in sorted(c.choices, key=lambda ch: ch.index)] == [0, 1, 2]
    by_index = {ch.index: ch.text for ch in c.choices}
    assert by_index == {0: stack.expected_text("a", 3), 1: stack.expected_text("bbb", 3), 2: stack.expected_text("cc", 3)}
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (6, 9)

    # Token ids, and a batch of them.
    c = client.completions.create(model=stack.model, prompt=[1, 2, 3, 4], max_tokens=3)
    assert c.choices[0].text == stack.expected_text("x" * 4, 3) and c.usage.prompt_tokens == 4
    c = client.completions.create(model=stack.model, prompt=[[7, 8], [9, 10, 11]], max_tokens=2)
    assert {ch.index: ch.text for ch in c.choices} == {0: stack.expected_text("xx", 2), 1: stack.expected_text("xxx", 2)}

    # A streamed batch: every choice's chunks carry its index.
    texts = {}
    for ch in client.completions.create(model=stack.model, prompt=["a", "bbb"], max_tokens=3, stream=True):
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: stack.expected_text("a", 3), 1: stack.expected_text("bbb", 3)}

    # GET /v1/models/{id}.
    assert client.models.retrieve(stack.model).id == stack.model
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"

    m = fe.metrics()
    assert m["cancellations"] == 0 and m["confirmed"] == 0


def test_n_seed_and_stop(stack):
    fe = stack.start([{"mode": "agg"}]).frontend
    client = fe.openai()

    # n with a seed: choice j runs with seed + j.
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=4, n=3, seed=1003)
    assert {ch.index: ch.text for ch in c.choices} == {j: _seeded_text(stack, 5, 4, 1003 + j) for j in range(3)}
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (5, 12)
    # n without a seed: n distinct choices.
    chat = client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2)
    assert sorted(ch.index for ch in chat.choices) == [0, 1]
    assert chat.choices[0].message.content != chat.choices[1].message.content
    # Streamed n: each choice's first delta has the role.
    texts, roles = {}, {}
    for ch in client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, seed=1000, stream=True
    ):
        for choice in ch.choices:
            roles.setdefault(choice.index, choice.delta.role)
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert roles == {0: "assistant", 1: "assistant"}
    assert texts == {j: _seeded_text(stack, 9, 3, 1000 + j) for j in range(2)}
    # The same seed gives the same text; seed 1000 is the engine's own.
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=4, seed=1000)
    assert c.choices[0].text == stack.expected_text(PROMPT, 4)

    # stop strings: the text ends before the stop string, finish_reason "stop",
    # and the worker's request is ended (no cancellation counted).
    full = stack.expected_text(PROMPT, 12)
    words = re.findall(r" \w+", full)
    stop = words[4] + words[5]  # across two tokens
    want = "".join(words[:4])
    rid = stack.new_id("stop")
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=12, stop=["zzz", stop], extra_headers={"x-request-id": rid})
    assert c.choices[0].text == want and c.choices[0].finish_reason == "stop"
    assert c.usage.completion_tokens == 6
    streamed, finish = "", None
    for ch in client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=12, stop=stop, stream=True):
        streamed += ch.choices[0].text
        finish = ch.choices[0].finish_reason or finish
    assert (streamed, finish) == (want, "stop")
    three = stack.expected_text("user: hi\n", 3)  # a stop string that spans the last two tokens
    chat = client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=12, stop=three[-4:])
    assert chat.choices[0].finish_reason == "stop"
    assert chat.choices[0].message.content == three[:-4]

    # stop_token_ids (vLLM's extension) end the request in the engine; the stop token is
    # counted, and is text only with include_stop_str_in_output (as vLLM's detokenizer).
    tokens = stack.expected_tokens(PROMPT, 12)
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=12, extra_body={"stop_token_ids": [tokens[3]]})
    assert c.choices[0].text == stack.expected_text(PROMPT, 3) and c.choices[0].finish_reason == "stop"
    assert c.usage.completion_tokens == 4
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=12,
                                  extra_body={"stop_token_ids": [tokens[3]], "include_stop_str_in_output": True})
    assert c.choices[0].text == stack.expected_text(PROMPT, 4) and c.usage.completion_tokens == 4

    # min_tokens (vLLM's extension) is honoured by the mock: a stop token before it does not stop.
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=12,
                                  extra_body={"stop_token_ids": [tokens[3]], "min_tokens": 6})
    assert c.usage.completion_tokens > 4

    # echo (the frontend's): the prompt, then the completion.
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=3, echo=True)
    assert c.choices[0].text == PROMPT + stack.expected_text(PROMPT, 3)

    # temperature and top_p are accepted (the mock is deterministic).
    c = client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=3, temperature=0.7, top_p=0.9)
    assert c.choices[0].text == stack.expected_text(PROMPT, 3)

    w = stack.worker("agg")
    w.wait_log(rf"Aborted Request ID: {re.escape(rid)}(?: |$)")  # the stop string ended it in the engine
    m = fe.metrics()
    assert m["cancellations"] == 0 and m["confirmed"] == 0, m
    wm = w.metrics()
    assert wm["dynamo_ctx_worker_running_requests"] == 0 and wm["dynamo_ctx_worker_kv_blocks_in_use"] == 0, wm


def test_refusals_errors_and_logs(stack):
    fe = stack.start([{"mode": "agg"}]).frontend
    client = fe.openai()
    chat_msgs = [{"role": "user", "content": "hi"}]

    refused = [
        ("logprobs", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, logprobs=2)),
        ("logprobs", lambda: client.chat.completions.create(model=stack.model, messages=chat_msgs, max_tokens=2, logprobs=True)),
        ("logprobs", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, echo=True, logprobs=0)),
        ("echo", lambda: client.chat.completions.create(model=stack.model, messages=chat_msgs, max_tokens=2, extra_body={"echo": True})),
        ("best_of", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, best_of=3)),
        ("n", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, n=0)),
        ("temperature", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, temperature=3)),
        ("top_p", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, top_p=0)),
        ("stop", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, stop=["a", "b", "c", "d", "e"])),
        (
            "stream_options",
            lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, stream_options={"include_usage": True}),
        ),
        ("prompt", lambda: client.completions.create(model=stack.model, prompt=[], max_tokens=2)),
        # vLLM's extensions the mock engine does not honour: its model card does not list them.
        ("top_k", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, extra_body={"top_k": 5})),
        ("repetition_penalty", lambda: client.chat.completions.create(
            model=stack.model, messages=chat_msgs, max_tokens=2, extra_body={"repetition_penalty": 1.3})),
        ("logit_bias", lambda: client.completions.create(model=stack.model, prompt=PROMPT, max_tokens=2, logit_bias={"5": 1})),
    ]
    for param, call in refused:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        body = e.value.body
        assert body["type"] == "invalid_request_error" and body["param"] == param, (param, body)
    # Nothing refused reached the worker.
    assert stack.worker("agg").log_count(r"New Request ID") == 0

    # JSON errors on unknown paths and wrong methods.
    status, headers, body = fe.request_json("POST", "/v1/nope", {})
    assert status == 404
    _assert_error_shape(body, "unknown_url")
    status, headers, body = fe.request_json("GET", "/v1/completions")
    assert status == 405 and "POST" in headers["Allow"]
    _assert_error_shape(body, "method_not_allowed")
    status, _, body = fe.request_json("DELETE", "/v1/models")
    assert status == 405
    _assert_error_shape(body, "method_not_allowed")

    # Each failed request is logged once by the frontend, with status, id and reason.
    rid = stack.new_id("fail")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2, extra_headers={"x-request-id": rid})
    fe.wait_log(rf"WARNING .*request failed.*status=\"?404.*{re.escape(rid)}.*no-such-model")
    assert fe.log_count(rf"request failed.*{re.escape(rid)}") == 1
    assert fe.log_count(r"request failed.*status=\"?405") == 2
    assert fe.log_count(r"request failed.*status=\"?400") == len(refused)


def test_chat_without_max_tokens_runs_to_the_context_limit(stack):
    fe = stack.start([{"mode": "agg", "decode": 0.0005, "args": ["--max-model-len", "64"]}]).frontend
    client = fe.openai()
    chat = client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "hi"}])
    # "user: hi\n" is 9 tokens: the rest of the 64-token context.
    assert chat.usage.completion_tokens == 55 and chat.choices[0].finish_reason == "length"
    # Completions keep OpenAI's default of 16.
    c = client.completions.create(model=stack.model, prompt=PROMPT)
    assert c.usage.completion_tokens == 16
