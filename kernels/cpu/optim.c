/* Optimizer arithmetic on the CPU: the AdamW update and the sum of squares
 * behind the global gradient norm. */
#include "kernels/cpu.h"

#include <math.h>

void mmp_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t)
{
    // param (n), grad (n), m (n), v (n); t >= 1
    float bc1 = 1.0f - powf(beta1, (float)t);
    float bc2 = 1.0f - powf(beta2, (float)t);
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

double mmp_cpu_sumsq(const float *x, size_t n)
{
    // x (n)
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        sum += (double)x[i] * x[i];
    }
    return sum;
}
