/* Optimizer arithmetic on the CPU: the AdamW update and the sum of squares
 * behind the global gradient norm, both on the kernels' pool (parallel.h). */
#include "kernels/cpu.h"

#include <math.h>

#include "kernels/cpu/parallel.h"

#define OPT_GRAIN 16384

typedef struct {
    float *param, *m, *v;
    const float *grad;
    float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
} adamw_args;

MMP_CPU_CLONES static void adamw_range(void *p, size_t lo, size_t hi)
{
    const adamw_args *a = p;
    float *param = a->param, *m = a->m, *v = a->v;
    const float *grad = a->grad;
    float lr = a->lr, beta1 = a->beta1, beta2 = a->beta2, eps = a->eps;
    float weight_decay = a->weight_decay, bc1 = a->bc1, bc2 = a->bc2;
    for (size_t i = lo; i < hi; i++) {
        float g = grad[i];
        m[i] = beta1 * m[i] + (1.0f - beta1) * g;
        v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
        float mhat = m[i] / bc1;
        float vhat = v[i] / bc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
    }
}

void mmp_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t)
{
    // param (n), grad (n), m (n), v (n); t >= 1
    adamw_args a = {.param = param,
                    .m = m,
                    .v = v,
                    .grad = grad,
                    .lr = lr,
                    .beta1 = beta1,
                    .beta2 = beta2,
                    .eps = eps,
                    .weight_decay = weight_decay,
                    .bc1 = 1.0f - powf(beta1, (float)t),
                    .bc2 = 1.0f - powf(beta2, (float)t)};
    mmp_cpu_parallel_for(n, OPT_GRAIN, adamw_range, &a);
}

/* The sum runs in blocks of SUMSQ_BLOCK elements, each over 4 interleaved
 * double partial sums (element i to lane i % 4, lanes added pairwise), the
 * block sums then added in order: a fixed order whatever the thread count
 * (the blocks run on the pool), and no chain of dependent adds per element. */
#define SUMSQ_BLOCK 65536

typedef struct {
    const float *x;
    size_t n;
    double *block_sums;
} sumsq_args;

/* the 4 lanes as one vector (GCC / clang vector extensions), widened
 * element by element: one vcvtps2pd per 4 floats in the AVX2 clone */
typedef double sumsq_lanes __attribute__((vector_size(4 * sizeof(double))));

static MMP_CPU_INLINE double sumsq_block(const float *x, size_t n)
{
    sumsq_lanes s = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        sumsq_lanes v = {x[i], x[i + 1], x[i + 2], x[i + 3]};
        s += v * v;
    }
    for (int k = 0; i < n; i++, k++) {
        s[k] += (double)x[i] * x[i];
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

MMP_CPU_CLONES static void sumsq_range(void *p, size_t lo, size_t hi)
{
    const sumsq_args *a = p;
    for (size_t b = lo; b < hi; b++) {
        size_t start = b * SUMSQ_BLOCK;
        size_t len = a->n - start < SUMSQ_BLOCK ? a->n - start : SUMSQ_BLOCK;
        a->block_sums[b] = sumsq_block(a->x + start, len);
    }
}

double mmp_cpu_sumsq(const float *x, size_t n)
{
    // x (n)
    if (n <= SUMSQ_BLOCK) {
        double sum = 0.0;
        sumsq_args a = {x, n, &sum};
        sumsq_range(&a, 0, 1); /* one block, in the clone for this CPU */
        return sum;
    }
    enum { MAX_BLOCKS_ON_STACK = 256 };
    size_t blocks = (n + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double sum = 0.0;
    /* at most MAX_BLOCKS_ON_STACK blocks per pass, passes added in order */
    for (size_t first = 0; first < blocks; first += MAX_BLOCKS_ON_STACK) {
        double block_sums[MAX_BLOCKS_ON_STACK];
        size_t nb = blocks - first < MAX_BLOCKS_ON_STACK ? blocks - first : MAX_BLOCKS_ON_STACK;
        size_t start = first * SUMSQ_BLOCK;
        size_t len = n - start < nb * SUMSQ_BLOCK ? n - start : nb * SUMSQ_BLOCK;
        sumsq_args a = {x + start, len, block_sums};
        mmp_cpu_parallel_for(nb, 1, sumsq_range, &a);
        for (size_t b = 0; b < nb; b++) {
            sum += block_sums[b];
        }
    }
    return sum;
}
