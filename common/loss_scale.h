/* fp16 dynamic loss scaling with the semantics of PyTorch's GradScaler:
 * the loss gradient is multiplied by the scale (2^16 at the start) where
 * the loss's backward starts, the gradients are divided by it again before
 * the norm, clipping and AdamW, and a step whose global gradient sum of
 * squares is inf/nan is skipped by every stage while the scale halves;
 * after train.loss_scale_window consecutive clean steps it doubles.
 * bf16 and fp32 never scale (scale 1) and never skip.
 *
 * The state is a pure function of the plan and the sequence of steps'
 * sums of squares, kept by the coordinator (pipeline) and the
 * single-process trainer with the same arithmetic, so both decide the same
 * skips and scales. The scale is always a power of two, so scaling and
 * unscaling are exact (outside overflow and subnormals). Touches no tensor. */
#ifndef MMP_COMMON_LOSS_SCALE_H
#define MMP_COMMON_LOSS_SCALE_H

#include "common/config.h"

#define MMP_LOSS_SCALE_INIT 65536.0f /* 2^16, GradScaler's init_scale */

typedef struct mmp_loss_scale {
    float scale;    /* the loss gradient's multiplier for the next step */
    int good_steps; /* clean steps since the last change (GradScaler's growth tracker) */
    int skipped;    /* optimizer steps skipped so far: AdamW's t counts the steps taken */
} mmp_loss_scale;

/* The state at step 0: scale 2^16 under train.precision fp16, else 1. */
void mmp_loss_scale_init(mmp_loss_scale *ls, const mmp_plan *plan);

/* Whether plan scales the loss at all (fp16). */
int mmp_loss_scale_active(const mmp_plan *plan);

/* The loss gradient's multiplier at step (0-based): scale (the state's,
 * for that step), or +inf at the step train.debug_overflow_step names
 * (1-based; a test hook that forces an overflow). */
float mmp_loss_scale_grad_mult(float scale, const mmp_plan *plan, int step);

/* The step's outcome from the global sum of squares of the unscaled
 * gradients: returns 1 when the optimizer step is skipped (fp16 and sumsq
 * inf/nan), 0 when it is taken; updates the scale, the growth tracker and
 * the skip count. Without scaling it returns 0 and changes nothing (the
 * caller treats a non-finite norm as an error, as before). */
int mmp_loss_scale_update(mmp_loss_scale *ls, const mmp_plan *plan, double sumsq);

/* AdamW's 0-based step index for training step `step` (steps taken so far):
 * a skipped step does not advance the bias correction, as in PyTorch. */
int mmp_loss_scale_opt_step(const mmp_loss_scale *ls, int step);

#endif
