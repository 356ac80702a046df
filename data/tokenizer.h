/* BERT's uncased WordPiece tokenizer over a vocab.txt.
 *
 * Its ids equal those of the reference, transformers' BertTokenizer (the
 * pure-Python one; do_lower_case=True, tokenize_chinese_chars=True,
 * strip_accents unset) run on the Python whose unicodedata generated
 * data/unicode_tables.c; tests/test_tokenizer.c holds it to that on a
 * committed corpus (tests/tokenizer/). In the reference's order:
 *   - the special tokens [UNK] [SEP] [PAD] [CLS] [MASK], written exactly so
 *     in the text, are tokens of their own (those the vocab has);
 *   - the rest is cleaned (U+0000, U+FFFD and control characters dropped,
 *     whitespace a separator), CJK ideographs become words of their own, and
 *     each word is lowercased (Python's str.lower()), decomposed (NFD) and
 *     stripped of its accents (category Mn), then split on punctuation;
 *   - greedy longest-match-first WordPiece ("##" marks a continuation); a word
 *     with no full segmentation, or longer than 100 characters, is [UNK].
 * Bytes that are not UTF-8 are dropped, as the reference drops the U+FFFD
 * that decoding them with errors="replace" gives. A loaded tokenizer is
 * read-only: concurrent encodes from many threads are safe. */
#ifndef MMP_DATA_TOKENIZER_H
#define MMP_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_TOKENIZER_MAX_WORD_CHARS 100

typedef struct mmp_tokenizer mmp_tokenizer;

/* Loads a BERT vocab.txt: one token per line, id = line number - 1, '\n' or
 * "\r\n" line ends. An empty line, invalid UTF-8 or a duplicate token is an
 * error naming path:line; [PAD], [UNK], [CLS] and [SEP] must be present.
 * On success *out is the caller's, freed with mmp_tokenizer_destroy. */
mmp_err mmp_tokenizer_load(mmp_tokenizer **out, const char *path);
/* NULL-safe. */
void mmp_tokenizer_destroy(mmp_tokenizer *t);

int mmp_tokenizer_vocab_size(const mmp_tokenizer *t);
/* Id of token s[0..len), or -1 when it is not in the vocab. */
int32_t mmp_tokenizer_id(const mmp_tokenizer *t, const char *s, size_t len);
/* The token with this id (NUL-terminated, owned by t), or NULL if out of range. */
const char *mmp_tokenizer_token(const mmp_tokenizer *t, int32_t id);

typedef struct mmp_special_ids {
    int32_t pad, unk, cls, sep, mask; /* mask is -1 when the vocab has no [MASK] */
} mmp_special_ids;
mmp_special_ids mmp_tokenizer_specials(const mmp_tokenizer *t);

/* Encodes text as the model sees it: ids[0..max_len) = [CLS] tokens [SEP]
 * [PAD]..., tokens truncated to max_len - 2 so [SEP] always ends the real
 * part (the reference's truncation=True, padding="max_length"); mask[i] (if
 * mask is not NULL) is 1 for the real part, 0 for padding. *n_real (may be
 * NULL) receives the real length (2..max_len), *n_unk (may be NULL) how many
 * [UNK] were emitted. max_len >= 2, else MMP_ERR_INVALID. Allocates nothing. */
mmp_err mmp_tokenizer_encode(const mmp_tokenizer *t, const char *text, int max_len, int32_t *ids,
                             float *mask, int *n_real, int *n_unk);
/* The same over text[0..len), which may hold NUL bytes (dropped, as U+0000). */
mmp_err mmp_tokenizer_encode_n(const mmp_tokenizer *t, const char *text, size_t len, int max_len,
                               int32_t *ids, float *mask, int *n_real, int *n_unk);

#endif
