"""The shared parts of gen.py (which see): the training corpus, the inputs every
family's vectors are made of, the training helpers, and write_family, which writes a
family's tokenizer.json and cases.json. Imported by gen.py, run from its directory.
"""

import os

# One thread: the trainers' parallel reductions would make their results
# (and so the files) vary from run to run. Set before tokenizers is imported.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import json  # noqa: E402
import random  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer, pre_tokenizers, trainers  # noqa: E402
from tokenizers.decoders import DecodeStream  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


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
