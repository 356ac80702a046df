#!/usr/bin/env python3
"""Writes data/unicode_tables.{h,c}: the per-code-point facts BERT's basic
tokenizer needs, taken from this Python's unicodedata.

    python3 scripts/gen_unicode_tables.py            # rewrite the tables
    python3 scripts/gen_unicode_tables.py --check    # exit 1 if they would change

The tables pin a Unicode version: the reference BERT tokenizer (transformers'
BertTokenizer, pure Python) asks unicodedata, so its ids depend on the Python
that runs it. tests/tokenizer/gen_reference.py refuses to run under a Python
whose Unicode version differs from the one written here; regenerate both with
the same Python.

What each record holds, mirroring transformers' BertTokenizer with
do_lower_case=True (see data/unicode.h for how data/tokenizer.c uses it):
  DROP   the character is deleted (U+0000, U+FFFD, category C* but \\t \\n \\r)
  SPACE  it separates words (\\t \\n \\r, space, category Zs, or str.isspace())
  CJK    it is a word of its own (the ranges of BasicTokenizer._is_chinese_char)
  PUNCT  it is a word of its own after folding (ASCII 33-47, 58-64, 91-96,
         123-126, category P*)
  MN     it is removed after folding (category Mn: strip_accents)
  ccc    canonical combining class (NFD's reordering)
  fold   str.lower() then the full canonical decomposition (NFD of one
         character), when that is not the character itself

Checked here, so data/tokenizer.c may rely on it: lowercasing never changes
whether a character is DROP, SPACE or CJK; a fold never yields a DROP or SPACE
character; PUNCT characters have ccc 0; Hangul syllables decompose
algorithmically (data/unicode.c) and are left out of the fold table.
"""
import argparse
import os
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_H = os.path.join(ROOT, "data", "unicode_tables.h")
OUT_C = os.path.join(ROOT, "data", "unicode_tables.c")

DROP, SPACE, CJK, PUNCT, MN = 1, 2, 4, 8, 16
FLAG_NAMES = [(DROP, "MMP_UC_DROP"), (SPACE, "MMP_UC_SPACE"), (CJK, "MMP_UC_CJK"),
              (PUNCT, "MMP_UC_PUNCT"), (MN, "MMP_UC_MN")]
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
SHIFT = 7  # 128-code-point blocks: the smallest tables of the shifts tried (6..9)

CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def is_drop(ch):
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD:
        return True
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def is_space(ch):
    # _is_whitespace, plus what str.split() splits on after _clean_text
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs" or ch.isspace()


def is_cjk(ch):
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def is_punct(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def input_class(ch):
    if is_drop(ch):
        return DROP
    if is_space(ch):
        return SPACE
    if is_cjk(ch):
        return CJK
    return 0


def build():
    records = {}  # (flags, ccc, fold) -> index
    record_list = []
    pool = []
    pool_at = {}
    per_cp = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            key = (DROP, 0, ())  # never decoded from valid UTF-8
        else:
            ch = chr(cp)
            low = ch.lower()  # PreTrainedTokenizer.tokenize's lowercasing pass
            classes = {input_class(c) for c in low}
            assert len(classes) == 1 and classes == {input_class(ch)}, hex(cp)
            flags = input_class(ch)
            if is_punct(ch):
                flags |= PUNCT
            if unicodedata.category(ch) == "Mn":
                flags |= MN
            ccc = unicodedata.combining(ch)
            assert not (flags & PUNCT) or ccc == 0, hex(cp)
            fold = ()
            if not flags & (DROP | SPACE) and not HANGUL_FIRST <= cp <= HANGUL_LAST:
                # BasicTokenizer lowercases again per word, then strip_accents' NFD
                f = unicodedata.normalize("NFD", low.lower())
                if f != ch:
                    fold = tuple(ord(c) for c in f)
                    for c in f:
                        assert input_class(c) in (0, CJK), (hex(cp), hex(ord(c)))
            key = (flags, ccc, fold)
        if key not in records:
            records[key] = len(record_list)
            record_list.append(key)
            if key[2] and key[2] not in pool_at:
                pool_at[key[2]] = len(pool)
                pool.extend(key[2])
        per_cp.append(records[key])
    assert len(record_list) < 65536 and len(pool) < 65536
    block = 1 << SHIFT
    blocks = {}
    stage1, stage2 = [], []
    for b in range(0, 0x110000, block):
        chunk = tuple(per_cp[b:b + block])
        if chunk not in blocks:
            blocks[chunk] = len(blocks)
            stage2.extend(chunk)
        stage1.append(blocks[chunk])
    assert len(blocks) < 65536
    fold_max = max(len(k[2]) for k in record_list)
    return record_list, pool, pool_at, stage1, stage2, fold_max


def flag_expr(flags):
    names = [n for bit, n in FLAG_NAMES if flags & bit]
    return " | ".join(names) if names else "0"


def wrap(items, indent="    ", width=100):
    lines, cur = [], indent
    for it in items:
        piece = it + ","
        if len(cur) + len(piece) + 1 > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent
        cur += piece + " "
    if cur.strip():
        lines.append(cur.rstrip())
    return "\n".join(lines)


def render():
    record_list, pool, pool_at, stage1, stage2, fold_max = build()
    ver = unicodedata.unidata_version
    py = "%d.%d.%d" % sys.version_info[:3]
    banner = ("/* Generated by scripts/gen_unicode_tables.py from Python %s's unicodedata\n"
              " * (Unicode %s). Do not edit: rerun the script (with the Python that also\n"
              " * regenerates tests/tokenizer/expected.txt). */\n" % (py, ver))
    h = banner + """#ifndef MMP_DATA_UNICODE_TABLES_H
#define MMP_DATA_UNICODE_TABLES_H

#include <stdint.h>

#define MMP_UCT_UNICODE_VERSION "%s"
#define MMP_UCT_SHIFT %d
#define MMP_UCT_FOLD_MAX %d

/* flags: MMP_UC_* of data/unicode.h; fold_len 0: the character folds to itself. */
typedef struct mmp_uct_record {
    uint8_t flags, ccc, fold_len;
    uint16_t fold_off; /* into mmp_uct_folds */
} mmp_uct_record;

extern const uint16_t mmp_uct_stage1[%d]; /* cp >> SHIFT -> block */
extern const uint16_t mmp_uct_stage2[%d]; /* block << SHIFT | low bits -> record */
extern const mmp_uct_record mmp_uct_records[%d];
extern const uint32_t mmp_uct_folds[%d];

#endif
""" % (ver, SHIFT, fold_max, len(stage1), len(stage2), len(record_list), max(len(pool), 1))
    c = [banner, '#include "data/unicode_tables.h"\n\n#include "data/unicode.h"\n']
    c.append("const uint16_t mmp_uct_stage1[%d] = {\n%s\n};\n" %
             (len(stage1), wrap([str(x) for x in stage1])))
    c.append("const uint16_t mmp_uct_stage2[%d] = {\n%s\n};\n" %
             (len(stage2), wrap([str(x) for x in stage2])))
    recs = ["{%s, %d, %d, %d}" % (flag_expr(f), ccc, len(fold), pool_at[fold] if fold else 0)
            for f, ccc, fold in record_list]
    c.append("const mmp_uct_record mmp_uct_records[%d] = {\n%s\n};\n" %
             (len(record_list), wrap(recs)))
    c.append("const uint32_t mmp_uct_folds[%d] = {\n%s\n};\n" %
             (max(len(pool), 1), wrap(["0x%x" % x for x in pool] or ["0"])))
    return h, "\n".join(c)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the tables would change")
    args = ap.parse_args()
    h, c = render()
    if args.check:
        same = all(os.path.exists(p) and open(p, encoding="utf-8").read() == text
                   for p, text in ((OUT_H, h), (OUT_C, c)))
        print("unicode tables %s" % ("up to date" if same else "differ: rerun without --check"))
        return 0 if same else 1
    for p, text in ((OUT_H, h), (OUT_C, c)):
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s (%d bytes)" % (os.path.relpath(p, ROOT), len(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
