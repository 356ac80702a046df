#include "common/rng.h"

#include <math.h>

uint64_t mmp_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 1099511628211ull;
    }
    return h;
}

uint64_t mmp_hash64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void mmp_rng_seed(mmp_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = mmp_hash64(seed) ^ mmp_hash64(stream * 0xd1b54a32d192ed03ull + 1);
    for (int i = 0; i < 4; i++) {
        x = mmp_hash64(x + (uint64_t)i);
        r->s[i] = x;
    }
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t mmp_rng_u64(mmp_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t mmp_rng_below(mmp_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = mmp_rng_u64(r);
    } while (x >= limit);
    return x % n;
}

float mmp_rng_uniform(mmp_rng *r)
{
    return (float)(mmp_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

float mmp_rng_normal(mmp_rng *r)
{
    double u1 = ((double)(mmp_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(mmp_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
