/* XXH64 (seed 0), one-shot and streaming: the checksum of checkpoint files
 * from format version 2 on (common/ckpt.h). The published algorithm, so a
 * file's footer can be checked with any XXH64 implementation (`xxhsum -H1`
 * over the bytes the footer covers), and several times faster than byte-wise
 * FNV-1a: a checkpoint of several GB is hashed as it is written and as it is
 * read, never in a pass of its own. */
#ifndef MMP_COMMON_XXH64_H
#define MMP_COMMON_XXH64_H

#include <stddef.h>
#include <stdint.h>

typedef struct mmp_xxh64_state {
    uint64_t v[4];         /* the four lanes */
    uint64_t total;        /* bytes fed so far */
    unsigned char buf[32]; /* a stripe not yet complete */
    unsigned nbuf;
} mmp_xxh64_state;

void mmp_xxh64_init(mmp_xxh64_state *s);
/* Feeds n bytes; any split of the input gives the same digest. */
void mmp_xxh64_update(mmp_xxh64_state *s, const void *p, size_t n);
/* The digest of everything fed (s is left as it was). */
uint64_t mmp_xxh64_digest(const mmp_xxh64_state *s);
/* One shot. */
uint64_t mmp_xxh64(const void *p, size_t n);

#endif
