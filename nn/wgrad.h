/* Deferred weight gradients: the W pass of a zero-bubble schedule.
 *
 * A backward split into B (input gradients, and every parameter gradient that
 * is not a linear/conv weight GEMM: norms, embeddings, position tables) and W
 * (dW = dout^T x and db of the linear and conv layers). While a network's
 * mmp_lowp has a recorder attached (mmp_lowp.defer), mmp_lowp_linear_bwd and
 * mmp_lowp_conv2d_bwd compute only the input gradient and record the weight
 * part as a job: the layer's saved input (a pointer into the micro-batch's
 * activations, which the caller keeps until W) and a copy of the output
 * gradient (the backward's workspace is reused by the next layer). W replays
 * the jobs with the same kernel calls on the same inputs, so every weight
 * gradient gets the bits the fused backward gives it.
 *
 * Gradient accumulation (nn/params.h) stays exact: B runs between
 * mmp_params_mb_begin and mmp_params_mb_end as before (the deferred weights'
 * float gradients are still zero then, and adding +0 to the double sum, never
 * -0, changes nothing); mmp_wgrad_run zeroes the deferred gradients, replays,
 * and adds just their ranges to the double sum. As long as a process runs its
 * W passes in ascending micro-batch order (the schedule checker demands it),
 * every double sum adds the same floats in the same order as the fused path.
 *
 * Memory: the output-gradient copies grow on the first B passes of a
 * recorder (backend memory, kept for later steps); nothing else allocates. */
#ifndef MMP_NN_WGRAD_H
#define MMP_NN_WGRAD_H

#include <stddef.h>

#include "common/err.h"
#include "kernels/backend.h"

struct mmp_lowp;
struct mmp_params;

typedef struct mmp_wgrad_job {
    int conv;             /* 1: conv2d, 0: linear */
    float *dw, *db;       /* parameter gradients (arena), db may be NULL */
    const float *inp, *w; /* the layer's saved input and weights */
    size_t dout_at;       /* floats into the recorder's store */
    int N, C, OC;         /* linear */
    mmp_conv_shape s;     /* conv2d */
    float *scratch;       /* conv2d's im2col scratch (the network's) */
} mmp_wgrad_job;

typedef struct mmp_wgrad {
    mmp_backend *be;
    float *store; /* backend memory: the recorded output gradients */
    size_t cap, used;
    mmp_wgrad_job *jobs;
    int n, cap_jobs;
    mmp_err err; /* the first failure to record (out of memory), reported by run */
} mmp_wgrad;

void mmp_wgrad_init(mmp_wgrad *wg, mmp_backend *be);
/* NULL-safe, idempotent. */
void mmp_wgrad_fini(mmp_wgrad *wg);
/* Whether jobs are recorded and not yet run. */
int mmp_wgrad_pending(const mmp_wgrad *wg);

/* Records one layer's weight-gradient work (called by nn/lowp.c). Copies
 * dout (n_dout floats); keeps the inp and w pointers. A failure to grow the
 * store is kept in wg->err. */
void mmp_wgrad_record_linear(mmp_wgrad *wg, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, int N, int C, int OC);
void mmp_wgrad_record_conv2d(mmp_wgrad *wg, float *dw, float *db, const float *dout,
                             const float *inp, const float *w, const mmp_conv_shape *s,
                             float *scratch);

/* Drops the recorded jobs unrun (their gradients stay as B left them: +0);
 * returns wg->err (cleared) or MMP_OK. */
mmp_err mmp_wgrad_clear(mmp_wgrad *wg);

/* The W pass: zeroes every recorded gradient range of p, replays the jobs in
 * recording order through lp (its recorder must not be wg's: detached while
 * running), adds the ranges to p's double accumulator once each, and empties
 * wg. Returns wg->err (then nothing ran) or MMP_OK. */
mmp_err mmp_wgrad_run(mmp_wgrad *wg, const struct mmp_lowp *lp, struct mmp_params *p);

#endif
