#include "nn/optim.h"

#include <math.h>

void mmp_optim_step(mmp_params *p, const mmp_plan *plan, int step, float lr, float grad_scale)
{
    const float b1 = plan->train.optimizer.beta1, b2 = plan->train.optimizer.beta2;
    const float eps = plan->train.optimizer.eps, wd = plan->train.optimizer.weight_decay;
    mmp_backend *be = p->be;
    if (grad_scale != 1.0f) {
        be->ops->scale(be, p->grads, grad_scale, p->total);
    }
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        if (!q->trainable) {
            continue;
        }
        be->ops->adamw(be, q->w, q->g, q->m, q->v, q->n, lr, b1, b2, eps, q->decay ? wd : 0.0f,
                       step + 1);
    }
}
