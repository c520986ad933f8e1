#!/usr/bin/env python3
"""Test vectors of go/tokenizer, made with the reference Python `tokenizers`.

For each family of tokenizer.json that chat models ship, this builds a small
tokenizer (trained on the built-in corpus below, or assembled from trained
parts), saves it as <family>/tokenizer.json, and writes <family>/cases.json:
the ids `tokenizers` gives for many adversarial inputs (with and without
special tokens), what its normalizer and pre-tokenizer make of them on
their own, its decode of them and of random id lists (skipping special
tokens and not), and DecodeStream chunks. It also writes the
benchmark tokenizer (bench/tokenizer.json.gz, a Llama-3-style byte-level
BPE with a 16k vocabulary) and its ~4k-token prompt (bench/prompt.txt).
The families and the benchmark tokenizer are here; the corpus, the inputs
and the writing of a family's files are in gen_cases.py, beside it.

Everything is deterministic. To rerun (from the repository root):

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers==0.23.3
    /tmp/tokvenv/bin/python go/tokenizer/testdata/gen.py

then `go test ./go/tokenizer/` (add --no-bench to skip rebuilding bench/).
"""

import os

# One thread: the trainers' parallel reductions would make their results
# (and so the files) vary from run to run.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from gen_cases import (  # noqa: E402
    TRAIN, alphabet, bpe_trainer, byte_alphabet, limited, rich_corpus, surgery, train, write_family,
)

HERE = os.path.dirname(os.path.abspath(__file__))

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---------------------------------------------------------------- families


def gpt2(prefix_space):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=prefix_space)
    train(tok, bpe_trainer(520, initial_alphabet=byte_alphabet(), special_tokens=["<|endoftext|>"]))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("[RS]", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("cat", single_word=True), AddedToken("New York", normalized=False)])
    return tok


def byte_level_split(pattern, vocab, normalizer=None, ignore_merges=False):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, bpe_trainer(vocab, initial_alphabet=byte_alphabet()))

    def fix(d):
        d["model"]["ignore_merges"] = ignore_merges
        if ignore_merges:
            # Tokens no merge produces: only ignore_merges finds them whole.
            v = d["model"]["vocab"]
            for w in ["Ġhello", "Ġworld", "ĠHello", "hello"]:
                if w not in v:
                    v[w] = len(v)
    return surgery(tok, fix)


def llama3():
    tok = byte_level_split(LLAMA3, 700, ignore_merges=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                "<|reserved_special_token_0|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"]


def qwen2():
    tok = byte_level_split(QWEN2, 600, normalizer=normalizers.NFC())
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, ["<|im_start|>", "<|im_end|>", "<think>", "<|endoftext|>"]


def llama2():
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t = Tokenizer(models.BPE())
    t.normalizer = norm
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)
    train(t, bpe_trainer(700, special_tokens=["<unk>", "<s>", "</s>"], **limited(t, 90)))
    d = json.loads(t.to_str())
    trained = d["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for w, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        if w not in vocab:
            vocab[w] = len(vocab)
    d["model"].update({"vocab": vocab, "byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>"})
    d["pre_tokenizer"] = None
    d["added_tokens"] = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, c in enumerate(["<unk>", "<s>", "</s>"])]
    tok = Tokenizer.from_str(json.dumps(d))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                                       special_tokens=[("<s>", 1)])
    return tok, ["<s>", "</s>", "<unk>"]


def metaspace(scheme, split, normalizer=None, byte_fallback=False):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
    tok.decoder = decoders.Metaspace(prepend_scheme=scheme, split=split)
    # Trained with splitting (the pieces stay small); the model does not change.
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if normalizer is not None:
        trainer_tok.normalizer = normalizer
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=True)
    train(trainer_tok, bpe_trainer(450, special_tokens=["<unk>", "<s>", "</s>"], **limited(trainer_tok, 100)))
    tok.model = trainer_tok.model
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>", "<|user|>"]])
    if byte_fallback:
        def fix(d):
            v = d["model"]["vocab"]
            for b in range(256):
                v.setdefault("<0x%02X>" % b, len(v))
            d["model"]["byte_fallback"] = True
            d["model"]["fuse_unk"] = True
            d["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, d["decoder"]]}
        tok = surgery(tok, fix)
    return tok, ["<s>", "<|user|>", "</s>"]


def wordlevel(pre, normalizer=None, template=False):
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    train(tok, trainers.WordLevelTrainer(vocab_size=400, special_tokens=["[UNK]", "[BOS]", "[EOS]"],
                                         show_progress=False))
    if template:
        tok.post_processor = processors.TemplateProcessing(
            single="[BOS] $A [EOS]", pair="[BOS] $A [EOS] $B:1 [EOS]:1",
            special_tokens=[("[BOS]", tok.token_to_id("[BOS]")), ("[EOS]", tok.token_to_id("[EOS]"))])
    return tok, ["[BOS]", "[EOS]", "[UNK]"]


def wordpiece():
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # The vocabulary of a BPE with the "##" prefix, as the library's
    # WordPiece trainer builds it, but with ties broken in a fixed order.
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab, _ = simple_bpe(tok, 90, 400, prefix="##")
    vocab = specials + vocab
    tok.model = models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]")
    tok.add_special_tokens(specials)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok, ["[CLS]", "[SEP]", "[MASK]"]


def roberta():
    tok = gpt2(True)
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("[RS]")),
                                                      ("<s>", tok.token_to_id("<|endoftext|>")))
    return tok, ["<|endoftext|>", "[RS]", "<mask>"]


def unigram():
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    train(tok, trainers.UnigramTrainer(vocab_size=400, unk_token="<unk>", special_tokens=["<unk>", "<s>", "</s>"],
                                       show_progress=False))

    def fix(d):
        # The trainer's scores vary in their last digits from run to run:
        # the pieces get scores of their own (log frequency in the training
        # text), and a fixed order.
        text = "".join(tok.normalizer.normalize_str(" " + line).replace(" ", "▁") for line in TRAIN)
        specials = ["<unk>", "<s>", "</s>"]
        pieces = sorted(p for p, _ in d["model"]["vocab"] if p not in specials)
        score = {p: round(math.log((text.count(p) + 1) / len(text)), 6) for p in pieces}
        v = [[p, 0.0] for p in specials] + sorted(([p, score[p]] for p in pieces), key=lambda e: (-e[1], e[0]))
        d["model"]["unk_id"] = 0
        for t in d["added_tokens"]:
            t["id"] = [p for p, _ in v].index(t["content"])
        v += [["<0x%02X>" % b, -20.0] for b in range(256)]
        d["model"]["vocab"] = v
        d["model"]["byte_fallback"] = True
        d["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, d["decoder"]]}
    tok = surgery(tok, fix)
    return tok, ["<s>", "</s>"]


def split_family(pre, normalizer=None, vocab=320):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre + [pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, bpe_trainer(vocab, initial_alphabet=byte_alphabet()))
    return tok


def simple_bpe(tok, n_alphabet, n_merges, prefix="", suffix=""):
    """Vocabulary and merges of a BPE trained on the training words, with
    ties broken by the pair's strings: the library's trainer numbers the
    prefixed/suffixed symbols in no fixed order, and so breaks ties
    differently from run to run."""
    words = {}
    for line in TRAIN:
        if tok.normalizer is not None:
            line = tok.normalizer.normalize_str(line)
        for w, _ in tok.pre_tokenizer.pre_tokenize_str(line):
            words[w] = words.get(w, 0) + 1
    alpha = set(alphabet(tok, n_alphabet))
    split = {}
    for w in words:
        if all(c in alpha for c in w):
            syms = [c if i == 0 else prefix + c for i, c in enumerate(w)]
            syms[-1] += suffix
            split[w] = syms
    vocab = sorted({x for syms in split.values() for x in syms} | alpha)
    merges = []
    for _ in range(n_merges):
        counts = {}
        for w, syms in split.items():
            for a, b in zip(syms, syms[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + words[w]
        if not counts:
            break
        a, b = min(counts, key=lambda p: (-counts[p], p))
        new = a + b[len(prefix):]
        merges.append([a, b])
        if new not in vocab:
            vocab.append(new)
        for w, syms in split.items():
            out, i = [], 0
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            split[w] = out
    return vocab, merges


def bpe_suffix():
    tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>", fuse_unk=True))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    vocab, merges = simple_bpe(tok, 60, 300, suffix="</w>")
    vocab = ["<unk>"] + vocab
    tok.model = models.BPE({w: i for i, w in enumerate(vocab)}, [tuple(m) for m in merges], unk_token="<unk>",
                           end_of_word_suffix="</w>", fuse_unk=True)
    tok.add_special_tokens(["<unk>"])
    return tok


def bpe_prefix():
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    vocab, merges = simple_bpe(tok, 60, 300, prefix="##")
    vocab = ["[UNK]"] + vocab
    tok.model = models.BPE({w: i for i, w in enumerate(vocab)}, [tuple(m) for m in merges], unk_token="[UNK]",
                           continuing_subword_prefix="##")
    tok.add_special_tokens(["[UNK]"])
    return tok


def added():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    train(tok, bpe_trainer(400, initial_alphabet=byte_alphabet()))
    tok.add_special_tokens([
        AddedToken("[SPECIAL]", special=True, normalized=False),
        AddedToken("<lstrip>", lstrip=True, special=True, normalized=False),
        AddedToken("<rstrip>", rstrip=True, special=True, normalized=False),
        AddedToken("<both>", lstrip=True, rstrip=True, special=True, normalized=False),
        AddedToken("<|a|>", special=True, normalized=False),
        AddedToken("<|a|>b", special=True, normalized=False),
    ])
    tok.add_tokens([
        AddedToken("Hello World", normalized=True),
        AddedToken("word", single_word=True, normalized=True),
        AddedToken("MiXeD", normalized=False),
        AddedToken("ab", normalized=True),
        AddedToken("éclair", normalized=True, lstrip=True),
    ])
    return tok, ["[SPECIAL]", "<lstrip>", "<rstrip>", "<both>", "<|a|>", "<|a|>b"]


ADDED_EXTRA = ["Hello World! hello world HELLO WORLD", "a word, words, sword, word.", "MiXeD mixed MIXED",
               "abab cab", "x  <lstrip>  y  <rstrip>  z  <both>  w", "<|a|>b<|a|>c<|a|>", "ÉCLAIR éclair",
               " \t<lstrip>", "<rstrip>\n\n\tq", "<both>", "  <both>  "]


def truncpad():
    tok, sp = wordlevel(pre_tokenizers.Whitespace(), template=True)
    tok.enable_truncation(max_length=9, direction="left")
    tok.enable_padding(direction="left", pad_id=0, pad_token="[UNK]", length=12, pad_to_multiple_of=5)
    return tok, sp


def truncright():
    tok, sp = llama3()
    tok.enable_truncation(max_length=7, strategy="only_first")
    tok.enable_padding(pad_id=5, pad_token="<pad>", pad_to_multiple_of=4)
    return tok, sp


def bench():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    big = rich_corpus(7, 150000)
    train(tok, bpe_trainer(16384, initial_alphabet=byte_alphabet()), big)
    tok = surgery(tok, lambda d: d["model"].__setitem__("ignore_merges", True))
    tok.add_special_tokens([AddedToken("<|begin_of_text|>", special=True, normalized=False),
                            AddedToken("<|eot_id|>", special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    d = os.path.join(HERE, "bench")
    os.makedirs(d, exist_ok=True)
    with gzip.GzipFile(os.path.join(d, "tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(tok.to_str().encode())
    # The prompt: about 4000 tokens of text from another draw of the corpus.
    lines = rich_corpus(99, 4000)
    text = ""
    for line in lines:
        if len(tok.encode(text + line + "\n").ids) > 4000:
            break
        text += line + "\n"
    with open(os.path.join(d, "prompt.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(d, "expect.json"), "w") as f:
        json.dump({"ids": tok.encode(text).ids}, f, separators=(",", ":"))


def main():
    write_family("gpt2", gpt2(False), ["<|endoftext|>", "<mask>", "[RS]"])
    write_family("gpt2_prefix", gpt2(True), ["<|endoftext|>", "<mask>", "[RS]"])
    write_family("llama3", *llama3())
    write_family("qwen2", *qwen2())
    write_family("llama2", *llama2())
    write_family("metaspace", *metaspace("always", True, normalizers.NFKC()))
    write_family("metaspace_first", *metaspace("first", False, byte_fallback=True))
    write_family("metaspace_never", *metaspace("never", True, normalizers.Sequence(
        [normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(), normalizers.Strip()])))
    write_family("wordlevel", *wordlevel(pre_tokenizers.Whitespace()))
    write_family("wordlevel_split", *wordlevel(pre_tokenizers.WhitespaceSplit(), normalizers.Lowercase(), True))
    write_family("wordpiece", *wordpiece())
    write_family("roberta", *roberta())
    write_family("unigram", *unigram())
    write_family("truncpad", *truncpad())
    write_family("truncright", *truncright())
    write_family("bpe_suffix", bpe_suffix())
    write_family("bpe_prefix", bpe_prefix())
    write_family("added", *added(), extra=ADDED_EXTRA)
    S = pre_tokenizers
    write_family("split_removed", split_family([S.Split(" ", "removed"), S.Digits(True)],
                                               normalizers.Replace(Regex(r"[0-9]{3,}"), "<n>")))
    write_family("split_prev", split_family([S.Split(Regex(r"\s+"), "merged_with_previous"),
                                             S.Punctuation("contiguous")], normalizers.NFD()))
    write_family("split_next", split_family([S.Split(Regex(r"[A-Z]"), "merged_with_next"), S.Digits(False)],
                                            normalizers.Strip()))
    write_family("split_contig", split_family([S.Split(Regex(r"\d"), "contiguous", invert=True),
                                               S.Punctuation("merged_with_next")], normalizers.NFKD()))
    write_family("split_regex", split_family([S.Split(Regex(r"(?i:hello|world)|\w+|[^\w\s]+|\s+"), "isolated"),
                                              S.Split(Regex(r"(?<=o)|(?=l)"), "removed")]))
    write_family("split_invert", split_family([S.Split(Regex(r"\w+"), "isolated", invert=True),
                                               S.Split("", "merged_with_previous"), S.Punctuation("removed")]))
    if "--no-bench" not in sys.argv:  # the slow part: a 16k-token BPE
        bench()


if __name__ == "__main__":
    main()
