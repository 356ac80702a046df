#include "nn/optim.h"

#include <math.h>

#include "kernels/cpu.h"

float mmp_lr_at(const mmp_plan *plan, int step)
{
    float lr = plan->train.optimizer.lr, min_lr = plan->train.optimizer.min_lr;
    int warm = plan->train.optimizer.warmup, total = plan->job.steps;
    if (step < warm) {
        return lr * (float)(step + 1) / (float)warm;
    }
    if (total <= warm) {
        return lr;
    }
    double progress = (double)(step - warm) / (double)(total - warm);
    if (progress > 1) {
        progress = 1;
    }
    return (float)(min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress)));
}

float mmp_clip_coef(const mmp_plan *plan, double global_norm)
{
    double clip = plan->train.clip_grad_norm;
    if (clip <= 0 || global_norm <= clip) {
        return 1.0f;
    }
    return (float)(clip / (global_norm + 1e-6));
}

void mmp_optim_step(mmp_params *p, const mmp_plan *plan, int step, float lr, float grad_scale)
{
    const float b1 = plan->train.optimizer.beta1, b2 = plan->train.optimizer.beta2;
    const float eps = plan->train.optimizer.eps, wd = plan->train.optimizer.weight_decay;
    if (grad_scale != 1.0f) {
        mmp_cpu_scale(p->grads, grad_scale, p->total);
    }
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        if (!q->trainable) {
            continue;
        }
        mmp_cpu_adamw(q->w, q->g, q->m, q->v, q->n, lr, b1, b2, eps, q->decay ? wd : 0.0f,
                      step + 1);
    }
}
