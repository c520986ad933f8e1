"""A model directory in the Hugging Face layout, made on the fly for tests (no model hub is
reachable): a Llama-3-style tokenizer built with the ``tokenizers`` package, a chat template,
and a config.json.

The tokenizer is byte-level BPE with Llama 3's split regex, BOS added by its post-processor
and Llama 3's header tokens as special tokens. Its vocabulary is laid out for the mock engine,
which produces ``vocabulary[(seed + n) % len(vocabulary)]`` for a sequence of length ``n``
(the sorted non-special ids): ids 0 to ``len(OUTPUT) - 1`` are the tokens of ``OUTPUT_TEXT``,
in order, where ``é`` and ``😀`` are split across tokens (bytes of one character in
different tokens). A token prompt of ``prompt_len_for_output()`` tokens makes the mock's
output start at id 0: the frontend must then stream ``OUTPUT_TEXT`` without ever splitting
a character.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

#: Llama 3's pre-tokenization regex.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

#: A Llama-3-style chat template (as the model's tokenizer_config.json carries it).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

#: What the mock produces from id 0 on: as text, and as the byte-level tokens (ids 0..).
OUTPUT_TEXT = "Hello world café, 😀!\n"


def _bytes_to_unicode() -> Dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_B2U = _bytes_to_unicode()


def byte_level(data: bytes) -> str:
    return "".join(_B2U[b] for b in data)


#: OUTPUT_TEXT's tokens: é and 😀 are split across tokens.
OUTPUT: List[str] = [
    byte_level(b) for b in [
        b"Hello", b" world", b" caf", "é".encode()[:1], "é".encode()[1:], b",", b" ", "😀".encode()[:2], "😀".encode()[2:3],
        "😀".encode()[3:], b"!", b"\n",
    ]
]


def _vocab_and_merges() -> Tuple[Dict[str, int], List[Tuple[str, str]]]:
    vocab: Dict[str, int] = {}
    for tok in OUTPUT:
        vocab.setdefault(tok, len(vocab))
    merges: List[Tuple[str, str]] = []
    for tok in list(OUTPUT) + [byte_level(b" Hello"), byte_level(b"world")]:
        # A left-to-right merge chain: c1 c2 -> c1c2, c1c2 c3 -> c1c2c3, ...
        for i in range(2, len(tok) + 1):
            left, right = tok[: i - 1], tok[i - 1]
            if (left, right) not in merges:
                merges.append((left, right))
    extra = [a + b for a, b in merges]
    for ch in _B2U.values():
        vocab.setdefault(ch, len(vocab))
    for tok in extra:
        vocab.setdefault(tok, len(vocab))
    return vocab, merges


def make_model_dir(path: Path, max_position_embeddings: int = 512) -> Path:
    """Write the model directory at ``path`` and return it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    bos = tok.token_to_id(SPECIALS[0])
    tok.post_processor = processors.TemplateProcessing(single=f"{SPECIALS[0]} $A", special_tokens=[(SPECIALS[0], bos)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIALS[0], "eos_token": SPECIALS[4], "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000,
    }))
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": tok.get_vocab_size(),
        "max_position_embeddings": max_position_embeddings, "bos_token_id": bos, "eos_token_id": tok.token_to_id(SPECIALS[4]),
    }))
    return path


def tokenizer(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def render_chat(messages: List[Dict[str, str]]) -> str:
    """The chat template rendered as Hugging Face's apply_chat_template does (jinja2)."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(CHAT_TEMPLATE)
    return template.render(messages=messages, add_generation_prompt=True, bos_token=SPECIALS[0], eos_token=SPECIALS[4])


def vocabulary_size(path: Path) -> int:
    """How many ids the mock draws from (the non-special ones)."""
    from dynamo_ctx.backends import model_dir

    return len(model_dir.vocabulary(str(path)))


def prompt_len_for_output(path: Path, seed: int = 1000) -> int:
    """A prompt length (in tokens) after which the mock's output starts at id 0: OUTPUT_TEXT."""
    v = vocabulary_size(path)
    n = (-seed) % v
    return n or v


#: The prompts and chats whose tokens go/frontend's tests check against Hugging Face's.
GO_PROMPTS = ["Hello world café", "  naïve 中文 😀\n\ntabs\tand  spaces  ", "<|eot_id|>Hello"]
GO_CHATS = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there, café? "}]]


def write_go_testdata(path: Path) -> None:
    """The model directory and expect.json of go/frontend/testdata/model."""
    make_model_dir(path)
    t = tokenizer(path)
    out = {
        "completions": [{"prompt": p, "ids": t.encode(p).ids} for p in GO_PROMPTS],
        "chat": [{"messages": m, "ids": t.encode(render_chat(m), add_special_tokens=False).ids} for m in GO_CHATS],
        "output_ids": list(range(len(OUTPUT))),
        "output_text": OUTPUT_TEXT,
    }
    (path / "expect.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")


def stream_decode(tok, ids: List[int]) -> str:
    """The text of output ``ids`` as Hugging Face's streaming decoder gives it (what a
    frontend sends): characters once they are whole; bytes that never make one are
    never sent (``decode`` would show them as U+FFFD)."""
    from tokenizers.decoders import DecodeStream

    ds = DecodeStream(skip_special_tokens=True)
    return "".join(s for s in (ds.step(tok, i) for i in ids) if s is not None)
