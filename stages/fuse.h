/* The fusion step over one micro-batch, with skipped samples.
 *
 * Under data.on_bad_sample: skip, a branch may flag samples of a micro-batch
 * as bad (valid = 0). The fusion stage trains only on the rows good in both
 * branches: it gathers them into contiguous buffers, runs the fusion net on
 * those k rows with weight k / batch, and scatters the input gradients back
 * (bad rows get zero gradient). With every row good this is exactly the plain
 * fusion forward/backward. Shared by the single-process trainer and the
 * fusion stage process, so both do the same arithmetic. One micro-batch at a
 * time (the fusion stage runs F and B back to back).
 *
 * Devices: the activations, the mask, the staging and the input gradients
 * are memory of the fusion net's backend (be); the valid flags are HOST
 * memory (the rows to use are decided on the host). */
#ifndef MMP_STAGES_FUSE_H
#define MMP_STAGES_FUSE_H

#include <stddef.h>

#include "common/err.h"
#include "nn/model.h"
#include "nn/wgrad.h"

typedef struct mmp_fuse {
    mmp_backend *be;
    int mb_max, T;
    size_t img_row, txt_row;               /* floats per sample: Ni*D, T*D */
    float *img, *txt, *mask, *dimg, *dtxt; /* compact staging, (mb_max, row) */
    int *rows;
    int n, k; /* this micro-batch: samples, rows used */
} mmp_fuse;

mmp_err mmp_fuse_init(mmp_fuse *f, mmp_backend *be, int mb_max, size_t img_row, int T, int D);
void mmp_fuse_fini(mmp_fuse *f);

/* img (n,Ni,D), txt (n,T,D), mask (n,T), img_valid/txt_valid (n) 1/0 or NULL
 * (all good). Adds weight * parts (weight = k / batch) to *acc; returns the
 * rows skipped (n - k) through *skipped. */
void mmp_fuse_forward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                      const float *txt, const float *mask, const float *img_valid,
                      const float *txt_valid, int n, int batch, mmp_loss_parts *acc, int *skipped);
/* Backward of the last forward: dimg (n,Ni,D) and dtxt (n,T,D) are
 * overwritten (zero on skipped rows). The loss gradient is multiplied by
 * loss_mult (the fp16 loss scale, common/loss_scale.h; 1 otherwise). */
void mmp_fuse_backward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, int batch,
                       float loss_mult, float *dimg, float *dtxt);

/* Batch scope (model.fusion.itc_scope: batch): ITC over all of a step's
 * pairs and ITM hard negatives mined from the whole batch. The branches
 * still run micro-batches; their outputs are gathered here, each at its
 * micro-batch's row offset (mmp_plan_mb_offset), so the rows are the step's
 * samples in batch order whatever train.microbatches. Once every row is in,
 * mmp_fuse_step_run runs the fusion net once over the whole batch (as one
 * micro-batch of `batch` rows, through an mmp_fuse initialised for `batch`
 * rows, so skipped samples are handled as everywhere) and leaves each row's
 * input gradients in dimg/dtxt for the micro-batch's backward to send. The
 * fusion net's acts must be created for `batch` rows.
 *
 * Devices: img, txt, mask, dimg, dtxt are memory of be; the valid flags are
 * HOST memory. */
typedef struct mmp_fuse_step {
    mmp_backend *be;
    int batch, T;
    size_t img_row, txt_row;
    float *img, *txt, *mask, *dimg, *dtxt; /* (batch, row) */
    float *valid[2];                       /* (batch) image, text: 1 good, 0 skipped (HOST) */
    int rows;                              /* rows put since mmp_fuse_step_begin */
    int done;                              /* mmp_fuse_step_run ran for this step */
    mmp_wgrad wg; /* mmp_fuse_step_run_input's deferred weight gradients, until run */
} mmp_fuse_step;

mmp_err mmp_fuse_step_init(mmp_fuse_step *s, mmp_backend *be, int batch, size_t img_row, int T,
                           int D);
/* NULL-safe, idempotent, valid after a failed init. */
void mmp_fuse_step_fini(mmp_fuse_step *s);
/* Forgets the last step's rows; clear: also zeroes every row and flag (a
 * replica that will sum its rows with the other replicas'). */
void mmp_fuse_step_begin(mmp_fuse_step *s, int clear);
/* Rows [off, off + n) of the step: img (n,Ni,D), txt (n,T,D), mask (n,T)
 * copied in unless NULL (NULL: the caller wrote them in place, at s->img +
 * off * img_row and so on); img_valid/txt_valid (n) HOST, NULL: all good. */
void mmp_fuse_step_put(mmp_fuse_step *s, int off, int n, const float *img, const float *txt,
                       const float *mask, const float *img_valid, const float *txt_valid);
/* The fusion forward and backward over all `batch` rows (every row must have
 * been put): adds the loss parts (weighted k / batch) to *acc, the skipped
 * rows to *skipped, the parameter gradients to net's, and overwrites
 * s->dimg / s->dtxt (loss gradient times loss_mult). f must have been
 * initialised for `batch` rows. */
void mmp_fuse_step_run(mmp_fuse_step *s, mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts,
                       float loss_mult, mmp_loss_parts *acc, int *skipped);
/* zb-h1's split of it (nn/wgrad.h): as mmp_fuse_step_run, but the linear
 * layers' weight gradients are only recorded (s->wg: the layers' inputs in
 * acts, which must stay untouched until the weight pass, and copies of
 * their output gradients); the net's other parameter gradients are
 * computed, the deferred ones left at +0. mmp_fuse_step_run_weights then
 * replays them, with the bits the fused backward gives, and adds their
 * ranges to the net's double gradient sums (nn/params.h); keep 0 (a fusion
 * replica whose gradients are not kept: it never ends its mb_begin) drops
 * them instead. A no-op when nothing is recorded; returns a failure to
 * record (out of memory) or MMP_OK. */
void mmp_fuse_step_run_input(mmp_fuse_step *s, mmp_fuse *f, mmp_fusion_net *net,
                             mmp_fusion_acts *acts, float loss_mult, mmp_loss_parts *acc,
                             int *skipped);
mmp_err mmp_fuse_step_run_weights(mmp_fuse_step *s, mmp_fusion_net *net, int keep);
/* Whether mmp_fuse_step_run_input recorded work mmp_fuse_step_run_weights
 * has not run yet. */
int mmp_fuse_step_weights_pending(const mmp_fuse_step *s);

#endif
