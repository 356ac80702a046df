/* XXH64 with seed 0 (common/xxh64.h), from the algorithm's specification:
 * four lanes over 32-byte stripes, then the tail and a final avalanche.
 * Little-endian loads (memcpy; mmpipe's hosts are little-endian). */
#include "common/xxh64.h"

#include <string.h>

#define P1 11400714785074694791ull
#define P2 14029467366897019727ull
#define P3 1609587929392839161ull
#define P4 9650029242287828579ull
#define P5 2870177450012600261ull

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t load32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t round64(uint64_t acc, uint64_t in)
{
    return rotl(acc + in * P2, 31) * P1;
}

static uint64_t merge(uint64_t acc, uint64_t v)
{
    return (acc ^ round64(0, v)) * P1 + P4;
}

void mmp_xxh64_init(mmp_xxh64_state *s)
{
    memset(s, 0, sizeof *s);
    s->v[0] = P1 + P2;
    s->v[1] = P2;
    s->v[2] = 0;
    s->v[3] = 0 - P1;
}

static void stripe(uint64_t v[4], const unsigned char *p)
{
    v[0] = round64(v[0], load64(p));
    v[1] = round64(v[1], load64(p + 8));
    v[2] = round64(v[2], load64(p + 16));
    v[3] = round64(v[3], load64(p + 24));
}

void mmp_xxh64_update(mmp_xxh64_state *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->total += n;
    if (s->nbuf > 0) {
        size_t k = 32 - s->nbuf < n ? 32 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, k);
        s->nbuf += (unsigned)k;
        p += k;
        n -= k;
        if (s->nbuf < 32) {
            return;
        }
        stripe(s->v, s->buf);
        s->nbuf = 0;
    }
    uint64_t v[4] = {s->v[0], s->v[1], s->v[2], s->v[3]};
    for (; n >= 32; p += 32, n -= 32) {
        stripe(v, p);
    }
    memcpy(s->v, v, sizeof v);
    memcpy(s->buf, p, n);
    s->nbuf = (unsigned)n;
}

uint64_t mmp_xxh64_digest(const mmp_xxh64_state *s)
{
    uint64_t h;
    if (s->total >= 32) {
        const uint64_t *v = s->v;
        h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++) {
            h = merge(h, v[i]);
        }
    } else {
        h = P5;
    }
    h += s->total;
    const unsigned char *p = s->buf;
    unsigned n = s->nbuf;
    for (; n >= 8; p += 8, n -= 8) {
        h ^= round64(0, load64(p));
        h = rotl(h, 27) * P1 + P4;
    }
    if (n >= 4) {
        h ^= (uint64_t)load32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        n -= 4;
    }
    for (; n > 0; p++, n--) {
        h ^= *p * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t mmp_xxh64(const void *p, size_t n)
{
    mmp_xxh64_state s;
    mmp_xxh64_init(&s);
    mmp_xxh64_update(&s, p, n);
    return mmp_xxh64_digest(&s);
}
