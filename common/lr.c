#include "common/lr.h"

#include <math.h>

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
