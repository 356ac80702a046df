/* Replica gradient reduce: the R replica processes of one stage sum their
 * gradient vectors through one POSIX shared-memory segment on one host, or
 * over tcp through rank 0 when the name is "host:port" (see name below).
 *
 * The sum is a chain in rank order, bucket by bucket (about 1 MB each): rank
 * 0's vector is copied into a shared accumulator, rank k adds its own once
 * rank k - 1 has, and the last rank's additions are the sums, which every
 * other rank then copies out. Each element is ((v0 + v1) + v2) + ..., the
 * same on every rank whatever the arrival order: replicas stay in lock-step
 * through the optimizer step without a broadcast. A rank adds as soon as the
 * ranks before it have, so when the replicas finish their last backward one
 * after another, the early ones' sum is done while the last one computes; it
 * then makes one pass over its own vector (transport/reduce.c).

 * Weighting: mmpipe's losses are normalised by the global batch (every
 * micro-batch's gradient is already scaled by 1 / train.batch), so the plain
 * sum of the replicas' sums is the sample-weighted mean one process computes
 * over the same samples. A vector of partial rows that are zero everywhere but
 * on one rank (per-micro-batch records) is gathered exactly by the same sum.
 *
 * Lifecycle: rank 0 creates the segment under `name`; the others attach,
 * waiting for it up to timeout_ms. Once all R ranks are attached the name is
 * unlinked, so a crash leaves nothing in /dev/shm. Waits sleep on a futex in
 * the segment (no spinning) and check that the peers are alive (their pids are
 * in the segment): a dead peer is MMP_ERR_PEER naming its rank and pid, and a
 * wait longer than timeout_ms is MMP_ERR_PEER too, never a silent hang. R = 1
 * is allowed and makes mmp_reduce_sum a no-op. */
#ifndef MMP_TRANSPORT_REDUCE_H
#define MMP_TRANSPORT_REDUCE_H

#include <stddef.h>

#include "common/err.h"

typedef struct mmp_reduce_cfg {
    /* shm name, "/mmpipe-<token12>-r-image.0"; or "host:port" for replicas on
     * several hosts: the sums go over tcp through rank 0, which listens there
     * (port 0: a free port, mmp_reduce_address says which) and which the
     * other ranks are given (transport/reduce_tcp.c; the same bits). */
    const char *name;
    int replicas;    /* R, 1 to 256 (MMP_MAX_REPLICAS) */
    int rank;        /* 0 .. R-1 */
    size_t capacity; /* floats per rank, the largest n mmp_reduce_sum is given */
    int timeout_ms;  /* attach and every wait; <= 0: 60000 */
    /* over tcp: the job's secret every rank proves it holds before its hello
     * (transport/auth.h); required there, ignored by shm */
    const char *secret;
} mmp_reduce_cfg;

typedef struct mmp_reduce mmp_reduce;

/* Rank 0 creates, the others attach. MMP_ERR_INVALID for a bad cfg (named),
 * MMP_ERR_IO for shm failures (rank 0: also when the name already exists),
 * MMP_ERR_PEER when rank 0's segment does not appear in time, its geometry
 * (R, capacity) differs from cfg's, or cfg's rank is already attached.
 * Does not wait for the other ranks: rank 0 returns once its segment exists,
 * rank k > 0 once it has attached; the first sum waits for everyone. R = 1
 * creates no segment at all. *out is NULL on failure. */
mmp_err mmp_reduce_open(mmp_reduce **out, const mmp_reduce_cfg *cfg);
/* v (n <= capacity floats) becomes the rank-order sum of every rank's v. All
 * ranks must call it the same number of times with the same n. Blocks until
 * every rank has contributed; each of its two waits lasts at most timeout_ms.
 * Errors:
 * - n > capacity, or v NULL with n > 0: MMP_ERR_INVALID, found before anything
 *   is shared, so the ranks stay in step and the call may be repeated.
 * - ranks disagree on n: MMP_ERR_PROTO on every rank (each sees all the n's).
 * - a peer died, closed, or did not arrive in timeout_ms: MMP_ERR_PEER naming
 *   its rank and pid.
 * After a failure other than MMP_ERR_INVALID the ranks are out of step: every
 * later sum is MMP_ERR_PEER at once; close and reopen. */
mmp_err mmp_reduce_sum(mmp_reduce *r, float *v, size_t n);
/* The same over doubles: n doubles take 2n floats of the capacity. The
 * gradients a stage accumulates in double (nn/params.h) are reduced this way. */
mmp_err mmp_reduce_sum_f64(mmp_reduce *r, double *v, size_t n);
/* NULL-safe; frees r. Marks this rank closed, so a peer blocked in (or later
 * entering) a sum this rank will not join gets MMP_ERR_PEER at once rather
 * than after timeout_ms. Removes the name if the segment was never fully
 * attached (a rank that has not attached yet then times out in open). */
void mmp_reduce_close(mmp_reduce *r);
/* The name the other ranks must be given: cfg's, except over tcp where rank
 * 0 reports "host:<the port it listens on>". Valid until the close. */
const char *mmp_reduce_address(const mmp_reduce *r);

#endif
