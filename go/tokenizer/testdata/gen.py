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
import random  # noqa: E402
import sys  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from tokenizers.decoders import DecodeStream  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# ---------------------------------------------------------------- corpus

WORDS = """the of and to a in is it you that he was for on are with as I his they be at one have this
from or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know water
than call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port large spell add even land
here must big high such follow act why ask men change went light kind off need house picture try us
again animal point mother world near build self earth father head stand own page should country found
answer school grow study still learn plant cover food sun four between state keep eye never last let
thought city tree cross farm hard start might story saw far sea draw left late run while press close
night real life few north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care second book carry took
science eat room friend began idea fish mountain stop once base hear horse cut sure watch color face
wood main enough plain girl usual young ready above ever red list though feel talk bird soon body dog
family direct pose leave song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass since top whole king space
heard best hour better true during hundred five remember step early hold west ground interest reach
fast verb sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure star box noun field
rest correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch multiply
nothing course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate
miss brought heat snow tire bring yes distant fill east paint language among""".split()

CONTRACTIONS = ["don't", "it's", "we're", "I'll", "they've", "I'm", "she'd", "can't", "won't", "that's",
                "IT'S", "We'RE", "you'd", "he'll"]

MULTI = [
    "Le café était très bon, n'est-ce pas ? Où est l'hôtel ?",
    "Größere Straßen führen über die Brücke nach Köln.",
    "¿Dónde está la biblioteca? ¡Mañana será otro día!",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Καλημέρα κόσμε, τι κάνεις;",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "こんにちは世界。東京は大きな都市です。カタカナとひらがな。",
    "안녕하세요 세계! 한국어 문장입니다.",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "שלום עולם",
    "Tiếng Việt có dấu: người, được, những.",
    "emoji 🙂 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ 🤖",
    "maths: ∑ x² ≤ ∞, ½ + ⅓ ≈ 0.83, α β γ → ∀x ∃y",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const x = {a: 1, b: [2, 3], c: \"str\"};  // comment\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;\n",
    "if err != nil {\n\treturn fmt.Errorf(\"read %s: %w\", path, err)\n}\n",
    "<div class=\"main\"><p>Hello &amp; welcome</p></div>\n",
    "$ ls -la /usr/local/bin | grep -v '^d' > out.txt 2>&1\n",
    "    x = np.array([[1.0, 2.5], [3.25, -4e-3]])\n\n\n",
]


def corpus(seed, n):
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(WORDS))]
    lines = []
    for _ in range(n):
        k = rnd.random()
        if k < 0.55:
            ws = rnd.choices(WORDS, weights, k=rnd.randint(3, 18))
            if rnd.random() < 0.3:
                ws[rnd.randrange(len(ws))] = rnd.choice(CONTRACTIONS)
            if rnd.random() < 0.3:
                ws[rnd.randrange(len(ws))] = str(rnd.choice([rnd.randint(0, 99), rnd.randint(100, 99999),
                                                            1990 + rnd.randint(0, 35)]))
            s = " ".join(ws)
            s = s[0].upper() + s[1:] + rnd.choice([".", ".", "!", "?", ",", ":", ";", "..."])
        elif k < 0.75:
            s = rnd.choice(MULTI)
        elif k < 0.92:
            s = rnd.choice(CODE)
        else:
            s = rnd.choice(["  ", "\t", "\n", "   \n", "1,234,567.89", "3.14159", "(555) 010-9999",
                            "https://example.com/path?q=1&r=two#frag", "user@example.org", "!!!???", "---"])
        lines.append(s)
    return lines


TRAIN = corpus(1, 2500)


def lexicon(seed, n):
    """n pseudo-words (syllable strings) for the benchmark corpus, so that
    a BPE keeps finding merges up to a realistic vocabulary size."""
    rnd = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br",
              "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "str", "th", "tr", "qu", "sp"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "y", "oo"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck", "x", "rt", "th", "ss"]
    words = set(WORDS)
    while len(words) < n:
        w = "".join(rnd.choice(onsets) + rnd.choice(vowels) + rnd.choice(codas)
                    for _ in range(rnd.choice([1, 2, 2, 3, 3, 4])))
        words.add(w + rnd.choice(["", "", "", "s", "ed", "ing", "ly", "tion", "er"]))
    return sorted(words)


def rich_corpus(seed, n):
    rnd = random.Random(seed)
    lex = lexicon(5, 40000)
    rnd.shuffle(lex)
    weights = [1.0 / (i + 1) ** 1.05 for i in range(len(lex))]
    lines = []
    for _ in range(n):
        k = rnd.random()
        if k < 0.8:
            ws = rnd.choices(lex, weights, k=rnd.randint(4, 24))
            for j in range(len(ws)):
                r = rnd.random()
                if r < 0.08:
                    ws[j] = ws[j].capitalize()
                elif r < 0.1:
                    ws[j] += rnd.choice([",", ",", ";", ":", "'s", "n't"])
                elif r < 0.12:
                    ws[j] = str(rnd.randint(0, 10 ** rnd.randint(1, 6)))
                elif r < 0.13:
                    ws[j] = "(" + ws[j] + ")"
            s = " ".join(ws)
            lines.append(s[0].upper() + s[1:] + rnd.choice([".", ".", ".", "?", "!"]))
        elif k < 0.88:
            lines.append(rnd.choice(CODE))
        elif k < 0.96:
            lines.append(rnd.choice(MULTI))
        else:
            lines.append("")
    return lines

# ---------------------------------------------------------------- inputs

COMMON = [
    "", " ", "  ", "     ", "\t", "\n", "\n\n", "\r\n", " \n ", "\n \n", "\t\t  \n\n ", "a", "hello",
    " hello", "hello ", "  hello  world  ", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "I'm he's THEY'RE we've you'd she'll x'sa x'Sa x'\u017fa x'ReB 'tis", "don't can't won't it's",
    "tab\tseparated\tvalues", "line1\nline2\r\nline3\n\n\nline4", "trailing newline\n", "  \n\nleading",
    "a  b   c    d", "word  \n  word", "hi!\n\n\nyo", "end.   ", "  x", "x  \r\n  y",
    "你好，世界", "こんにちは世界", "안녕하세요", "مرحبا بالعالم", "नमस्ते", "Привет мир", "Καλημέρα",
    "🙂👍🏽👨‍👩‍👧🇫🇷", "emoji 🙂 and more 🤖!", "e\u0301 n\u0303 a\u030a \u0301start", "caf\u00e9 cafe\u0301",
    "\ufb01 \u2167 \u2460 \u00bd \u00b2 \u00a0nbsp\u3000ideo", "\u0000\u0001\u007f\u0085\u200b\u200d\u2028\u2029",
    "\ufffd\U0001f9ff\U00010348\ue000", "1234567890", "3.14159 1,000,000 -42 +7 1e-9", "٣٤٥٦ ١٢",
    "def f(x):\n    return x**2  # comment\n", "    indented\n\tcode\n", "{\"a\": [1, 2, null]}",
    "http://example.com/a/b?q=1&r=2#x", "!!!???...,,,;;;", "a-b--c---d", "CamelCaseWordsHere", "snake_case_id",
    "MiXeD CaSe TeXt", "ALL CAPS SENTENCE", "x" * 200, "ab" * 80, " " * 40 + "x", "\n" * 12,
    "word" + " " * 17, "Größe Straße ǅ İstanbul ΣΑΣ", "new york New York NEW YORK", "the cat sat on the cat's mat",
    "categories cat. cat! (cat) concatenate", "mask <mask> tokens", "hello world Hello World", "MiXeD mixed",
]


FUZZ_ALPHABET = (list(" \t\r\n\n'") + list("aAsStTeElLmMdDrRvV") + ["\u017f", "\u00a0", "\u3000", "\u2028", "\u0085"]
                 + list("09٣²½") + list(".,!?-_()[]{}<>|/\\\"#$%&*+=@^`~") + ["é", "e\u0301", "\u0301", "ß", "İ", "Σ",
                 "你", "好", "こ", "ん", "한", "م", "न", "्", "🙂", "👍🏽", "\u200d", "🇫", "\ufb01", "\u2167", "\x00",
                 "\x1c", "\x7f", "\ufeff", "\u200b", "\ue000", "\U00010348"] + ["hello", "world", " the", "cat", "New",
                 " York", "\r\n", "  ", "'s", "'LL", "ab", "word"])


def fuzz_inputs(seed, specials, n=60):
    rnd = random.Random(seed)
    pool = FUZZ_ALPHABET + list(specials) + [t[: len(t) // 2] for t in specials]
    return ["".join(rnd.choice(pool) for _ in range(rnd.randint(0, 24))) for _ in range(n)]


def special_cases(toks):
    out = []
    for t in toks:
        out += [t, "a" + t + "b", " " + t + " ", t + t, "x " + t + "\ny", t + " hello", "hello" + t,
                "  " + t + "  world  "]
    if len(toks) >= 2:
        out.append(toks[0] + "system" + toks[1] + "\n\nYou are helpful." + toks[-1])
        out.append("".join(toks))
    return out


# ---------------------------------------------------------------- helpers


def train(tok, trainer, lines=TRAIN):
    tok.train_from_iterator(lines, trainer)
    return tok


def reload(tok):
    return Tokenizer.from_str(tok.to_str())


def surgery(tok, fn):
    d = json.loads(tok.to_str())
    fn(d)
    return Tokenizer.from_str(json.dumps(d))


def bpe_trainer(n, **kw):
    return trainers.BpeTrainer(vocab_size=n, show_progress=False, **kw)


def alphabet(tok, n):
    """The n most frequent characters of the training words (ties by code
    point). Training with them as the initial alphabet and n as the limit
    keeps exactly them, where a bare limit would break ties at random."""
    counts = {}
    for line in TRAIN:
        if tok.normalizer is not None:
            line = tok.normalizer.normalize_str(line)
        words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(line)] if tok.pre_tokenizer else [line]
        for w in words:
            for c in w:
                counts[c] = counts.get(c, 0) + 1
    return sorted(counts, key=lambda c: (-counts[c], c))[:n]


def limited(tok, n):
    return {"initial_alphabet": alphabet(tok, n), "limit_alphabet": n}


def byte_alphabet():
    return pre_tokenizers.ByteLevel.alphabet()


def max_id(tok):
    return max(tok.get_vocab(with_added_tokens=True).values())


def write_family(name, tok, specials=(), extra=(), stream_prompts=True):
    tok = reload(tok)  # what Go sees: the saved file
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    rnd = random.Random(name)
    inputs = list(dict.fromkeys(COMMON + special_cases(list(specials)) + list(extra)
                                + fuzz_inputs(name, specials)))
    cases = []
    for text in inputs:
        ids = tok.encode(text, add_special_tokens=True).ids
        raw = tok.encode(text, add_special_tokens=False).ids
        c = compact({"text": text, "ids": ids, "ids_no_special": raw,
                     "decode": tok.decode(ids, skip_special_tokens=True),
                     "decode_keep": tok.decode(ids, skip_special_tokens=False)})
        # The stages on their own: the normalizer, and the pre-tokenizer
        # applied to the raw text.
        if len(text) <= 120:
            if tok.normalizer is not None:
                c["normalized"] = tok.normalizer.normalize_str(text)
            if tok.pre_tokenizer is not None:
                c["pieces"] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        cases.append(c)
    top = max_id(tok)
    decodes = []
    for _ in range(30):
        ids = [rnd.randrange(top + 3) for _ in range(rnd.randint(1, 12))]
        decodes.append(compact({"ids": ids, "decode": tok.decode(ids, skip_special_tokens=True),
                                "decode_keep": tok.decode(ids, skip_special_tokens=False)}))
    for c in cases[:: max(1, len(cases) // 25)]:
        if len(c["ids"]) > 1:
            cut = c["ids"][: rnd.randint(1, len(c["ids"]) - 1)]
            decodes.append(compact({"ids": cut, "decode": tok.decode(cut, skip_special_tokens=True),
                                    "decode_keep": tok.decode(cut, skip_special_tokens=False)}))
    streams = []
    stream_texts = ["Hello, world! 你好 🙂👍🏽 é", " leading space and  double", "x" + "".join(specials[:2]) + " y",
                    "emoji 🤖 \u0301 ٣ x", "line\n\nnext"]
    for text in stream_texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        for skip in (True, False):
            for prompt in ([], tok.encode("User: hi there\nAssistant:", add_special_tokens=True).ids):
                if prompt and not stream_prompts:
                    continue
                ctx = []
                for i in reversed(prompt):
                    if len(ctx) == 5:
                        break
                    t = tok.id_to_token(i)
                    if t is None or (skip and i in special_ids(tok)):
                        continue
                    ctx.insert(0, i)
                ds = DecodeStream(ids=list(ctx), skip_special_tokens=skip)
                chunks = [ds.step(tok, i) or "" for i in ids]
                streams.append({"prompt": prompt, "context": ctx, "ids": ids, "skip": skip, "chunks": chunks})
    meta = {
        "tokenizers_version": tokenizers.__version__,
        "max_id": top,
        "specials": sorted(special_ids(tok)),
        "added": {t.content: i for i, t in tok.get_added_tokens_decoder().items()},
        "id_to_token": {str(i): tok.id_to_token(i) for i in sorted(set([0, 1, 2, top, top // 2, top + 1]))},
    }
    with open(os.path.join(d, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "cases": cases, "decodes": decodes, "streams": streams}, f,
                  ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def compact(c):
    """Drops ids_no_special and decode_keep where they equal ids and decode."""
    if c.get("ids_no_special") == c["ids"]:
        del c["ids_no_special"]
    if c["decode_keep"] == c["decode"]:
        del c["decode_keep"]
    return c


def special_ids(tok):
    return {i for i, t in tok.get_added_tokens_decoder().items() if t.special}


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
