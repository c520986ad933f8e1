"""Make a tiny random Llama in the Hugging Face layout, offline, for GPU smoke runs.

    python python/benchmarks/gpu/make_tiny_llama.py /tmp/tiny-llama

writes config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json (with the chat template) and chat_template.jinja. Nothing is downloaded: the
vocabulary is a built-in list of common English words padded with made-up
syllable words (a WordLevel tokenizer, split on whitespace and punctuation),
and the weights are random (seeded). The model is 2 layers of hidden size 256,
4 heads of 64 (about 3 M parameters in bf16), so vLLM loads it in a second.

Needs torch, transformers (5.x) and tokenizers; it runs on a CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
UNK, BOS, EOS, PAD, IM_START, IM_END = SPECIAL

# The first words are real ones so that a prompt reads as text; the rest of the
# vocabulary is pseudo-words built from syllables, enough to reach --vocab.
COMMON = """
user assistant system tool hello hi hey thanks ok okay quick lazy fox jumps jumped
mat cats dogs
the of and to a in is it you that he was for on are with as i his they be at one
have this from or had by hot word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many
then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under
name very through just form sentence great think say help low line differ turn
cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here
must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant
cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night
real life few north open seem together next white children begin got walk example
ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question
happen complete ship area half rock order fire south problem piece told knew pass
since top whole king space heard best hour better true during hundred five remember
step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure
star box noun field rest correct able pound done beauty drive stood contain front
teach week final gave green oh quick develop ocean warm free minute strong special
mind behind clear tail produce fact street inch multiply nothing course stay wheel
full force blue object decide surface deep moon island foot system busy test record
boat common gold possible plane stead dry wonder laugh thousand ago ran check game
shape equate miss brought heat snow tire bring yes distant fill east paint language
among grand ball yet wave drop heart am present heavy dance engine position arm wide
sail material size vary settle speak weight general ice matter circle pair include
divide syllable felt perhaps pick sudden count square reason length represent art
subject region energy hunt probable bed brother egg ride cell believe fraction forest
sit race window store summer train sleep prove lone leg exercise wall catch mount
wish sky board joy winter sat written wild instrument kept glass grass cow job edge
sign visit past soft fun bright gas weather month million bear finish happy hope
flower clothe strange gone jump baby eight village meet root buy raise solve metal
whether push seven paragraph third shall held hair describe cook floor either result
burn hill safe cat century consider type law bit coast copy phrase silent tall sand
soil roll temperature finger industry value fight lie beat excite natural view sense
ear else quite broke case middle kill son lake moment scale loud spring observe
child straight consonant nation dictionary milk speed method organ pay age section
dress cloud surprise quiet stone tiny climb cool design poor lot experiment bottom
key iron single stick flat twenty skin smile crease hole trade melody trip office
receive row mouth exact symbol die least trouble shout except wrote seed tone join
suggest clean break lady yard rise bad blow oil blood touch grew cent mix team wire
cost lost brown wear garden equal sent choose fell fit flow fair bank collect save
control decimal gentle woman captain practice separate difficult doctor please
protect noon whose locate ring character insect caught period indicate radio spoke
atom human history effect electric expect crop modern element hit student corner
party supply bone rail imagine provide agree thus capital chair danger fruit rich
thick soldier process operate guess necessary sharp wing create neighbor wash bat
rather crowd corn compare poem string bell depend meat rub tube famous dollar stream
fear sight thin triangle planet hurry chief colony clock mine tie enter major fresh
search send yellow gun allow print dead spot desert suit current lift rose continue
block chart hat sell success company subtract event particular deal swim term
opposite wife shoe shoulder spread arrange camp invent cotton born determine quart
nine truck noise level chance gather shop stretch throw shine property column
molecule select wrong gray repeat require broad prepare salt nose plural anger claim
continent oxygen sugar death pretty skill women season solution magnet silver thank
branch match suffix especially fig afraid huge sister steel discuss forward similar
guide experience score apple bought led pitch coat mass card band rope slip win dream
evening condition feed tool total basic smell valley nor double seat arrive master
track parent shore division sheet substance favor connect post spend chord fat glad
original share station dad bread charge proper bar offer segment slave duck instant
market degree populate chick dear enemy reply drink occur support speech nature range
steam motion path liquid log meant quotient teeth shell neck
""".split()

ONSETS = [
    "b",
    "br",
    "c",
    "ch",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "pl",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "w",
    "z",
]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
CODAS = ["", "n", "r", "s", "t", "l", "m", "nd", "st"]

PUNCT = [".", ",", "?", "!", ":", ";", "'", '"', "(", ")", "-"]
DIGITS = [str(i) for i in range(10)]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}"
)


def vocabulary(size: int) -> list[str]:
    """``size`` distinct tokens: the special ones, punctuation and digits, the common
    words, then syllable pseudo-words (two, then three syllables) until full."""
    words: list[str] = []
    seen: set[str] = set()

    def add(w: str) -> None:
        if w not in seen and len(words) < size:
            seen.add(w)
            words.append(w)

    for w in itertools.chain(SPECIAL, PUNCT, DIGITS, COMMON):
        add(w)
    syllables = [o + v + c for o in ONSETS for v in VOWELS for c in CODAS]
    for n in (2, 3):
        if len(words) >= size:
            break
        for parts in itertools.product(syllables, repeat=n):
            if len(words) >= size:
                break
            add("".join(parts))
    if len(words) < size:
        raise SystemExit(f"cannot make {size} distinct tokens")
    return words


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = vocabulary(vocab_size)
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    # Special tokens are matched before pre-tokenization (so "<|im_start|>" is one
    # token) and are dropped by decode(skip_special_tokens=True). With no decoder set,
    # decode() joins the words with single spaces.
    tok.add_special_tokens(SPECIAL)
    # As Llama's tokenizers do: encode() puts <s> first unless add_special_tokens=False
    # (chat templates write their own bos_token and are encoded without it).
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, SPECIAL.index(BOS))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the model directory to write (created; files in it are replaced)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(args.vocab)
    vocab_size = len(tokenizer)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL}

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_positions,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=False,
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
    )
    config.dtype = torch.bfloat16  # written as "dtype": "bfloat16" (transformers 5)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)

    GenerationConfig(
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        pad_token_id=ids[PAD],
        max_length=args.max_positions,
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)
    # transformers 5 writes the template to chat_template.jinja and names its own
    # backend class; also keep the template in tokenizer_config.json and name the
    # class every transformers version knows, so older loaders read the same.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = CHAT_TEMPLATE
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")

    # A one-line check that the directory reads back as written.
    cfg = json.loads((out / "config.json").read_text())
    files = sorted(p.name for p in out.iterdir())
    params = sum(p.numel() for p in model.parameters())
    print(
        f"tiny llama: {out} vocab={vocab_size} hidden={cfg['hidden_size']} layers={cfg['num_hidden_layers']} "
        f"heads={cfg['num_attention_heads']}x{args.head_dim} params={params} files={','.join(files)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
