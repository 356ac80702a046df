/* The optimizer step shared by every process that owns parameters:
 * learning-rate schedule (linear warmup, then cosine to min_lr), gradient
 * clipping by the global norm (computed by the caller across all stages, so
 * every stage applies the same coefficient), and AdamW with decoupled weight
 * decay on the parameters that take it. */
#ifndef MMP_NN_OPTIM_H
#define MMP_NN_OPTIM_H

#include "common/config.h"
#include "nn/params.h"

/* LR at step (0-based) of plan->job.steps. */
float mmp_lr_at(const mmp_plan *plan, int step);

/* Multiplier for the gradients given the global norm (1 when clipping is off
 * or the norm is within the limit). */
float mmp_clip_coef(const mmp_plan *plan, double global_norm);

/* One AdamW step (t = step + 1) over p with grads scaled by grad_scale. */
void mmp_optim_step(mmp_params *p, const mmp_plan *plan, int step, float lr, float grad_scale);

#endif
