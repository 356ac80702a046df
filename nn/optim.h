/* The optimizer step shared by every process that owns parameters: AdamW
 * with decoupled weight decay on the parameters that take it, at the
 * learning rate and gradient scale of common/lr.h (the policy, computed the
 * same in every process). */
#ifndef MMP_NN_OPTIM_H
#define MMP_NN_OPTIM_H

#include "common/config.h"
#include "common/lr.h"
#include "nn/params.h"

/* One AdamW step (t = step + 1) over p with grads scaled by grad_scale. */
void mmp_optim_step(mmp_params *p, const mmp_plan *plan, int step, float lr, float grad_scale);

#endif
