/* The training policy that is a pure function of the plan and the step:
 * the learning-rate schedule (linear warmup, then cosine to min_lr) and the
 * gradient-clipping coefficient from the global norm. The coordinator
 * computes both once per step for every stage (so all stages apply the same
 * numbers), the stages and the single-process trainer use them in their
 * optimizer step; none of it touches a tensor. */
#ifndef MMP_COMMON_LR_H
#define MMP_COMMON_LR_H

#include "common/config.h"

/* LR at step (0-based) of plan->job.steps. */
float mmp_lr_at(const mmp_plan *plan, int step);

/* Multiplier for the gradients given the global norm (1 when clipping is off
 * or the norm is within the limit). */
float mmp_clip_coef(const mmp_plan *plan, double global_norm);

#endif
