"""A model directory in the Hugging Face layout, as a worker reads it.

The frontend speaks a model's own language (its tokenizer and chat template)
when the model's workers name its directory in their instance metadata
(``model_path``); see docs/openai-api.md. A worker reads three facts from the
directory itself:

- ``find(model)``: the directory of ``--model``: the path itself when it is one,
  else a local copy in the Hugging Face cache (never a download), else None;
- ``vocabulary(dir)``: the ids the mock engine may produce: the tokenizer's
  vocabulary without its special tokens (so the mock's output is the model's
  text, never an end-of-sequence or template marker);
- ``max_model_len(dir)``: the context length ``config.json`` declares.

And it serves the directory's text files to frontends that cannot read it (they run on
another machine): ``files_handler(dir)`` is the handler of the worker's
``<namespace>.backend.model_files`` endpoint (the protocol is the frontend's, in
go/frontend/modelfiles.go).

Reading is bounded by the frontend's own bounds (go/hfmodel's, which the native module
exports: ``max_tokenizer_bytes()``, ``max_config_bytes()``) and needs the standard library
only besides: the mock engine runs without ``tokenizers`` or ``transformers``.

What the worker publishes about the directory (its path and the checksum of its text
files) is its model card, built by the library: see ``model_card`` in cli/worker.py.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Set

from .._lib import native

__all__ = ["find", "vocabulary", "max_model_len", "files_handler", "max_tokenizer_bytes", "max_config_bytes"]


def max_tokenizer_bytes() -> int:
    """The most bytes of tokenizer.json read (go/hfmodel's MaxTokenizerBytes, the
    frontend's bound, from the native module)."""
    return int(native().MODEL_MAX_TOKENIZER_BYTES)


def max_config_bytes() -> int:
    """The most bytes of config.json (and the directory's other small files) read
    (go/hfmodel's MaxConfigBytes, from the native module)."""
    return int(native().MODEL_MAX_CONFIG_BYTES)


#: config.json keys that state the context length, as vLLM reads them (the
#: smallest present wins).
_LENGTH_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length", "max_seq_length", "seq_len",
)


def _read_json(path: str, limit: int) -> Any:
    size = os.path.getsize(path)
    if size > limit:
        raise ValueError(f"{path} has {size} bytes, more than the {limit} read")
    with open(path, "rb") as f:
        return json.loads(f.read(limit + 1))


def find(model: str) -> Optional[str]:
    """The absolute model directory of ``model`` (a path, or a name with a local
    copy in the Hugging Face cache), or None when there is none with a
    ``tokenizer.json``."""
    if os.path.isdir(model):
        path = os.path.abspath(model)
        return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None
    try:
        from huggingface_hub import snapshot_download  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        path = snapshot_download(model, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache (or not a repo name): no directory
        return None
    return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None


def vocabulary(path: str) -> List[int]:
    """The ids of ``path``'s tokenizer that are text: its model's vocabulary
    and its added tokens that are not special, sorted."""
    tok: Dict[str, Any] = _read_json(os.path.join(path, "tokenizer.json"), max_tokenizer_bytes())
    vocab = (tok.get("model") or {}).get("vocab") or {}
    ids: Set[int] = set()
    if isinstance(vocab, dict):  # BPE, WordLevel, WordPiece: token -> id
        ids.update(int(i) for i in vocab.values())
    elif isinstance(vocab, list):  # Unigram: [token, score] by id
        ids.update(range(len(vocab)))
    for added in tok.get("added_tokens") or []:
        if added.get("special"):
            ids.discard(int(added["id"]))
        else:
            ids.add(int(added["id"]))
    if not ids:
        raise ValueError(f"{path}/tokenizer.json has no vocabulary")
    return sorted(ids)


def max_model_len(path: str) -> Optional[int]:
    """The context length ``path``'s config.json declares (also under
    ``text_config``), or None."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return None
    cfg = _read_json(cfg_path, max_config_bytes())
    found: List[int] = []
    for section in (cfg, cfg.get("text_config") or {}):
        for key in _LENGTH_KEYS:
            v = section.get(key) if isinstance(section, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                found.append(v)
    return min(found) if found else None


#: A file a frontend may ask for: a plain name of a .json or .jinja file directly in the
#: model directory (never a path, never a hidden file).
_SERVED_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.(json|jinja)")
#: How many names one request may ask for, and the characters of one item's piece of text.
_MAX_NAMES = 16
_PIECE = 256 << 10


def files_handler(path: str) -> Callable[[Dict[str, Any]], AsyncIterator[Dict[str, Any]]]:
    """The handler that serves ``path``'s text files: ``{"files": [names]}`` is answered,
    per name, with ``{"name", "data"}`` pieces of its text and ``{"name", "end": True}``,
    or ``{"name", "missing": True}``. The directory is held open, so it is served as it
    was found even if it is renamed later; each file is read within max_tokenizer_bytes()."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    limit = max_tokenizer_bytes()

    def read(name: str) -> Optional[str]:
        try:
            st = os.stat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            raise ValueError(f"{name} has {st.st_size} bytes, more than the {limit} served")
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{name} has more than the {limit} bytes served")
        return data.decode("utf-8")

    async def model_files(request: Dict[str, Any]) -> AsyncIterator[Dict[str, Any]]:
        import asyncio

        names = request.get("files") if isinstance(request, dict) else None
        if not isinstance(names, list) or not 0 < len(names) <= _MAX_NAMES:
            raise ValueError(f'want {{"files": [1 to {_MAX_NAMES} names]}}')
        for name in names:
            if not isinstance(name, str) or not _SERVED_NAME.fullmatch(name):
                raise ValueError(f"not a file of the model directory that is served: {name!r}")
        loop = asyncio.get_running_loop()
        for name in names:
            text = await loop.run_in_executor(None, read, name)
            if text is None:
                yield {"name": name, "missing": True}
                continue
            for i in range(0, len(text), _PIECE):
                yield {"name": name, "data": text[i : i + _PIECE]}
            yield {"name": name, "end": True}

    return model_files
