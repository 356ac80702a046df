/* Lookups into the generated two-stage tables of data/unicode_tables.c, and
 * the algorithmic Hangul decomposition that keeps 11,172 syllables out of
 * them. Must never hold state: the tokenizer calls this from many threads. */
#include "data/unicode.h"

#include <assert.h>
#include <stddef.h>

#include "data/unicode_tables.h"

static_assert(MMP_UCT_FOLD_MAX <= MMP_UC_FOLD_MAX, "regenerated tables fold to more code points");

#define HANGUL_S 0xac00u
#define HANGUL_L 0x1100u
#define HANGUL_V 0x1161u
#define HANGUL_T 0x11a7u
#define HANGUL_V_COUNT 21u
#define HANGUL_T_COUNT 28u
#define HANGUL_S_COUNT 11172u

static const mmp_uct_record *record(uint32_t cp)
{
    uint32_t block = mmp_uct_stage1[cp >> MMP_UCT_SHIFT];
    uint32_t low = cp & ((1u << MMP_UCT_SHIFT) - 1);
    return &mmp_uct_records[mmp_uct_stage2[(block << MMP_UCT_SHIFT) | low]];
}

const char *mmp_unicode_version(void)
{
    return MMP_UCT_UNICODE_VERSION;
}

unsigned mmp_unicode_flags(uint32_t cp)
{
    return cp > 0x10ffff ? MMP_UC_DROP : record(cp)->flags;
}

unsigned mmp_unicode_ccc(uint32_t cp)
{
    return cp > 0x10ffff ? 0 : record(cp)->ccc;
}

int mmp_unicode_fold(uint32_t cp, uint32_t out[MMP_UC_FOLD_MAX])
{
    if (cp - HANGUL_S < HANGUL_S_COUNT) {
        uint32_t s = cp - HANGUL_S, t = s % HANGUL_T_COUNT;
        out[0] = HANGUL_L + s / (HANGUL_V_COUNT * HANGUL_T_COUNT);
        out[1] = HANGUL_V + (s % (HANGUL_V_COUNT * HANGUL_T_COUNT)) / HANGUL_T_COUNT;
        if (t == 0) {
            return 2;
        }
        out[2] = HANGUL_T + t;
        return 3;
    }
    const mmp_uct_record *r = cp <= 0x10ffff ? record(cp) : NULL;
    if (!r || r->fold_len == 0) {
        out[0] = cp;
        return 1;
    }
    for (int i = 0; i < r->fold_len; i++) {
        out[i] = mmp_uct_folds[r->fold_off + i];
    }
    return r->fold_len;
}
