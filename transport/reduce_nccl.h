/* The replicas' gradient reduce between GPUs over NCCL
 * (transport/cuda/reduce_nccl.c): what a GPU stage whose replicas span hosts
 * uses instead of staging its double gradients through host memory for the
 * tcp reduce. The contract is transport/reduce.h's, on device vectors:
 * every rank ends with the same bits, and with the bits the host reduce
 * (shm or tcp) gives for the same vectors.
 *
 * Why an all-gather and not ncclAllReduce. ncclAllReduce's summation order
 * depends on the algorithm and protocol NCCL picks (ring, tree, NVLS,
 * CollNet; LL, LL128, Simple), on the channel count and on the chunking;
 * even with NCCL_ALGO=Ring every rank gets the same bits (the reduced chunk
 * is broadcast), but not ((v0 + v1) + v2) + ...: each chunk's sum starts at
 * a different rank of the ring. mmpipe promises that replicas train to the
 * bits of one process, and the host reduces sum in rank order, so this one
 * does too: ncclAllGather of every rank's vector (no arithmetic in NCCL),
 * then a kernel adds the R vectors in rank order on each device
 * (transport/rank_sum.h: the same formula the host reduces use). The cost
 * is R x the vector's bytes received per rank instead of about 2x, and a
 * receive buffer of R x chunk doubles: fine for the handful of replicas a
 * stage has; the vector goes through in chunks (cfg.chunk) so the buffer
 * stays bounded.
 *
 * The id. Rank 0 makes the ncclUniqueId; it travels to the other ranks over
 * the control plane, appended to rank 0's tcp reduce address as
 * "host:port#nccl:<256 hex digits>" (mmp_reduce_nccl_address; read back with
 * mmp_nccl_parse_address, transport/channel.h, which checks it whole: it
 * comes from another process).
 *
 * The side reduce. Each rank also holds the host reduce of the same ranks
 * (cfg.side, over tcp: the stage's small host vectors go there). Every sum
 * first sums, over it, a vector of R doubles where rank k puts its n at k:
 * every rank then sees every rank's n (disagreement is MMP_ERR_PROTO on
 * every rank, before any NCCL call, as reduce.h promises), and a dead or
 * departed peer is named by the tcp reduce at once instead of after a
 * collective's timeout. Its capacity must be at least 2 R floats.
 *
 * NCCL. A non-blocking communicator (config.blocking = 0) over all R
 * ranks, on cfg.device; every call that returns ncclInProgress is polled
 * with ncclCommGetAsyncError until it settles, at most timeout_ms; the
 * collectives and the sum kernel go on cfg.stream (the stage's stream: the
 * gradients are ready there, the optimizer follows there); the host then
 * waits for an event after the last kernel, polling the communicator's
 * error and the bound, so a peer that dies mid-collective ends in
 * MMP_ERR_PEER, never a hang. Any NCCL error, a CUDA error after NCCL
 * calls were queued, or a bound reached ends in ncclCommAbort. */
#ifndef MMP_TRANSPORT_REDUCE_NCCL_H
#define MMP_TRANSPORT_REDUCE_NCCL_H

#include <stddef.h>

#include "common/err.h"
#include "transport/reduce.h"

#define MMP_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES (checked where nccl.h is seen) */

typedef struct mmp_reduce_nccl_cfg {
    int replicas;     /* R, 1 to 64 (1: a communicator of one, the whole path still runs) */
    int rank;         /* 0 .. R-1 */
    size_t capacity;  /* doubles: the largest n mmp_reduce_nccl_sum_f64 is given */
    int device;       /* CUDA ordinal the vectors live on */
    void *stream;     /* cudaStream_t the vectors are ordered on (NULL: the legacy default) */
    mmp_reduce *side; /* the same ranks' host reduce (not owned); NULL only when R = 1 */
    const void *id;   /* rank > 0: rank 0's id, MMP_NCCL_ID_BYTES; rank 0: NULL (made here) */
    int timeout_ms;   /* each wait; <= 0: 60000 */
    size_t chunk;     /* doubles per all-gather; 0: 1 << 22 (R x 32 MiB of receive buffer),
                         at most 2^28 / R (a 2 GiB buffer) */
} mmp_reduce_nccl_cfg;

typedef struct mmp_reduce_nccl mmp_reduce_nccl;

/* These calls live in the CUDA module (common/cuda_module.h), with the
 * rank-order sum kernel; code outside the module (the stages) reaches them
 * through the module's table, mmp_reduce_nccl_load. */
/* Checks cfg (MMP_ERR_INVALID, named, before any CUDA or NCCL call), makes
 * the device buffers on cfg.device and starts this rank's communicator init
 * (rank 0: with an id made here). Does not wait for the other ranks: the
 * init settles in the first sum. MMP_ERR_CUDA for a failed allocation,
 * MMP_ERR_PEER for NCCL refusing the init (its words). *out NULL on failure. */
mmp_err mmp_reduce_nccl_open(mmp_reduce_nccl **out, const mmp_reduce_nccl_cfg *cfg);
/* v (n <= capacity doubles, device memory on cfg.device, ready on
 * cfg.stream) becomes the rank-order sum of every rank's v. All ranks call
 * it the same number of times; blocks until the sum is in v (the host waits
 * for the stream). Errors as mmp_reduce_sum's:
 * - n > capacity, or v NULL with n > 0: MMP_ERR_INVALID, found before
 *   anything is shared (the ranks stay in step);
 * - ranks disagree on n: MMP_ERR_PROTO on every rank, naming a rank and its n;
 * - a peer died, closed or did not come (side reduce, NCCL's async error, or
 *   timeout_ms on one wait): MMP_ERR_PEER, the communicator aborted;
 * - a CUDA error: MMP_ERR_CUDA, the communicator aborted.
 * After a failure other than MMP_ERR_INVALID every later sum is MMP_ERR_PEER
 * at once, touching neither NCCL nor the side reduce; close and reopen. */
mmp_err mmp_reduce_nccl_sum_f64(mmp_reduce_nccl *r, double *v, size_t n);
/* "host_port#nccl:<the id in hex>" into out: what the other ranks are given
 * (host_port: rank 0's side reduce address). MMP_ERR_INVALID if it does not
 * fit in cap. */
mmp_err mmp_reduce_nccl_address(const mmp_reduce_nccl *r, const char *host_port, char *out,
                                size_t cap);
/* NULL-safe; frees r. A communicator whose every sum succeeded is finalized
 * and destroyed (bounded by timeout_ms, else aborted); any other is aborted,
 * so a peer blocked in a collective this rank will not join gets an error. */
void mmp_reduce_nccl_close(mmp_reduce_nccl *r);

/* The rank-order sum on the device (transport/cuda/rank_sum.cu): out[i] =
 * mmp_rank_sum_f64(gathered, stride, ranks, i) for i < n, queued on stream
 * (a cudaStream_t). Returns the cudaError_t of the launch (0: queued). */
int mmp_rank_sum_f64_launch(double *out, const double *gathered, size_t n, size_t stride, int ranks,
                            void *stream);

/* The calls above as one table: the module's mmp_reduce_nccl_ops_cuda. */
typedef struct mmp_reduce_nccl_ops {
    mmp_err (*open)(mmp_reduce_nccl **out, const mmp_reduce_nccl_cfg *cfg);
    mmp_err (*sum_f64)(mmp_reduce_nccl *r, double *v, size_t n);
    mmp_err (*address)(const mmp_reduce_nccl *r, const char *host_port, char *out, size_t cap);
    void (*close)(mmp_reduce_nccl *r);
} mmp_reduce_nccl_ops;
extern const mmp_reduce_nccl_ops mmp_reduce_nccl_ops_cuda;

/* *out: the module's table, loading the module (transport/cuda_entry.c).
 * MMP_ERR_UNSUPPORTED in a build without CUDA (the coordinator never asks
 * for this reduce there, coordinator/steps.c; a stage asked anyway says
 * so), MMP_ERR_CUDA when the module cannot be loaded. */
mmp_err mmp_reduce_nccl_load(const mmp_reduce_nccl_ops **out);

#endif
