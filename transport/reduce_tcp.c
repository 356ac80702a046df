/* The replica reduce over TCP (transport/reduce.h, for replicas on
 * different hosts, or forced on one): the same contract and the same bits as
 * the shm reduce, through rank 0.
 *
 * Rank 0 listens on the cfg's "host:port" (port 0: a free one, reported by
 * mmp_reduce_address); a thread of rank 0 accepts the other ranks, runs the
 * job-key handshake with each (transport/auth.h: a process without the
 * job's secret is refused and logged before it can claim a rank), checks
 * each one's hello (replicas, capacity, rank free) and answers it, so a rank
 * that opens is answered whatever rank 0's process is doing (all pending
 * connections at once: transport/auth.h's gate, so a silent stranger holds
 * up no rank). A sum: every
 * rank k > 0 sends (round, n, its vector) to rank 0; rank 0 reads them in
 * rank order, adding each as it comes in -- ((v0 + v1) + v2) + ... element by
 * element exactly as the shm reduce does (so the bits are the same whichever
 * transport a run used; the early ranks' additions are done while later ones
 * still compute) -- and sends (round, n, the sum) back to each rank. Ranks that
 * disagree on n all get MMP_ERR_PROTO (rank 0 answers with the n's it saw).
 *
 * A star, not a ring: R is a handful of replicas per stage, and a fixed
 * rank order on one host is what makes every rank's bits the same.
 *
 * Must never: use a byte from a peer before checking it (round, n against
 * the capacity), add in another order, or wait without a deadline check. */
#include <errno.h>
#include <float.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "transport/auth.h"
#include "transport/reduce_tcp.h"
#include "transport/sock.h"

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "transport/reduce_tcp.c needs FLT_EVAL_METHOD == 0 (SSE/NEON float arithmetic)"
#endif

#define RT_MAGIC 0x3130544452504d4dull /* "MMPRDT01" */
#define RT_VERSION 2u                  /* 2: the job-key handshake first */
#define RT_SECRET_MAX 256
#define RT_MAX_RANKS 256 /* MMP_MAX_REPLICAS */
#define HELLO_MS 5000

enum { RT_OK = 0, RT_GEOMETRY = 1, RT_RANK_TAKEN = 2 };

typedef struct rt_hello {
    uint64_t magic;
    uint32_t version;
    uint32_t replicas;
    uint64_t capacity;
    int32_t rank;
    int32_t status; /* rank 0's answer */
} rt_hello;
_Static_assert(sizeof(rt_hello) == 32, "rt_hello is part of the wire");

/* Before every vector, both ways. Rank 0's answer has n = RT_DISAGREE and
 * bad_rank / bad_n set when the ranks disagree on n. */
typedef struct rt_frame {
    uint64_t round;
    uint64_t n;      /* floats */
    uint64_t zero_n; /* RT_DISAGREE answers: rank 0's n */
    uint64_t bad_n;  /* and the first rank that differs */
    int32_t bad_rank;
    int32_t pad;
} rt_frame;
_Static_assert(sizeof(rt_frame) == 40, "rt_frame is part of the wire");
#define RT_DISAGREE UINT64_MAX
#define RT_LOST (UINT64_MAX - 1) /* rank 0 lost rank bad_rank: this sum fails */

struct mmp_reduce_tcp {
    char address[MMP_SOCK_ADDR_MAX]; /* rank 0: where it listens; else rank 0's */
    char what[MMP_SOCK_ADDR_MAX + 64];
    char secret[RT_SECRET_MAX]; /* the job's (copied: rank 0's thread uses it) */
    int replicas, rank, timeout_ms;
    size_t capacity;
    int lfd, stop_fd;
    int fd[RT_MAX_RANKS]; /* rank 0: one per rank (fd[0] unused); else fd[0]: to rank 0 */
    char peer[RT_MAX_RANKS][MMP_SOCK_ADDR_MAX];
    pthread_t thread;
    int has_thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int attached; /* rank 0: ranks connected (under mu) */
    uint64_t rounds;
    int failed;
    float *buf;    /* rank 0: R regions of stride floats */
    size_t stride; /* capacity rounded up to 16 floats: every region 64-byte aligned, so a
                    * region read as doubles is aligned whatever the capacity */
};

/* The gate's judge (transport/auth.h) of an authenticated rank's hello;
 * runs on rank 0's thread, which alone writes fd[]. */
static int judge_hello(void *ctx, const void *hello, void *reply, const char **why)
{
    const mmp_reduce_tcp *r = ctx;
    rt_hello h;
    memcpy(&h, hello, sizeof h);
    if (h.magic != RT_MAGIC || h.version != RT_VERSION) {
        *why = "not an mmpipe reduce rank";
        return -1;
    }
    int status = RT_OK;
    if (h.replicas != (uint32_t)r->replicas || h.capacity != r->capacity) {
        status = RT_GEOMETRY;
        *why = "replicas or capacity differ";
    } else if (h.rank < 1 || h.rank >= r->replicas || r->fd[h.rank] >= 0) {
        status = RT_RANK_TAKEN;
        *why = "rank out of range or already attached";
    }
    rt_hello mine = {.magic = RT_MAGIC,
                     .version = RT_VERSION,
                     .replicas = (uint32_t)r->replicas,
                     .capacity = r->capacity,
                     .rank = 0,
                     .status = status};
    memcpy(reply, &mine, sizeof mine);
    return status;
}

/* Rank 0's thread: takes ranks through the job-key gate (every connection
 * at once, each with its own HELLO_MS: a silent stranger does not hold up
 * the ranks behind it) until every rank attached. */
static void *accept_thread(void *arg)
{
    mmp_reduce_tcp *r = arg;
    mmp_auth_gate *gate = NULL;
    mmp_err e = mmp_auth_gate_create(&gate, r->lfd, r->what, r->secret, sizeof(rt_hello),
                                     sizeof(rt_hello), HELLO_MS, judge_hello, r);
    if (e != MMP_OK) {
        MMP_WARN("%s", mmp_last_error());
        return NULL;
    }
    while (r->attached < r->replicas - 1) {
        int fd = -1;
        char peer[MMP_SOCK_ADDR_MAX];
        rt_hello h;
        e = mmp_auth_gate_next(gate, r->stop_fd, &fd, peer, sizeof peer, &h);
        if (e != MMP_OK) {
            if (e != MMP_ERR_TIMEOUT) { /* MMP_ERR_TIMEOUT: stopped by close */
                MMP_WARN("%s", mmp_last_error());
            }
            mmp_auth_gate_destroy(gate, NULL);
            return NULL;
        }
        pthread_mutex_lock(&r->mu);
        r->fd[h.rank] = fd;
        snprintf(r->peer[h.rank], sizeof r->peer[h.rank], "%s", peer);
        r->attached++;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    mmp_auth_gate_destroy(gate, "every rank is attached");
    return NULL;
}

static mmp_reduce_tcp *new_reduce(const mmp_reduce_cfg *cfg)
{
    mmp_reduce_tcp *r = calloc(1, sizeof *r);
    if (!r) {
        return NULL;
    }
    snprintf(r->address, sizeof r->address, "%s", cfg->name);
    snprintf(r->secret, sizeof r->secret, "%s", cfg->secret ? cfg->secret : "");
    r->replicas = cfg->replicas;
    r->rank = cfg->rank;
    r->capacity = cfg->capacity;
    r->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
    r->lfd = -1;
    r->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    for (int k = 0; k < RT_MAX_RANKS; k++) {
        r->fd[k] = -1;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->what, sizeof r->what, "reduce %s rank %d", r->address, r->rank);
    return r;
}

mmp_err mmp_reduce_tcp_open(mmp_reduce_tcp **out, const mmp_reduce_cfg *cfg)
{
    *out = NULL;
    if (cfg->replicas > RT_MAX_RANKS) {
        return mmp_errorf(MMP_ERR_INVALID, "reduce %s: %d replicas (at most %d over tcp)",
                          cfg->name, cfg->replicas, RT_MAX_RANKS);
    }
    if (!cfg->secret || !cfg->secret[0] || strlen(cfg->secret) >= RT_SECRET_MAX) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "reduce %s: the job's secret is missing or longer than %d bytes (every "
                          "tcp connection is authenticated with it)",
                          cfg->name, RT_SECRET_MAX - 1);
    }
    mmp_reduce_tcp *r = new_reduce(cfg);
    if (!r || r->stop_fd < 0) {
        mmp_reduce_tcp_close(r);
        return mmp_errorf(MMP_ERR_NOMEM, "reduce %s: state", cfg->name);
    }
    mmp_err e = MMP_OK;
    if (r->rank == 0) {
        char bound[MMP_SOCK_ADDR_MAX];
        r->stride = (r->capacity + 15) / 16 * 16;
        r->buf =
            aligned_alloc(64, (size_t)r->replicas * (r->stride ? r->stride : 16) * sizeof(float));
        e = r->buf ? mmp_sock_listen(&r->lfd, r->what, cfg->name, bound, sizeof bound)
                   : mmp_errorf(MMP_ERR_NOMEM, "reduce %s: %d x %zu floats", cfg->name, r->replicas,
                                r->capacity);
        if (e == MMP_OK) {
            snprintf(r->address, sizeof r->address, "%s", bound);
            snprintf(r->what, sizeof r->what, "reduce %s rank 0", r->address);
            int t = pthread_create(&r->thread, NULL, accept_thread, r);
            r->has_thread = t == 0;
            if (t != 0) {
                e = mmp_errorf(MMP_ERR_IO, "%s: thread: %s", r->what, strerror(t));
            }
        }
    } else {
        double deadline = mmp_sock_deadline(r->timeout_ms);
        e = mmp_sock_connect(&r->fd[0], r->what, cfg->name, deadline);
        if (e == MMP_OK) {
            e = mmp_auth_handshake(r->fd[0], r->what, r->secret, 1, deadline, -1);
            if (e == MMP_ERR_TIMEOUT) {
                e = mmp_errorf(MMP_ERR_PEER, "%s: rank 0 did not answer in %d ms", r->what,
                               r->timeout_ms);
            }
        }
        rt_hello h = {.magic = RT_MAGIC,
                      .version = RT_VERSION,
                      .replicas = (uint32_t)r->replicas,
                      .capacity = r->capacity,
                      .rank = r->rank},
                 reply;
        struct iovec iov = {&h, sizeof h};
        if (e == MMP_OK) {
            e = mmp_sock_writev(r->fd[0], r->what, &iov, 1, deadline, -1);
        }
        if (e == MMP_OK) {
            e = mmp_sock_read(r->fd[0], r->what, &reply, sizeof reply, deadline, -1, NULL);
            if (e == MMP_ERR_TIMEOUT) {
                e = mmp_errorf(MMP_ERR_PEER, "%s: rank 0 did not answer in %d ms", r->what,
                               r->timeout_ms);
            } else if (e == MMP_ERR_PEER) {
                e = mmp_errorf(MMP_ERR_PEER, "%s: rank 0 refused this rank (see its log)", r->what);
            }
        }
        if (e == MMP_OK && (reply.magic != RT_MAGIC || reply.status != RT_OK)) {
            e = mmp_errorf(MMP_ERR_PEER,
                           "%s: rank 0 has %u replicas and capacity %llu, this rank expects %d "
                           "replicas and capacity %zu%s",
                           r->what, reply.replicas, (unsigned long long)reply.capacity, r->replicas,
                           r->capacity,
                           reply.status == RT_RANK_TAKEN ? " (this rank is already attached)" : "");
        }
    }
    if (e != MMP_OK) {
        mmp_reduce_tcp_close(r);
        return e;
    }
    *out = r;
    return MMP_OK;
}

const char *mmp_reduce_tcp_address(const mmp_reduce_tcp *r)
{
    return r->address;
}

/* Rank 0: waits until every rank attached. */
static mmp_err wait_attached(mmp_reduce_tcp *r, double deadline)
{
    mmp_err e = MMP_OK;
    pthread_mutex_lock(&r->mu);
    while (r->attached < r->replicas - 1) {
        struct timespec ts;
        double left = deadline - mmp_sock_now_ms();
        if (left <= 0) {
            break;
        }
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)((left < 100 ? left : 100) * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    if (r->attached < r->replicas - 1) {
        int k = 1;
        while (k < r->replicas && r->fd[k] >= 0) {
            k++;
        }
        e = mmp_errorf(MMP_ERR_PEER, "%s: rank %d did not connect in %d ms", r->what, k,
                       r->timeout_ms);
    }
    pthread_mutex_unlock(&r->mu);
    return e;
}

/* A peer's failure on rank k's connection, as MMP_ERR_PEER naming it. */
static mmp_err lost(mmp_reduce_tcp *r, mmp_err e, int k)
{
    if (e == MMP_ERR_TIMEOUT) {
        return mmp_errorf(MMP_ERR_PEER, "%s: nothing from rank %d (%s) in %d ms", r->what, k,
                          k == 0 ? r->address : r->peer[k], r->timeout_ms);
    }
    if (e == MMP_ERR_PEER) {
        return mmp_error_prefix(MMP_ERR_PEER, "rank %d (%s)", k, k == 0 ? r->address : r->peer[k]);
    }
    return e;
}

#define DEFINE_ADD(NAME, T)                                                                        \
    static void NAME(void *acc_, const void *src_, size_t n)                                       \
    {                                                                                              \
        T *restrict acc = acc_;                                                                    \
        const T *restrict src = src_;                                                              \
        for (size_t i = 0; i < n; i++) {                                                           \
            acc[i] += src[i];                                                                      \
        }                                                                                          \
    }
DEFINE_ADD(add_f32, float)
DEFINE_ADD(add_f64, double)

mmp_err mmp_reduce_tcp_round(mmp_reduce_tcp *r, void *v, size_t n, size_t size)
{
    if (r->failed) {
        return mmp_errorf(MMP_ERR_PEER,
                          "%s: an earlier sum failed and the replicas are out of step", r->what);
    }
    uint64_t floats = n * (size / sizeof(float));
    double deadline = mmp_sock_deadline(r->timeout_ms);
    r->rounds++;
    mmp_err e = MMP_OK;
    if (r->rank > 0) {
        rt_frame f = {.round = r->rounds, .n = floats}, back;
        struct iovec iov[2] = {{&f, sizeof f}, {v, n * size}};
        e = mmp_sock_writev(r->fd[0], r->what, iov, 2, deadline, -1);
        if (e == MMP_OK) {
            e = mmp_sock_read(r->fd[0], r->what, &back, sizeof back, deadline, -1, NULL);
        }
        if (e == MMP_OK && back.round != r->rounds) {
            e = mmp_errorf(MMP_ERR_PROTO, "%s: rank 0 answered round %llu in round %llu", r->what,
                           (unsigned long long)back.round, (unsigned long long)r->rounds);
        } else if (e == MMP_OK && back.n == RT_LOST) {
            e = mmp_errorf(MMP_ERR_PEER,
                           "%s: rank 0 lost rank %d (its connection ended) in round %llu", r->what,
                           back.bad_rank, (unsigned long long)r->rounds);
        } else if (e == MMP_OK && back.n != floats) {
            e = back.n == RT_DISAGREE
                    ? mmp_errorf(MMP_ERR_PROTO,
                                 "%s: ranks disagree on n in round %llu: rank 0 has %llu, rank %d "
                                 "has %llu (every rank must sum the same length)",
                                 r->what, (unsigned long long)r->rounds,
                                 (unsigned long long)back.zero_n, back.bad_rank,
                                 (unsigned long long)back.bad_n)
                    : mmp_errorf(MMP_ERR_PROTO, "%s: rank 0 answered %llu floats for %llu", r->what,
                                 (unsigned long long)back.n, (unsigned long long)floats);
        }
        if (e == MMP_OK) {
            e = mmp_sock_read(r->fd[0], r->what, v, n * size, deadline, -1, NULL);
        }
        if (e != MMP_OK) {
            r->failed = 1;
            return lost(r, e, 0);
        }
        return MMP_OK;
    }
    /* Rank 0: every vector in, the rank-order sum, every sum out. */
    e = wait_attached(r, deadline);
    int bad_rank = -1, lost_rank = -1;
    uint64_t bad_n = 0;
    for (int k = 1; e == MMP_OK && k < r->replicas; k++) {
        rt_frame f;
        e = mmp_sock_read(r->fd[k], r->what, &f, sizeof f, deadline, -1, NULL);
        if (e == MMP_OK && (f.round != r->rounds || f.n > r->capacity)) {
            e = mmp_errorf(MMP_ERR_PROTO,
                           "%s: rank %d sent round %llu with n = %llu (round %llu, capacity %zu)",
                           r->what, k, (unsigned long long)f.round, (unsigned long long)f.n,
                           (unsigned long long)r->rounds, r->capacity);
            break;
        }
        if (e == MMP_OK) {
            float *dst = r->buf + (size_t)k * r->stride;
            e = mmp_sock_read(r->fd[k], r->what, dst, (size_t)f.n * sizeof(float), deadline, -1,
                              NULL);
        }
        if (e != MMP_OK) {
            e = lost(r, e, k);
            lost_rank = e == MMP_ERR_PEER ? k : -1;
        } else if (f.n != floats && bad_rank < 0) {
            bad_rank = k;
            bad_n = f.n;
        } else if (bad_rank < 0 && n > 0) {
            /* ((v0 + v1) + v2) + ...: the shm reduce's order, element by
             * element, each rank added as soon as it is in (the ranks are
             * read in rank order): while later ranks still compute. */
            const float *src = r->buf + (size_t)k * r->stride;
            if (size == sizeof(float)) {
                add_f32(v, src, n);
            } else {
                add_f64(v, src, n);
            }
        }
    }
    if (e == MMP_OK && bad_rank >= 0) {
        rt_frame back = {.round = r->rounds,
                         .n = RT_DISAGREE,
                         .bad_rank = bad_rank,
                         .zero_n = floats,
                         .bad_n = bad_n};
        for (int k = 1; k < r->replicas; k++) {
            struct iovec iov = {&back, sizeof back};
            (void)mmp_sock_writev(r->fd[k], r->what, &iov, 1, deadline, -1);
        }
        e = mmp_errorf(MMP_ERR_PROTO,
                       "%s: ranks disagree on n in round %llu: rank 0 has %llu, rank %d has %llu "
                       "(every rank must sum the same length)",
                       r->what, (unsigned long long)r->rounds, (unsigned long long)floats, bad_rank,
                       (unsigned long long)bad_n);
    }
    if (lost_rank > 0) {
        /* The others are waiting for this round's answer: tell them who. */
        rt_frame back = {.round = r->rounds, .n = RT_LOST, .bad_rank = lost_rank};
        for (int k = 1; k < r->replicas; k++) {
            struct iovec iov = {&back, sizeof back};
            if (k != lost_rank) {
                (void)mmp_sock_writev(r->fd[k], r->what, &iov, 1, mmp_sock_deadline(1000), -1);
            }
        }
    }
    for (int k = 1; e == MMP_OK && k < r->replicas; k++) {
        rt_frame back = {.round = r->rounds, .n = floats};
        struct iovec iov[2] = {{&back, sizeof back}, {v, n * size}};
        e = mmp_sock_writev(r->fd[k], r->what, iov, 2, deadline, -1);
        if (e != MMP_OK) {
            e = lost(r, e, k);
        }
    }
    if (e != MMP_OK) {
        r->failed = 1;
    }
    return e;
}

void mmp_reduce_tcp_close(mmp_reduce_tcp *r)
{
    if (!r) {
        return;
    }
    if (r->has_thread) {
        mmp_sock_stop(r->stop_fd, r->what);
        pthread_join(r->thread, NULL);
    }
    for (int k = 0; k < RT_MAX_RANKS; k++) {
        if (r->fd[k] >= 0) {
            /* everything sent was read by a peer that completed its round */
            mmp_sock_close_graceful(r->fd[k], mmp_sock_deadline(1000));
        }
    }
    if (r->lfd >= 0) {
        close(r->lfd);
    }
    if (r->stop_fd >= 0) {
        close(r->stop_fd);
    }
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r->buf);
    free(r);
}
