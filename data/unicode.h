/* The Unicode facts BERT's basic tokenizer needs, per code point.
 *
 * They mirror transformers' BertTokenizer (do_lower_case=True) as it runs on
 * the Python that generated data/unicode_tables.c (scripts/
 * gen_unicode_tables.py; mmp_unicode_version() says which Unicode), so that
 * data/tokenizer.c gives the same ids as that reference. Pure lookups over
 * constant tables: thread-safe, never allocate. */
#ifndef MMP_DATA_UNICODE_H
#define MMP_DATA_UNICODE_H

#include <stdint.h>

/* What a code point is to the basic tokenizer. DROP, SPACE and CJK describe
 * a character of the input text (at most one is set); PUNCT and MN describe a
 * character after mmp_unicode_fold. */
enum {
    MMP_UC_DROP = 1,  /* deleted: U+0000, U+FFFD, category C* but \t \n \r */
    MMP_UC_SPACE = 2, /* ends a word: \t \n \r, category Zs, Python's str.isspace() */
    MMP_UC_CJK = 4,   /* a CJK ideograph (BERT's ranges): a word of its own */
    MMP_UC_PUNCT = 8, /* ASCII punctuation or category P*: a word of its own */
    MMP_UC_MN = 16,   /* category Mn: removed after folding (accent stripping) */
};

/* Most code points mmp_unicode_fold writes for one input code point. */
#define MMP_UC_FOLD_MAX 4

/* The Unicode version of the tables, e.g. "14.0.0". */
const char *mmp_unicode_version(void);

/* MMP_UC_* bits of cp; a cp above U+10FFFF is DROP. */
unsigned mmp_unicode_flags(uint32_t cp);

/* Canonical combining class of cp (0 for a starter or cp above U+10FFFF). */
unsigned mmp_unicode_ccc(uint32_t cp);

/* BERT's per-character folding: Python's str.lower() (full mappings, so
 * U+0130 becomes "i" U+0307), then the full canonical decomposition (NFD of
 * the one character, Hangul syllables included). Writes 1..MMP_UC_FOLD_MAX
 * code points to out and returns how many. The caller still owes NFD's
 * canonical reordering across characters and the removal of MN. */
int mmp_unicode_fold(uint32_t cp, uint32_t out[MMP_UC_FOLD_MAX]);

#endif
