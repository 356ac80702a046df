/* The replica gradient reduce (transport/reduce.h): R processes on one host
 * sum float vectors through one POSIX shared-memory segment.
 *
 * Layout, mapped once by every rank:
 *
 *   page 0..   reduce_header: magic (stored last by rank 0), version,
 *              geometry, the attach count, the barrier's arrival counter and
 *              doorbell (futex word) on their own cache line, then per rank:
 *              pid, closed flag, barriers entered and this round's n.
 *   then       R regions of region_stride floats (capacity rounded up to 16),
 *              starting on a page boundary, so every region is 64-byte aligned.
 *
 * One sum is: write v into my region and my n; barrier; check every rank's
 * n; sum my slice of the elements over all regions in rank order into my
 * region; barrier; copy every slice from its owner's region into v; barrier.
 * The last barrier keeps a fast rank from overwriting its region for the next
 * round while a slow one still reads it.
 *
 * The barrier is one 64-bit arrival counter that only grows: a rank's b-th
 * barrier is passed once arrived >= b * R. Nobody resets it, so there is no
 * generation to get wrong: a rank cannot arrive at barrier b + 1 before all R
 * arrivals of barrier b are counted. The last arrival rings the doorbell
 * (bumps `bell`, FUTEX_WAKE); waiters sleep on it in slices of SLICE_MS and
 * after each slice check that every peer is alive (a pidfd, which also sees an
 * unreaped zombie as dead) and has not closed, and the caller's timeout. The
 * counter's RMWs are acq_rel and the waiters' loads acquire, so passing a
 * barrier makes every region and n written before it visible.
 *
 * Naming: rank 0 creates the name with O_CREAT|O_EXCL; the rank whose attach
 * makes the count R removes it, so once everyone is attached a crash leaves
 * nothing in /dev/shm. A rank closing earlier removes it itself. The
 * `unlinked` flag makes that happen exactly once.
 *
 * Creating, attaching, the futex calls, the pidfds and the unlink flag are
 * transport/segment.h's, shared with the shm data channel; this file owns the
 * layout, the barrier and the sum.
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

#define REDUCE_MAGIC 0x31304452504d4d00ull /* "\0MMPRD01" */
#define REDUCE_VERSION 1u
#define MAX_RANKS 64
#define REGION_ALIGN 16 /* floats: 64 bytes */
#define PAGE 4096
/* Far beyond any model; keeps R * capacity * 4 + header far from overflow. */
#define MAX_CAPACITY ((size_t)1 << 36)
/* A blocked wait checks on its peers this often: a dead one is noticed within
 * one slice. */
#define SLICE_MS 100
/* Floats summed per pass over the R regions: v's chunk stays in L1/L2 while
 * every region's chunk is added to it. */
#define CHUNK 4096

typedef struct reduce_header {
    _Atomic uint64_t magic; /* REDUCE_MAGIC once rank 0 has set up the rest */
    uint32_t version;
    uint32_t replicas;
    uint64_t capacity;      /* floats per rank */
    uint64_t region_stride; /* floats between regions */
    uint64_t data_offset;   /* bytes from the segment's start to region 0 */
    uint64_t total_bytes;
    _Atomic uint32_t attached;            /* ranks attached so far (rank 0 included) */
    _Atomic uint32_t unlinked;            /* 1 once a rank has claimed removing the name */
    alignas(64) _Atomic uint64_t arrived; /* barrier arrivals, all ranks, ever */
    _Atomic uint32_t bell;                /* futex word: rung by the last arrival and by close */
    alignas(64) _Atomic int32_t pid[MAX_RANKS]; /* 0 until that rank attached */
    _Atomic uint32_t closed[MAX_RANKS];
    _Atomic uint64_t entered[MAX_RANKS]; /* barriers that rank arrived at: names a laggard */
    _Atomic uint64_t n[MAX_RANKS];       /* that rank's n in the current round */
} reduce_header;

static_assert(offsetof(reduce_header, magic) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(reduce_header) == 1664, "reduce_header is part of the segment layout");
static_assert(sizeof(reduce_header) <= PAGE, "the header fits the first page");

struct mmp_reduce {
    reduce_header *hdr; /* NULL when R == 1: no segment */
    size_t map_bytes;   /* the segment's size, as this rank computes it */
    size_t data_offset; /* from hdr to region 0 */
    float *regions;     /* region 0; region k at regions + k * stride */
    size_t stride;      /* floats */
    size_t capacity;
    int replicas, rank;
    int timeout_ms;
    uint64_t barriers; /* barriers this rank has arrived at */
    uint64_t rounds;   /* sums this rank has started */
    int failed;        /* a sum failed: the ranks are out of step */
    int pidfd[MAX_RANKS];
    char name[NAME_MAX + 1];
    mmp_reduce_tcp *tcp; /* a "host:port" name: the sums go over tcp (reduce_tcp.c) */
};

typedef struct layout {
    size_t stride, data_offset, total;
} layout;

/* ---- small helpers ------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* Bumps the doorbell after the caller's state change and wakes every waiter
 * (they do not count themselves): one FUTEX_WAKE per barrier, cheap beside
 * summing R vectors. */
static void ring(reduce_header *h)
{
    mmp_segment_bell_ring(&h->bell, NULL);
}

static float *region(const mmp_reduce *r, int k)
{
    return r->regions + (size_t)k * r->stride;
}

/* 1 when rank k's process is known to have exited (a zombie counts). */
static int peer_dead(mmp_reduce *r, int k)
{
    return mmp_segment_peer_dead(&r->hdr->pid[k], &r->pidfd[k]);
}

/* ---- the barrier -------------------------------------------------------- */

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

/* The first rank that has not arrived at barrier b (for the timeout message). */
static int laggard(const mmp_reduce *r, uint64_t b)
{
    for (int k = 0; k < r->replicas; k++) {
        if (k != r->rank && atomic_load_explicit(&r->hdr->entered[k], memory_order_relaxed) < b) {
            return k;
        }
    }
    return -1;
}

static mmp_err wait_barrier(mmp_reduce *r, uint64_t b)
{
    reduce_header *h = r->hdr;
    uint64_t target = b * (uint64_t)r->replicas;
    double start = now_ms();
    int check_alive = 0;
    for (;;) {
        /* The bell before the counter: a ring after this load changes the
         * word, so FUTEX_WAIT below returns at once instead of sleeping. */
        uint32_t seen = atomic_load_explicit(&h->bell, memory_order_acquire);
        uint64_t arrived = atomic_load_explicit(&h->arrived, memory_order_acquire);
        if (arrived >= target) {
            /* The counter is every rank's word: while this rank has not left
             * barrier b, the others can be at most one barrier ahead, so a
             * larger count is forged or corrupt, not a barrier passed. */
            if (arrived > target + (uint64_t)r->replicas - 1) {
                return mmp_errorf(MMP_ERR_PROTO,
                                  "reduce %s: header field arrived = %llu at barrier %llu, over "
                                  "the %llu that %d ranks can reach (round %llu)",
                                  r->name, (unsigned long long)arrived, (unsigned long long)b,
                                  (unsigned long long)(target + (uint64_t)r->replicas - 1),
                                  r->replicas, (unsigned long long)r->rounds);
            }
            return MMP_OK;
        }
        int dead = 0;
        int k = gone_peer(r, check_alive, &dead);
        if (k >= 0) {
            /* It may have arrived before it went: then this barrier is whole. */
            if (atomic_load_explicit(&h->arrived, memory_order_acquire) >= target) {
                return MMP_OK;
            }
            return mmp_errorf(MMP_ERR_PEER, "reduce %s: replica rank %d (pid %d) %s (round %llu)",
                              r->name, k, (int)atomic_load(&h->pid[k]),
                              dead ? "is gone" : "closed the reduce",
                              (unsigned long long)r->rounds);
        }
        double left = r->timeout_ms - (now_ms() - start);
        if (left <= 0) {
            if (atomic_load_explicit(&h->arrived, memory_order_acquire) >= target) {
                return MMP_OK;
            }
            int lag = laggard(r, b);
            char who[32] = "never attached";
            if (lag >= 0 && atomic_load(&h->pid[lag]) > 0) {
                snprintf(who, sizeof who, "pid %d", (int)atomic_load(&h->pid[lag]));
            }
            return mmp_errorf(MMP_ERR_PEER,
                              "reduce %s: timed out after %.1f s waiting for rank %d (%s) "
                              "(round %llu)",
                              r->name, r->timeout_ms / 1e3, lag, who,
                              (unsigned long long)r->rounds);
        }
        int slice = left < SLICE_MS ? (int)left + 1 : SLICE_MS;
        check_alive = mmp_segment_bell_wait(&h->bell, seen, NULL, slice) == ETIMEDOUT;
    }
}

/* Arrives at this rank's next barrier and waits for every other rank. */
static mmp_err barrier(mmp_reduce *r)
{
    reduce_header *h = r->hdr;
    uint64_t b = ++r->barriers;
    uint64_t now = atomic_fetch_add_explicit(&h->arrived, 1, memory_order_acq_rel) + 1;
    atomic_store_explicit(&h->entered[r->rank], b, memory_order_relaxed);
    if (now == b * (uint64_t)r->replicas) {
        ring(h); /* the last arrival: the acq_rel add already saw everyone's writes */
        return MMP_OK;
    }
    return wait_barrier(r, b);
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
    g->total = g->data_offset + (size_t)cfg->replicas * g->stride * sizeof(float);
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
        h->total_bytes != r->map_bytes || file_bytes != r->map_bytes) {
        return mmp_errorf(MMP_ERR_PEER,
                          "reduce %s: layout mismatch: segment stride %llu offset %llu size %lld, "
                          "rank %d computes stride %zu offset %zu size %zu",
                          r->name, (unsigned long long)h->region_stride,
                          (unsigned long long)h->data_offset, (long long)file_bytes, r->rank,
                          r->stride, r->data_offset, r->map_bytes);
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

/* Reduce-scatter, then all-gather. Rank k owns the slice [lo_k, hi_k) of the
 * elements: it adds region 0 + region 1 + ... + region R-1 there, in exactly
 * that order for every element (the order fixes the rounding, so each element
 * has the same bits whichever rank computed it), and writes the sums into its
 * own region's slice -- which no other rank reads. After a barrier every rank
 * copies each slice from its owner's region. Each rank reads about 2n values
 * instead of R n, and the ranks add in parallel. */
static void slice_of(const mmp_reduce *r, int k, size_t n, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)k / (size_t)r->replicas;
    *hi = n * (size_t)(k + 1) / (size_t)r->replicas;
}

#define DEFINE_SUM_SLICE(NAME, T)                                                                  \
    static void NAME(const mmp_reduce *r, size_t n)                                                \
    {                                                                                              \
        size_t lo, hi;                                                                             \
        slice_of(r, r->rank, n, &lo, &hi);                                                         \
        T *restrict out = (T *)region(r, r->rank);                                                 \
        for (size_t i0 = lo; i0 < hi; i0 += CHUNK) {                                               \
            size_t m = hi - i0 < CHUNK ? hi - i0 : CHUNK;                                          \
            T acc[CHUNK];                                                                          \
            memcpy(acc, (const T *)region(r, 0) + i0, m * sizeof(T));                              \
            for (int k = 1; k < r->replicas; k++) {                                                \
                const T *restrict src = (const T *)region(r, k) + i0;                              \
                for (size_t i = 0; i < m; i++) {                                                   \
                    acc[i] += src[i];                                                              \
                }                                                                                  \
            }                                                                                      \
            memcpy(out + i0, acc, m * sizeof(T));                                                  \
        }                                                                                          \
    }
DEFINE_SUM_SLICE(sum_slice_f32, float)
DEFINE_SUM_SLICE(sum_slice_f64, double)

/* v (n elements of size bytes) = every slice from its owner's region. */
static void gather_slices(const mmp_reduce *r, void *v, size_t n, size_t size)
{
    for (int k = 0; k < r->replicas; k++) {
        size_t lo, hi;
        slice_of(r, k, n, &lo, &hi);
        memcpy((char *)v + lo * size, (const char *)region(r, k) + lo * size, (hi - lo) * size);
    }
}

/* Every rank reads the same n[] after the first barrier, so a mismatch is
 * reported by all of them alike and nobody is left waiting. */
static mmp_err check_rounds_n(const mmp_reduce *r)
{
    reduce_header *h = r->hdr;
    uint64_t n0 = atomic_load_explicit(&h->n[0], memory_order_relaxed);
    for (int k = 1; k < r->replicas; k++) {
        uint64_t nk = atomic_load_explicit(&h->n[k], memory_order_relaxed);
        if (nk != n0) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "reduce %s: ranks disagree on n in round %llu: rank 0 has %llu, "
                              "rank %d has %llu (every rank must sum the same length)",
                              r->name, (unsigned long long)r->rounds, (unsigned long long)n0, k,
                              (unsigned long long)nk);
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
    r->rounds++;
    if (n > 0) {
        memcpy(region(r, r->rank), v, n * size);
    }
    atomic_store_explicit(&r->hdr->n[r->rank], floats, memory_order_relaxed);
    mmp_err ret = barrier(r);
    if (ret == MMP_OK) {
        ret = check_rounds_n(r);
    }
    if (ret == MMP_OK) {
        if (size == sizeof(float)) {
            sum_slice_f32(r, n);
        } else {
            sum_slice_f64(r, n);
        }
        ret = barrier(r); /* every slice summed */
    }
    if (ret == MMP_OK) {
        gather_slices(r, v, n, size);
        /* Nobody writes its region for the next round until all have read. */
        ret = barrier(r);
    }
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
        ring(r->hdr);
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
