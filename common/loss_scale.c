/* fp16 dynamic loss scaling (common/loss_scale.h). Pure arithmetic on the
 * state; must never touch a tensor or a message. */
#include "common/loss_scale.h"

#include <math.h>

int mmp_loss_scale_active(const mmp_plan *plan)
{
    return plan->train.precision == MMP_PREC_FP16;
}

void mmp_loss_scale_init(mmp_loss_scale *ls, const mmp_plan *plan)
{
    ls->scale = mmp_loss_scale_active(plan) ? MMP_LOSS_SCALE_INIT : 1.0f;
    ls->good_steps = 0;
    ls->skipped = 0;
}

float mmp_loss_scale_grad_mult(float scale, const mmp_plan *plan, int step)
{
    if (plan->train.debug_overflow_step > 0 && step + 1 == plan->train.debug_overflow_step) {
        return INFINITY;
    }
    return scale;
}

int mmp_loss_scale_update(mmp_loss_scale *ls, const mmp_plan *plan, double sumsq)
{
    if (!mmp_loss_scale_active(plan)) {
        return 0;
    }
    if (!isfinite(sumsq)) {
        /* GradScaler: backoff_factor 0.5, growth tracker reset; the scale
         * stays a normal float (fp32's smallest power of two, far below any
         * scale a real run reaches) */
        if (ls->scale > 0x1p-120f) {
            ls->scale *= 0.5f;
        }
        ls->good_steps = 0;
        ls->skipped++;
        return 1;
    }
    if (++ls->good_steps >= plan->train.loss_scale_window) {
        if (ls->scale < 0x1p120f) {
            ls->scale *= 2.0f; /* growth_factor 2 */
        }
        ls->good_steps = 0;
    }
    return 0;
}

int mmp_loss_scale_opt_step(const mmp_loss_scale *ls, int step)
{
    return step - ls->skipped;
}
