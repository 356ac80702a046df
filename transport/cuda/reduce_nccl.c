/* The replicas' reduce between GPUs over NCCL: an all-gather of every
 * rank's double vector, then the rank-order sum on each device
 * (transport/reduce_nccl.h says why not ncclAllReduce, and the contract).
 *
 * One sum of n doubles at v (device):
 *   agree    over the side (host) reduce: R doubles, rank k's n at k; every
 *            rank checks every n (MMP_ERR_PROTO naming the first that
 *            differs); a dead peer is the side reduce's MMP_ERR_PEER;
 *   init     the first sum settles the communicator's init (bounded);
 *   chunks   for each chunk of at most cfg.chunk doubles: ncclAllGather of
 *            v's chunk into the receive buffer (rank k's at k x m), settled;
 *            the sum kernel writes the chunk's rank-order sum over v's chunk.
 *            Both on cfg.stream, so chunk c + 1's all-gather overwrites the
 *            buffer only after chunk c's kernel read it;
 *   wait     an event after the last kernel, polled with the communicator's
 *            async error and the bound: the host returns with v summed.
 * One NCCL call settles before the next is made (a non-blocking
 * communicator takes no call while one is in progress).
 *
 * Tested: tests/nccl_mock/test_nccl_mock.c runs this file against the
 * stand-in CUDA runtime and NCCL (an R-rank all-gather over unix sockets,
 * the sum kernel's formula on the host): 3 ranks in 3 processes, rounds of
 * several lengths through several chunks, each rank's result equal bitwise
 * to the rank-order sum and to the tcp reduce's result; ranks disagreeing
 * on n; a peer SIGKILLed inside the all-gather; a peer stalled in it; a peer
 * that never starts its init. tests/gpu_reduce_nccl.c: the kernel on a
 * device against the host formula, bitwise; the whole path on a 1-rank
 * communicator (the sum equals the input, bitwise); two ranks on one GPU
 * (refused by NCCL on both ends, or summed right, never a hang). Untested
 * until two GPUs: real NCCL moving a gradient between ranks.
 *
 * Must never: add in another order than transport/rank_sum.h's, make an
 * NCCL call while one is in progress, wait without a bound, or leave a
 * communicator un-aborted after a failed sum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "transport/reduce_nccl.h"
#include "transport/sock.h"

_Static_assert(MMP_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "the id's size on the wire");

#define RN_MAX_RANKS 256 /* MMP_MAX_REPLICAS */
/* The receive buffer's bound, R x chunk doubles: 64 ranks x RN_CHUNK (2 GiB);
 * more ranks all-gather smaller chunks. */
#define RN_GATHER_MAX ((size_t)64 << 22)
#define RN_CHUNK ((size_t)1 << 22) /* doubles: 32 MiB a rank per all-gather */
#define RN_TAG "#nccl:"
#define RN_FINALIZE_MS 10000 /* at most, at close: a job's end must not wait a full timeout */

struct mmp_reduce_nccl {
    ncclComm_t comm; /* NULL once aborted */
    int ready;       /* the init settled */
    int failed;      /* a sum failed: out of step */
    int replicas, rank, device, timeout_ms;
    size_t capacity, chunk;
    cudaStream_t stream;
    double *gathered; /* device: replicas x chunk */
    cudaEvent_t done; /* after a sum's last kernel */
    mmp_reduce *side;
    double *ns; /* host: the agreement round's R doubles */
    ncclUniqueId id;
    unsigned long long rounds;
    char what[64];
};

static void nap(void)
{
    struct timespec ts = {0, 100000}; /* 0.1 ms */
    nanosleep(&ts, NULL);
}

/* Aborts and forgets the communicator; the reduce is out of step. */
static void abort_comm(mmp_reduce_nccl *r)
{
    if (r->comm) {
        ncclCommAbort(r->comm);
        r->comm = NULL;
    }
    r->failed = 1;
}

static mmp_err nccl_fail(mmp_reduce_nccl *r, ncclResult_t res, const char *what)
{
    const char *last = ncclGetLastError(r->comm);
    abort_comm(r);
    return mmp_errorf(MMP_ERR_PEER, "%s: %s: %s%s%s", r->what, what, ncclGetErrorString(res),
                      last && *last ? ": " : "", last ? last : "");
}

static mmp_err cuda_fail(mmp_reduce_nccl *r, cudaError_t ce, const char *what)
{
    (void)cudaGetLastError();
    abort_comm(r); /* a peer may wait in a collective this rank will not finish */
    return mmp_errorf(MMP_ERR_CUDA, "%s: %s: %s", r->what, what, cudaGetErrorString(ce));
}

/* Polls until the last NCCL call settles (ncclInProgress gone), at most
 * bound_ms. */
static mmp_err settle_within(mmp_reduce_nccl *r, ncclResult_t res, const char *what, int bound_ms)
{
    double deadline = mmp_sock_now_ms() + bound_ms;
    while (res == ncclInProgress) {
        if (mmp_sock_now_ms() > deadline) {
            abort_comm(r);
            return mmp_errorf(MMP_ERR_PEER, "%s: %s: no progress after %d ms (a peer gone?)",
                              r->what, what, bound_ms);
        }
        nap();
        ncclResult_t st = ncclInProgress;
        ncclResult_t q = ncclCommGetAsyncError(r->comm, &st);
        res = q != ncclSuccess ? q : st;
    }
    return res == ncclSuccess ? MMP_OK : nccl_fail(r, res, what);
}

static mmp_err settle(mmp_reduce_nccl *r, ncclResult_t res, const char *what)
{
    return settle_within(r, res, what, r->timeout_ms);
}

/* Waits for r->done (the sum's last kernel), polling the communicator: a
 * peer that died mid-collective ends in MMP_ERR_PEER, not a hung host. */
static mmp_err wait_done(mmp_reduce_nccl *r)
{
    double deadline = mmp_sock_now_ms() + r->timeout_ms;
    for (;;) {
        cudaError_t ce = cudaEventQuery(r->done);
        if (ce == cudaSuccess) {
            return MMP_OK;
        }
        if (ce != cudaErrorNotReady) {
            return cuda_fail(r, ce, "waiting for the sum");
        }
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(r->comm, &st);
        if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            return nccl_fail(r, q != ncclSuccess ? q : st, "the all-gather");
        }
        if (mmp_sock_now_ms() > deadline) {
            abort_comm(r);
            return mmp_errorf(MMP_ERR_PEER,
                              "%s: the all-gather: not done after %d ms (a peer gone?)", r->what,
                              r->timeout_ms);
        }
        nap();
    }
}

static mmp_err check_cfg(const mmp_reduce_nccl_cfg *c)
{
    if (!c) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl reduce: no cfg");
    }
    if (c->replicas < 1 || c->replicas > RN_MAX_RANKS) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl reduce: %d replicas (1 to %d)", c->replicas,
                          RN_MAX_RANKS);
    }
    if (c->rank < 0 || c->rank >= c->replicas) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl reduce: rank %d of %d", c->rank, c->replicas);
    }
    if (c->replicas > 1 && !c->side) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "nccl reduce: %d replicas and no side reduce (the ranks' n and liveness "
                          "go over it)",
                          c->replicas);
    }
    if (c->rank > 0 && !c->id) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl reduce: rank %d without rank 0's id", c->rank);
    }
    if (c->device < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "nccl reduce: device %d", c->device);
    }
    return MMP_OK;
}

mmp_err mmp_reduce_nccl_open(mmp_reduce_nccl **out, const mmp_reduce_nccl_cfg *cfg)
{
    *out = NULL;
    MMP_TRY(check_cfg(cfg));
    mmp_reduce_nccl *r = calloc(1, sizeof *r);
    if (!r || !(r->ns = calloc((size_t)cfg->replicas, sizeof *r->ns))) {
        free(r);
        return mmp_errorf(MMP_ERR_NOMEM, "nccl reduce: state");
    }
    r->replicas = cfg->replicas;
    r->rank = cfg->rank;
    r->device = cfg->device;
    r->capacity = cfg->capacity;
    r->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
    r->stream = (cudaStream_t)cfg->stream;
    r->side = cfg->side;
    r->chunk = cfg->chunk ? cfg->chunk : RN_CHUNK;
    r->chunk = r->chunk < r->capacity ? r->chunk : r->capacity;
    r->chunk = r->chunk < RN_GATHER_MAX / (size_t)r->replicas ? r->chunk
                                                              : RN_GATHER_MAX / (size_t)r->replicas;
    r->chunk = r->chunk ? r->chunk : 1;
    snprintf(r->what, sizeof r->what, "nccl reduce rank %d of %d", r->rank, r->replicas);
    mmp_err e = MMP_OK;
    if (r->chunk > SIZE_MAX / sizeof(double) / (size_t)r->replicas) {
        e = mmp_errorf(MMP_ERR_INVALID, "%s: %d x %zu doubles overflow", r->what, r->replicas,
                       r->chunk);
    }
    cudaError_t ce = e == MMP_OK ? cudaSetDevice(r->device) : cudaSuccess;
    if (e == MMP_OK && ce == cudaSuccess) {
        ce = cudaMalloc((void **)&r->gathered, (size_t)r->replicas * r->chunk * sizeof(double));
        r->gathered = ce == cudaSuccess ? r->gathered : NULL;
    }
    if (e == MMP_OK && ce == cudaSuccess) {
        ce = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
        r->done = ce == cudaSuccess ? r->done : NULL;
    }
    if (e == MMP_OK && ce != cudaSuccess) {
        e = cuda_fail(r, ce, "device buffers");
    }
    if (e == MMP_OK && r->rank == 0) {
        ncclResult_t res = ncclGetUniqueId(&r->id);
        e = res == ncclSuccess ? MMP_OK : nccl_fail(r, res, "ncclGetUniqueId");
    } else if (e == MMP_OK) {
        memcpy(r->id.internal, cfg->id, sizeof r->id.internal);
    }
    if (e == MMP_OK) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        ncclResult_t res = ncclCommInitRankConfig(&r->comm, r->replicas, r->id, r->rank, &config);
        if (res != ncclSuccess && res != ncclInProgress) {
            e = nccl_fail(r, res, "ncclCommInitRankConfig");
        }
        r->ready = res == ncclSuccess;
    }
    if (e != MMP_OK) {
        mmp_reduce_nccl_close(r);
        return e;
    }
    r->failed = 0;
    *out = r;
    return MMP_OK;
}

/* Every rank's n over the side reduce: MMP_ERR_PROTO on every rank when
 * they differ (each sees them all), the side's error when a peer is gone. */
static mmp_err agree(mmp_reduce_nccl *r, size_t n)
{
    if (!r->side) {
        return MMP_OK;
    }
    memset(r->ns, 0, (size_t)r->replicas * sizeof *r->ns);
    r->ns[r->rank] = (double)n;
    mmp_err e = mmp_reduce_sum_f64(r->side, r->ns, (size_t)r->replicas);
    if (e != MMP_OK) {
        return mmp_error_prefix(e, "%s: round %llu: the ranks' lengths over the host reduce",
                                r->what, r->rounds);
    }
    for (int k = 0; k < r->replicas; k++) {
        if (r->ns[k] != (double)n) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "%s: ranks disagree on n in round %llu: rank %d has %zu, rank %d has "
                              "%.0f (every rank must sum the same length)",
                              r->what, r->rounds, r->rank, n, k, r->ns[k]);
        }
    }
    return MMP_OK;
}

static mmp_err sum_chunks(mmp_reduce_nccl *r, double *v, size_t n)
{
    if (!r->ready) {
        MMP_TRY(settle(r, ncclInProgress, "communicator init"));
        r->ready = 1;
    }
    for (size_t off = 0; off < n; off += r->chunk) {
        size_t m = n - off < r->chunk ? n - off : r->chunk;
        ncclResult_t res = ncclAllGather(v + off, r->gathered, m, ncclDouble, r->comm, r->stream);
        MMP_TRY(settle(r, res, "ncclAllGather"));
        cudaError_t ce = (cudaError_t)mmp_rank_sum_f64_launch(v + off, r->gathered, m, m,
                                                              r->replicas, (void *)r->stream);
        if (ce != cudaSuccess) {
            return cuda_fail(r, ce, "the rank-order sum kernel");
        }
    }
    cudaError_t ce = cudaEventRecord(r->done, r->stream);
    if (ce != cudaSuccess) {
        return cuda_fail(r, ce, "cudaEventRecord after the sum");
    }
    return wait_done(r);
}

mmp_err mmp_reduce_nccl_sum_f64(mmp_reduce_nccl *r, double *v, size_t n)
{
    if (n > r->capacity || (!v && n > 0)) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: %zu doubles at %p (capacity %zu)", r->what, n,
                          (void *)v, r->capacity);
    }
    if (r->failed || !r->comm) {
        return mmp_errorf(MMP_ERR_PEER,
                          "%s: an earlier sum failed and the replicas are out of step", r->what);
    }
    r->rounds++;
    mmp_err e = agree(r, n);
    if (e == MMP_ERR_INVALID) {
        return e; /* the side's capacity: found before anything was shared */
    }
    e = e == MMP_OK && n > 0 ? sum_chunks(r, v, n) : e;
    if (e != MMP_OK) {
        abort_comm(r);
    }
    return e;
}

mmp_err mmp_reduce_nccl_address(const mmp_reduce_nccl *r, const char *host_port, char *out,
                                size_t cap)
{
    size_t n = strlen(host_port) + strlen(RN_TAG);
    if (n + 2 * sizeof r->id.internal + 1 > cap) {
        return mmp_errorf(MMP_ERR_INVALID, "%s: address '%s' too long for %zu bytes", r->what,
                          host_port, cap);
    }
    snprintf(out, cap, "%s%s", host_port, RN_TAG);
    for (size_t i = 0; i < sizeof r->id.internal; i++) {
        snprintf(out + n + 2 * i, 3, "%02x", (unsigned char)r->id.internal[i]);
    }
    return MMP_OK;
}

void mmp_reduce_nccl_close(mmp_reduce_nccl *r)
{
    if (!r) {
        return;
    }
    if (r->comm) {
        int bound = r->timeout_ms < RN_FINALIZE_MS ? r->timeout_ms : RN_FINALIZE_MS;
        if (r->failed || !r->ready) {
            abort_comm(r); /* a rank that never summed, or out of step */
        } else if (settle_within(r, ncclCommFinalize(r->comm), "ncclCommFinalize", bound) ==
                   MMP_OK) {
            ncclCommDestroy(r->comm);
            r->comm = NULL;
        } /* else settle aborted it */
    }
    if (r->done) {
        cudaEventDestroy(r->done);
    }
    if (r->gathered) {
        cudaFree(r->gathered);
    }
    (void)cudaGetLastError();
    free(r->ns);
    free(r);
}

const mmp_reduce_nccl_ops mmp_reduce_nccl_ops_cuda = {
    .open = mmp_reduce_nccl_open,
    .sum_f64 = mmp_reduce_nccl_sum_f64,
    .address = mmp_reduce_nccl_address,
    .close = mmp_reduce_nccl_close,
};
