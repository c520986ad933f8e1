"""The model's own text, end to end: mock workers started with ``--model <dir>`` (a model
directory in the Hugging Face layout, made on the fly by ``hfdir``) and
``--served-model-name``; the frontend tokenizes, renders chat and detokenizes as Hugging
Face's libraries do, through the ``openai`` client, also across a migration."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # python/tests: hfdir

import hfdir  # noqa: E402

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

MODEL = "tiny-llama"


@pytest.fixture
def model(tmp_path):
    return hfdir.make_model_dir(tmp_path / "model", max_position_embeddings=512)


def expected_ids(path, prompt_len, n, seed=1000):
    """The mock's output for a prompt of prompt_len tokens: its vocabulary walked from there."""
    from dynamo_ctx.backends import model_dir

    vocab = model_dir.vocabulary(str(path))
    return [vocab[(seed + prompt_len + i) % len(vocab)] for i in range(n)]


def test_completions_and_chat_speak_the_models_text(stack, model):
    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0}])
    client = stack.frontend.openai()
    tok = hfdir.tokenizer(model)
    assert [m.id for m in client.models.list().data] == [MODEL]

    for prompt in ["Hello world café", " Hello" * 99]:
        ids = tok.encode(prompt).ids  # with BOS, as vLLM's server tokenizes a completion
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9)
        assert out.usage.prompt_tokens == len(ids)
        assert out.usage.completion_tokens == 9
        assert out.choices[0].text == hfdir.stream_decode(tok, expected_ids(model, len(ids), 9))
    assert len(ids) == 100 and out.choices[0].text == " worl c ca H He Hel Hell Hellowo"  # merges of the vocabulary, in id order

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi, café? "}]
    chat_ids = tok.encode(hfdir.render_chat(messages), add_special_tokens=False).ids
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=9)
    assert chat.usage.prompt_tokens == len(chat_ids)
    assert chat.choices[0].message.content == hfdir.stream_decode(tok, expected_ids(model, len(chat_ids), 9))


def test_streams_whole_characters_and_stops_on_real_text(stack, model):
    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0}])
    client = stack.frontend.openai()
    n = hfdir.prompt_len_for_output(model)
    prompt = [0] * n  # a token prompt after which the mock says OUTPUT_TEXT, é and 😀 split across tokens
    want = hfdir.OUTPUT_TEXT
    chunks = [
        c.choices[0].text
        for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=len(hfdir.OUTPUT), stream=True)
    ]
    assert "".join(chunks) == want
    assert not any("\ufffd" in c for c in chunks), chunks

    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=len(hfdir.OUTPUT), stop=["é,"])
    assert stopped.choices[0].text == "Hello world caf"
    assert stopped.choices[0].finish_reason == "stop"


def test_context_length_from_config_json(stack, model):
    import openai

    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0}])
    client = stack.frontend.openai()
    prompt = " Hello" * 200  # 200 tokens + BOS
    ok = client.completions.create(model=MODEL, prompt=prompt, max_tokens=311)  # 201 + 311 = 512
    assert ok.usage.prompt_tokens == 201
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=312)
    assert e.value.code == "context_length_exceeded"


@pytest.mark.slow
def test_migration_is_token_exact_in_the_models_text(stack, model):
    """A worker SIGKILLed mid-stream: the text the client reads is the model's, whole."""
    spec = {"model": MODEL, "model_dir": str(model), "decode": 0.01, "prefill": 0.0}
    stack.start([dict(spec), dict(spec)], migration_limit=2)
    client = stack.frontend.openai()
    tok = hfdir.tokenizer(model)
    prompt = "Count on, whatever happens to the worker."
    plen = len(tok.encode(prompt).ids)
    victim = []
    texts = []
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=120, stream=True):
        texts.append(chunk.choices[0].text)
        if len(texts) == 10 and not victim:
            busy = [w for w in stack.workers if w.metrics()["dynamo_ctx_worker_running_requests"] == 1]
            assert len(busy) == 1
            busy[0].kill()
            victim.append(busy[0])
    assert victim
    assert "".join(texts) == hfdir.stream_decode(tok, expected_ids(model, plen, 120))


def test_a_frontend_elsewhere_reads_the_model_from_its_worker(stack, model, tmp_path):
    """The directory the worker published is not where the frontend can read it (as on
    another machine: here it is renamed once the worker holds it open): the frontend reads
    its text files from the worker's model_files endpoint, and speaks the same text."""
    stack.start([{"model": MODEL, "model_dir": str(model), "decode": 0.0, "prefill": 0.0}])
    tok = hfdir.tokenizer(model)
    model.rename(tmp_path / "moved")
    client = stack.frontend.openai()
    prompt = " Hello" * 99
    ids = tok.encode(prompt).ids
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=9)
    assert out.usage.prompt_tokens == len(ids) == 100
    assert out.choices[0].text == " worl c ca H He Hel Hell Hellowo"


def test_model_files_handler_serves_only_its_text_files(tmp_path):
    import asyncio

    from dynamo_ctx.backends import model_dir

    d = hfdir.make_model_dir(tmp_path / "m")
    (d / "secret.txt").write_text("no")
    handler = model_dir.files_handler(str(d))

    async def ask(names):
        return [item async for item in handler({"files": names})]

    items = asyncio.run(ask(["tokenizer.json", "chat_template.jinja"]))
    text = "".join(i.get("data", "") for i in items if i["name"] == "tokenizer.json")
    assert text == (d / "tokenizer.json").read_text()
    assert {"name": "tokenizer.json", "end": True} in items
    assert {"name": "chat_template.jinja", "missing": True} in items
    for bad in (["../etc/passwd.json"], ["secret.txt"], [".hidden.json"], ["a/b.json"], [], ["x.json"] * 17, "tokenizer.json"):
        with pytest.raises(ValueError):
            asyncio.run(ask(bad))
    # Each file within the frontend's bound, the library's (go/hfmodel), never restated.
    from dynamo_ctx import _native

    assert model_dir.max_tokenizer_bytes() == _native.MODEL_MAX_TOKENIZER_BYTES == 256 << 20
    with open(d / "big.json", "wb") as f:
        f.truncate(_native.MODEL_MAX_TOKENIZER_BYTES + 1)  # sparse: nothing is read
    with pytest.raises(ValueError, match=f"more than the {_native.MODEL_MAX_TOKENIZER_BYTES} served"):
        asyncio.run(ask(["big.json"]))
