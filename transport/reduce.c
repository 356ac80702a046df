/* The replica gradient reduce (transport/reduce.h): R processes on one host
 * sum float vectors through one POSIX shared-memory segment.
 *
 * Layout, mapped once by every rank:
 *
 *   page 0..   reduce_header: magic (stored last by rank 0), version,
 *              geometry, the attach count, the poison word, the doorbell
 *              (futex word) and its sleepers on their own cache line, per rank
 *              pid, closed flag and this round's n, then one progress counter
 *              per bucket, each on its own cache line.
 *   then       2 accumulators of region_stride floats (capacity rounded up to
 *              16), starting on a page boundary: round g sums into
 *              accumulator g % 2.
 *
 * A vector is cut into buckets of `bucket` floats (at most MAX_BUCKETS). One
 * sum is a chain in rank order over each bucket: rank 0 copies its bucket into
 * the accumulator, rank k adds its own into it once rank k - 1 has, and the
 * last rank's addition is the sum, which it writes into the accumulator and
 * its own v at once; every other rank then copies the bucket out. So every
 * element is ((v0 + v1) + v2) + ..., the same expression on every rank, added
 * in rank order -- the bits of the reduce-scatter this replaced -- and:
 * - a rank adds as soon as its predecessors have, while later ranks still
 *   compute: the replicas of a pipeline stage finish their last backward one
 *   after another, and the sum of the early ones is done by the time the last
 *   one arrives, which then makes one pass over its own vector;
 * - ranks that arrive together work in a pipeline, bucket by bucket;
 * - nothing is copied into the segment but the running sum.
 *
 * A bucket's counter only grows: it counts every addition to that bucket
 * ever, R per round, so in round g (from 1) rank k's turn on bucket b comes
 * when done[b] reaches (g - 1) R + k and the bucket's sum is complete at g R.
 * Buckets beyond this round's n are counted as passed without a turn, so the
 * counts stay in step whatever n the rounds have. Two accumulators make the
 * barrier after the copies unneeded: round g + 1 writes the other one, and
 * round g + 2 cannot start before every rank finished round g (its turn in
 * round g + 1 comes after theirs). A rank that finds the ranks before it with
 * another n poisons the segment before touching the accumulator: every rank
 * then fails, naming both n's.
 *
 * Waits sleep on the doorbell (every addition rings it; the ring is a system
 * call only when someone sleeps) in slices of SLICE_MS and after each slice
 * check that every peer is alive (a pidfd, which also sees an unreaped zombie
 * as dead) and has not closed, and the caller's timeout. Additions are
 * published by the counter's release increment and seen by the waiters'
 * acquire loads.
 *
 * Naming: rank 0 creates the name with O_CREAT|O_EXCL; the rank whose attach
 * makes the count R removes it, so once everyone is attached a crash leaves
 * nothing in /dev/shm. A rank closing earlier removes it itself. The
 * `unlinked` flag makes that happen exactly once.
 *
 * Creating, attaching, the futex calls, the pidfds and the unlink flag are
 * transport/segment.h's, shared with the shm data channel; this file owns the
 * layout, the chain and the sum.
 *
 * Must never: spin, wait without a timeout, leave a name behind once all
 * ranks are attached, trust a header it did not check, or add in any order
 * but rank order (every rank must end with the same bits). */
#include "transport/reduce.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport/reduce_tcp.h"
#include "transport/segment.h"

/* Bitwise-identical sums on every rank need float additions done in float. */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "transport/reduce.c needs FLT_EVAL_METHOD == 0 (SSE/NEON float arithmetic)"
#endif

#define REDUCE_MAGIC 0x32304452504d4d00ull /* "\0MMPRD02" */
#define REDUCE_VERSION 3u                  /* 3: 256 ranks (2: 64) */
#define MAX_RANKS 256                      /* MMP_MAX_REPLICAS */
#define REGION_ALIGN 16                    /* floats: 64 bytes */
#define PAGE 4096
/* Far beyond any model; keeps 2 * capacity * 4 + header far from overflow. */
#define MAX_CAPACITY ((size_t)1 << 36)
/* A blocked wait checks on its peers this often: a dead one is noticed within
 * one slice. */
#define SLICE_MS 100
/* Buckets: at least MIN_BUCKET floats (1 MB: a ring and a wake-up cost a few
 * microseconds, far less than a bucket's pass), at most MAX_BUCKETS of them. */
#define MIN_BUCKET ((size_t)1 << 18)
#define MAX_BUCKETS 64

typedef struct bucket_word {
    alignas(64) _Atomic uint64_t done; /* additions to this bucket, all rounds */
} bucket_word;

typedef struct reduce_header {
    _Atomic uint64_t magic; /* REDUCE_MAGIC once rank 0 has set up the rest */
    uint32_t version;
    uint32_t replicas;
    uint64_t capacity;      /* floats per rank */
    uint64_t region_stride; /* floats between the two accumulators */
    uint64_t data_offset;   /* bytes from the segment's start to accumulator 0 */
    uint64_t total_bytes;
    uint64_t bucket;                   /* floats per bucket */
    _Atomic uint32_t attached;         /* ranks attached so far (rank 0 included) */
    _Atomic uint32_t unlinked;         /* 1 once a rank has claimed removing the name */
    _Atomic uint32_t poison;           /* 0, or 1 + the rank that found n's that differ */
    alignas(64) _Atomic uint32_t bell; /* futex word: rung by every addition and by close */
    _Atomic uint32_t sleepers;         /* ranks asleep on the bell */
    alignas(64) _Atomic int32_t pid[MAX_RANKS]; /* 0 until that rank attached */
    _Atomic uint32_t closed[MAX_RANKS];
    _Atomic uint64_t n[MAX_RANKS]; /* that rank's n (floats) in its current round */
    bucket_word bucket_done[MAX_BUCKETS];
} reduce_header;

static_assert(offsetof(reduce_header, magic) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(reduce_header) == 8384, "reduce_header is part of the segment layout");

struct mmp_reduce {
    reduce_header *hdr; /* NULL when R == 1: no segment */
    size_t map_bytes;   /* the segment's size, as this rank computes it */
    size_t data_offset; /* from hdr to accumulator 0 */
    float *regions;     /* accumulator 0; accumulator 1 at regions + stride */
    size_t stride;      /* floats */
    size_t capacity;
    size_t bucket; /* floats per bucket */
    int buckets;   /* buckets of a full-capacity vector, 1..MAX_BUCKETS */
    int replicas, rank;
    int timeout_ms;
    uint64_t rounds; /* sums this rank has started */
    int failed;      /* a sum failed: the ranks are out of step */
    int pidfd[MAX_RANKS];
    char name[NAME_MAX + 1];
    mmp_reduce_tcp *tcp; /* a "host:port" name: the sums go over tcp (reduce_tcp.c) */
};

typedef struct layout {
    size_t stride, data_offset, total, bucket;
    int buckets;
} layout;

/* ---- small helpers ------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Bumps the doorbell after the caller's state change and wakes the sleepers
 * (a system call only when there are some). */
static void ring(reduce_header *h)
{
    mmp_segment_bell_ring(&h->bell, &h->sleepers);
}

/* 1 when rank k's process is known to have exited (a zombie counts). */
static int peer_dead(mmp_reduce *r, int k)
{
    return mmp_segment_peer_dead(&r->hdr->pid[k], &r->pidfd[k]);
}

/* ---- waiting ------------------------------------------------------------ */

/* A peer that will never arrive: one that died without closing (checked when
 * check_alive), or one that closed. Returns its rank and sets *dead, or -1.
 * A crash is named in preference to a close: when one rank dies, the first
 * survivor to notice fails, closes and exits, and the others should still
 * report the crash, not that survivor. */
static int gone_peer(mmp_reduce *r, int check_alive, int *dead)
{
    int closed = -1;
    for (int k = 0; k < r->replicas; k++) {
        if (k != r->rank && atomic_load_explicit(&r->hdr->closed[k], memory_order_acquire) &&
            closed < 0) {
            closed = k;
        }
    }
    if (check_alive || closed >= 0) {
        for (int k = 0; k < r->replicas; k++) {
            /* Death first, then the flag: a dead rank's flag is final. */
            if (k != r->rank && peer_dead(r, k) &&
                !atomic_load_explicit(&r->hdr->closed[k], memory_order_acquire)) {
                *dead = 1;
                return k;
            }
        }
    }
    *dead = 0;
    return closed;
}

/* The ranks disagree on n (poisoned by rank p - 1): every rank's error. */
static mmp_err poisoned(const mmp_reduce *r, uint32_t p)
{
    reduce_header *h = r->hdr;
    int k = (int)p - 1;
    if (k < 1 || k >= r->replicas) {
        return mmp_errorf(MMP_ERR_PROTO, "reduce %s: header field poison = %u, not a rank 1..%d",
                          r->name, p, r->replicas - 1);
    }
    return mmp_errorf(MMP_ERR_PROTO,
                      "reduce %s: ranks disagree on n in round %llu: rank 0 has %llu, rank %d has "
                      "%llu (every rank must sum the same length)",
                      r->name, (unsigned long long)r->rounds,
                      (unsigned long long)atomic_load_explicit(&h->n[0], memory_order_relaxed), k,
                      (unsigned long long)atomic_load_explicit(&h->n[k], memory_order_relaxed));
}

/* Waits until bucket b's counter reaches target. Above most it is forged or
 * corrupt (no rank can have got it there): MMP_ERR_PROTO naming the field.
 * `next` is the rank whose addition is awaited (for the messages). */
static mmp_err wait_done(mmp_reduce *r, int b, uint64_t target, uint64_t most)
{
    reduce_header *h = r->hdr;
    _Atomic uint64_t *word = &h->bucket_done[b].done;
    double start = -1;
    int check_alive = 0;
    for (;;) {
        /* The bell before the counter: a ring after this load changes the
         * word, so the wait below returns at once instead of sleeping. */
        uint32_t seen = atomic_load_explicit(&h->bell, memory_order_acquire);
        uint64_t done = atomic_load_explicit(word, memory_order_acquire);
        if (done > most) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "reduce %s: header field done[%d] = %llu in round %llu, over the "
                              "%llu that %d ranks can reach",
                              r->name, b, (unsigned long long)done, (unsigned long long)r->rounds,
                              (unsigned long long)most, r->replicas);
        }
        if (done >= target) {
            return MMP_OK;
        }
        uint32_t p = atomic_load_explicit(&h->poison, memory_order_acquire);
        if (p) {
            return poisoned(r, p);
        }
        int next = (int)(done % (uint64_t)r->replicas);
        int dead = 0;
        int k = gone_peer(r, check_alive, &dead);
        if (k >= 0) {
            /* It may have added before it went: then the wait is over. */
            if (atomic_load_explicit(word, memory_order_acquire) >= target) {
                continue;
            }
            return mmp_errorf(MMP_ERR_PEER, "reduce %s: replica rank %d (pid %d) %s (round %llu)",
                              r->name, k, (int)atomic_load(&h->pid[k]),
                              dead ? "is gone" : "closed the reduce",
                              (unsigned long long)r->rounds);
        }
        double t = now_ms();
        if (start < 0) {
            start = t;
        }
        double left = r->timeout_ms - (t - start);
        if (left <= 0) {
            if (atomic_load_explicit(word, memory_order_acquire) >= target) {
                continue;
            }
            char who[32] = "never attached";
            if (atomic_load(&h->pid[next]) > 0) {
                snprintf(who, sizeof who, "pid %d", (int)atomic_load(&h->pid[next]));
            }
            return mmp_errorf(MMP_ERR_PEER,
                              "reduce %s: timed out after %.1f s waiting for rank %d (%s) "
                              "(round %llu)",
                              r->name, r->timeout_ms / 1e3, next, who,
                              (unsigned long long)r->rounds);
        }
        int slice = left < SLICE_MS ? (int)left + 1 : SLICE_MS;
        check_alive = mmp_segment_bell_wait(&h->bell, seen, &h->sleepers, slice) == ETIMEDOUT;
    }
}

/* ---- open --------------------------------------------------------------- */

/* A "host:port" name (no leading '/'): the replicas are on several hosts,
 * or tcp was forced. */
static int over_tcp(const char *name)
{
    return name && name[0] != '/' && strchr(name, ':') != NULL;
}

static mmp_err check_cfg(const mmp_reduce_cfg *cfg, layout *g)
{
    if (!cfg) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce: no cfg");
    }
    const char *a = cfg->name;
    if (!over_tcp(a)) {
        MMP_TRY(mmp_segment_check_name("reduce", "name", a));
    }
    if (cfg->replicas < 1 || cfg->replicas > MAX_RANKS) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce %s: replicas %d not in 1..%d", a, cfg->replicas,
                          MAX_RANKS);
    }
    if (cfg->rank < 0 || cfg->rank >= cfg->replicas) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce %s: rank %d not in 0..%d", a, cfg->rank,
                          cfg->replicas - 1);
    }
    if (cfg->capacity > MAX_CAPACITY) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce %s: capacity %zu floats is absurd", a,
                          cfg->capacity);
    }
    g->stride = (cfg->capacity + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
    g->data_offset = (sizeof(reduce_header) + PAGE - 1) / PAGE * PAGE;
    g->total = g->data_offset + 2 * g->stride * sizeof(float);
    size_t per = (cfg->capacity + MAX_BUCKETS - 1) / MAX_BUCKETS;
    per = (per + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN; /* whole doubles, 64 bytes */
    g->bucket = per > MIN_BUCKET ? per : MIN_BUCKET;
    g->buckets = (int)((cfg->capacity + g->bucket - 1) / g->bucket);
    if (g->buckets < 1) {
        g->buckets = 1; /* bucket 0 takes the turns even when every n is 0 */
    }
    return MMP_OK;
}

/* r takes over the mapping at base (map_bytes): close unmaps it. */
static void adopt(mmp_reduce *r, void *base)
{
    r->hdr = base;
    r->regions = (float *)(void *)((unsigned char *)base + r->data_offset);
}

static mmp_err create(mmp_reduce *r)
{
    void *base = NULL;
    MMP_TRY(mmp_segment_create(&base, "reduce", r->name, r->map_bytes));
    reduce_header *h = base; /* a fresh segment reads as zeros */
    h->version = REDUCE_VERSION;
    h->replicas = (uint32_t)r->replicas;
    h->capacity = r->capacity;
    h->region_stride = r->stride;
    h->data_offset = r->data_offset;
    h->bucket = r->bucket;
    h->total_bytes = r->map_bytes;
    atomic_store(&h->pid[0], (int32_t)getpid());
    atomic_store(&h->attached, 1);
    mmp_segment_publish(base, REDUCE_MAGIC);
    adopt(r, base);
    return MMP_OK;
}

/* Rank 0's header against the attaching rank r (an mmp_segment_check): magic
 * and version, geometry, and the layout as r computes it. */
static mmp_err check_header(void *ctx, const void *header, uint64_t magic, size_t file_bytes)
{
    const mmp_reduce *r = ctx;
    const reduce_header *h = header;
    if (magic != REDUCE_MAGIC || h->version != REDUCE_VERSION) {
        return mmp_errorf(MMP_ERR_PEER,
                          "reduce %s: not an mmpipe reduce segment of version %u (magic %#llx, "
                          "version %u)",
                          r->name, REDUCE_VERSION, (unsigned long long)magic, h->version);
    }
    if (h->replicas != (uint32_t)r->replicas || h->capacity != r->capacity) {
        return mmp_errorf(MMP_ERR_PEER,
                          "reduce %s: geometry mismatch: rank 0 made %u replicas of capacity "
                          "%llu floats, rank %d expects %d replicas of capacity %zu",
                          r->name, h->replicas, (unsigned long long)h->capacity, r->rank,
                          r->replicas, r->capacity);
    }
    if (h->region_stride != r->stride || h->data_offset != r->data_offset ||
        h->total_bytes != r->map_bytes || file_bytes != r->map_bytes || h->bucket != r->bucket) {
        return mmp_errorf(MMP_ERR_PEER,
                          "reduce %s: layout mismatch: segment stride %llu offset %llu size %lld "
                          "bucket %llu, rank %d computes stride %zu offset %zu size %zu bucket %zu",
                          r->name, (unsigned long long)h->region_stride,
                          (unsigned long long)h->data_offset, (long long)file_bytes,
                          (unsigned long long)h->bucket, r->rank, r->stride, r->data_offset,
                          r->map_bytes, r->bucket);
    }
    return MMP_OK;
}

/* Rank k > 0: waits for rank 0's segment, checks it and takes rank k's place;
 * the last rank to attach removes the name. On failure nothing is mapped. */
static mmp_err join(mmp_reduce *r)
{
    void *base = NULL;
    mmp_err ret = mmp_segment_attach(&base, "reduce", r->name, sizeof(reduce_header), r->map_bytes,
                                     r->timeout_ms, check_header, r);
    if (ret == MMP_ERR_TIMEOUT) {
        return mmp_errorf(MMP_ERR_PEER, "reduce %s: rank 0's segment did not appear in %d ms",
                          r->name, r->timeout_ms);
    }
    if (ret != MMP_OK) {
        return ret;
    }
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&((reduce_header *)base)->pid[r->rank], &none,
                                        (int32_t)getpid())) {
        mmp_segment_unmap(base, r->map_bytes);
        return mmp_errorf(MMP_ERR_PEER, "reduce %s: rank %d is already attached (pid %d)", r->name,
                          r->rank, (int)none);
    }
    adopt(r, base);
    /* The last to attach removes the name: it has done its job. */
    if (atomic_fetch_add(&r->hdr->attached, 1) + 1 == (uint32_t)r->replicas) {
        mmp_segment_unlink_once(&r->hdr->unlinked, r->name);
    }
    return MMP_OK;
}

mmp_err mmp_reduce_open(mmp_reduce **out, const mmp_reduce_cfg *cfg)
{
    layout g = {0};
    if (!out) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce: no out pointer");
    }
    *out = NULL;
    MMP_TRY(check_cfg(cfg, &g));
    mmp_reduce *r = calloc(1, sizeof *r);
    if (!r) {
        return mmp_errorf(MMP_ERR_NOMEM, "reduce %s: handle", cfg->name);
    }
    snprintf(r->name, sizeof r->name, "%s", cfg->name);
    r->replicas = cfg->replicas;
    r->rank = cfg->rank;
    r->capacity = cfg->capacity;
    r->stride = g.stride;
    r->data_offset = g.data_offset;
    r->map_bytes = g.total;
    r->bucket = g.bucket;
    r->buckets = g.buckets;
    r->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
    for (int k = 0; k < MAX_RANKS; k++) {
        r->pidfd[k] = -1;
    }
    if (r->replicas == 1) {
        *out = r; /* nothing to share: no segment, sum is a no-op */
        return MMP_OK;
    }
    mmp_err ret = over_tcp(cfg->name) ? mmp_reduce_tcp_open(&r->tcp, cfg)
                  : r->rank == 0      ? create(r)
                                      : join(r);
    if (ret != MMP_OK) {
        free(r); /* nothing mapped: create and join undo their own work */
        return ret;
    }
    *out = r;
    return MMP_OK;
}

/* ---- sum ---------------------------------------------------------------- */

/* Rank 0 of the chain copies, the middle ranks add, the last one adds and
 * keeps the sum: acc[i] and v[i] get ((v0 + v1) + ...) + v[i]. */
#define DEFINE_ADD(NAME, T)                                                                        \
    static void NAME(const mmp_reduce *r, void *accp, void *vp, size_t lo, size_t hi)              \
    {                                                                                              \
        T *restrict acc = (T *)accp + lo;                                                          \
        T *restrict v = (T *)vp + lo;                                                              \
        size_t m = hi - lo;                                                                        \
        if (r->rank == 0) {                                                                        \
            memcpy(acc, v, m * sizeof(T));                                                         \
        } else if (r->rank < r->replicas - 1) {                                                    \
            for (size_t i = 0; i < m; i++) {                                                       \
                acc[i] += v[i];                                                                    \
            }                                                                                      \
        } else {                                                                                   \
            for (size_t i = 0; i < m; i++) {                                                       \
                T s = acc[i] + v[i];                                                               \
                acc[i] = s;                                                                        \
                v[i] = s;                                                                          \
            }                                                                                      \
        }                                                                                          \
    }
DEFINE_ADD(add_f32, float)
DEFINE_ADD(add_f64, double)

/* Rank k checks the n of every rank before it (they stored theirs before
 * their turn on bucket 0, which this rank has waited for). On a mismatch it
 * poisons the segment: nobody's wait can then end otherwise. */
static mmp_err check_n(mmp_reduce *r, uint64_t floats)
{
    reduce_header *h = r->hdr;
    for (int k = 0; k < r->rank; k++) {
        if (atomic_load_explicit(&h->n[k], memory_order_relaxed) != floats) {
            uint32_t none = 0;
            atomic_compare_exchange_strong(&h->poison, &none, (uint32_t)r->rank + 1);
            ring(h);
            return poisoned(r, atomic_load(&h->poison));
        }
    }
    return MMP_OK;
}

/* One round: n elements of `size` bytes (4: float, 8: double) at v. */
static mmp_err chain_round(mmp_reduce *r, void *v, size_t n, size_t size)
{
    reduce_header *h = r->hdr;
    uint64_t R = (uint64_t)r->replicas;
    uint64_t g = ++r->rounds;
    uint64_t floats = n * (size / sizeof(float));
    size_t per = r->bucket / (size / sizeof(float)); /* elements per bucket */
    int used = n > 0 ? (int)((n + per - 1) / per) : 0;
    int turns = used > 0 ? used : 1; /* bucket 0 always: it carries the n check */
    void *acc = r->regions + (size_t)(g % 2) * r->stride;
    uint64_t base = (g - 1) * R + (uint64_t)r->rank;
    atomic_store_explicit(&h->n[r->rank], floats, memory_order_relaxed);
    for (int b = 0; b < turns; b++) {
        MMP_TRY(wait_done(r, b, base, base));
        if (b == 0) {
            MMP_TRY(check_n(r, floats));
        }
        size_t lo = (size_t)b * per, hi = lo + per < n ? lo + per : n;
        if (lo < hi) {
            (size == sizeof(float) ? add_f32 : add_f64)(r, acc, v, lo, hi);
        }
        atomic_fetch_add_explicit(&h->bucket_done[b].done, 1, memory_order_release);
        ring(h);
    }
    /* the buckets this n leaves out pass without a turn: counts stay in step */
    for (int b = turns; b < r->buckets; b++) {
        atomic_fetch_add_explicit(&h->bucket_done[b].done, 1, memory_order_release);
    }
    if (turns < r->buckets) {
        ring(h);
    }
    if (r->rank == r->replicas - 1) {
        return MMP_OK; /* its additions were the sums, already in v */
    }
    for (int b = 0; b < turns; b++) {
        /* complete at g R; the next round may have begun on it (not past this rank) */
        MMP_TRY(wait_done(r, b, g * R, g * R + R - 1));
        size_t lo = (size_t)b * per, hi = lo + per < n ? lo + per : n;
        if (lo < hi) {
            memcpy((char *)v + lo * size, (const char *)acc + lo * size, (hi - lo) * size);
        }
    }
    return MMP_OK;
}

/* One round: n elements of `size` bytes (4: float, 8: double) at v. */
static mmp_err reduce_round(mmp_reduce *r, void *v, size_t n, size_t size)
{
    size_t floats = n * (size / sizeof(float));
    if (!r) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce: sum on a NULL handle");
    }
    if (floats > r->capacity) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "reduce %s: sum of %zu %s exceeds the capacity %zu floats", r->name, n,
                          size == sizeof(float) ? "floats" : "doubles", r->capacity);
    }
    if (!v && n > 0) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce %s: sum of %zu values from NULL", r->name, n);
    }
    if (r->replicas == 1) {
        return MMP_OK;
    }
    if (r->tcp) {
        return mmp_reduce_tcp_round(r->tcp, v, n, size);
    }
    if (r->failed) {
        return mmp_errorf(MMP_ERR_PEER,
                          "reduce %s: an earlier sum failed and the replicas are out of step",
                          r->name);
    }
    mmp_err ret = chain_round(r, v, n, size);
    if (ret != MMP_OK) {
        r->failed = 1;
    }
    return ret;
}

mmp_err mmp_reduce_sum(mmp_reduce *r, float *v, size_t n)
{
    return reduce_round(r, v, n, sizeof(float));
}

mmp_err mmp_reduce_sum_f64(mmp_reduce *r, double *v, size_t n)
{
    return reduce_round(r, v, n, sizeof(double));
}

/* ---- close -------------------------------------------------------------- */

void mmp_reduce_close(mmp_reduce *r)
{
    if (!r) {
        return;
    }
    mmp_reduce_tcp_close(r->tcp);
    if (r->hdr) {
        /* Peers blocked in a sum this rank will never join fail at once. */
        atomic_store_explicit(&r->hdr->closed[r->rank], 1, memory_order_release);
        mmp_segment_bell_ring(&r->hdr->bell, NULL);          /* every waiter, whatever the count */
        mmp_segment_unlink_once(&r->hdr->unlinked, r->name); /* a no-op once every rank attached */
        mmp_segment_unmap(r->hdr, r->map_bytes);
    }
    for (int k = 0; k < MAX_RANKS; k++) {
        if (r->pidfd[k] >= 0) {
            close(r->pidfd[k]);
        }
    }
    free(r);
}

const char *mmp_reduce_address(const mmp_reduce *r)
{
    return r->tcp ? mmp_reduce_tcp_address(r->tcp) : r->name;
}
