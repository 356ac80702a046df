/* Deterministic random numbers.
 *
 * Everything random in mmpipe (initialisation, data order, synthetic data,
 * augmentation) comes from here, so that a run is a pure function of its seed:
 * same seed and plan, bit-identical checkpoints. A generator is a small value
 * (it can be saved in a checkpoint) and streams are derived by hashing, never
 * by sharing one generator across concerns. */
#ifndef MMP_COMMON_RNG_H
#define MMP_COMMON_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct mmp_rng {
    uint64_t s[4]; /* xoshiro256** state */
} mmp_rng;

/* FNV-1a over n bytes, continuing from h (start with MMP_FNV1A_INIT): the
 * checksum of checkpoint files, the sample-id digest, per-name seeds. */
#define MMP_FNV1A_INIT 1469598103934665603ull
uint64_t mmp_fnv1a(uint64_t h, const void *p, size_t n);

/* A 64-bit mix of x (splitmix64 finaliser): use to derive stream seeds. */
uint64_t mmp_hash64(uint64_t x);
/* Seeds from (seed, stream): different streams are independent. */
void mmp_rng_seed(mmp_rng *r, uint64_t seed, uint64_t stream);
uint64_t mmp_rng_u64(mmp_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint64_t mmp_rng_below(mmp_rng *r, uint64_t n);
/* Uniform float in [0, 1). */
float mmp_rng_uniform(mmp_rng *r);
/* Standard normal (Box-Muller, deterministic). */
float mmp_rng_normal(mmp_rng *r);

#endif
