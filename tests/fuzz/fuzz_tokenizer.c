/* The BERT tokenizer (data/tokenizer.c). First byte even: the rest is a
 * caption, encoded with bert-base-uncased's vocabulary
 * ($MMP_FUZZ_VOCAB, default tests/tokenizer/vocab.txt, loaded once) at a
 * max_len the first byte picks. Odd: the rest is a vocabulary file, loaded
 * and then used on a fixed caption. */
#include "data/tokenizer.h"
#include "tests/fuzz/fuzz.h"

static mmp_tokenizer *bert;

static void encode(const mmp_tokenizer *t, const char *text, size_t len, int max_len)
{
    int32_t ids[130];
    float mask[130];
    int n_real = 0, n_unk = 0;
    if (mmp_tokenizer_encode_n(t, text, len, max_len, ids, mask, &n_real, &n_unk) == MMP_OK) {
        int v = mmp_tokenizer_vocab_size(t);
        for (int i = 0; i < max_len; i++) {
            if (ids[i] < 0 || ids[i] >= v || !mmp_tokenizer_token(t, ids[i])) {
                __builtin_trap(); /* an id outside the vocabulary indexes an embedding */
            }
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (size < 1) {
        return 0;
    }
    int max_len = 2 + data[0] / 2 % 127;
    if (data[0] % 2 == 0) {
        if (!bert) {
            const char *v = getenv("MMP_FUZZ_VOCAB");
            if (mmp_tokenizer_load(&bert, v && *v ? v : "tests/tokenizer/vocab.txt") != MMP_OK) {
                fprintf(stderr, "fuzz_tokenizer: %s\n", mmp_last_error());
                abort(); /* no vocabulary: a broken set-up, not a finding */
            }
        }
        encode(bert, (const char *)data + 1, size - 1, max_len);
        return 0;
    }
    const char *path = fuzz_file(".vocab", data + 1, size - 1);
    mmp_tokenizer *t = NULL;
    if (path && mmp_tokenizer_load(&t, path) == MMP_OK) {
        static const char text[] = "A cat's PAJAMAS, naïve café — 東京 unaffable!!";
        encode(t, text, sizeof text - 1, max_len);
    }
    mmp_tokenizer_destroy(t);
    if (path) {
        unlink(path);
    }
    return 0;
}
