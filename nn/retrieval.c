/* Retrieval metrics over ITC embeddings (validation recall@1). A metric the
 * host reads element by element: the embeddings are HOST memory (a device
 * stage copies its embeddings to the host first) and the similarity GEMM
 * runs on the CPU backend. */
#include <stdlib.h>

#include "kernels/backend.h"
#include "nn/model.h"

mmp_err mmp_retrieval_r1(const float *img_emb, const float *txt_emb, int n, int E, double *i2t,
                         double *t2i)
{
    float *sim = malloc((size_t)n * (size_t)n * sizeof(float) + 1);
    if (!sim) {
        return mmp_errorf(MMP_ERR_NOMEM, "similarity matrix %d x %d", n, n);
    }
    /* sim (n,n) = img (n,E) @ txt^T: row a = image a against every text. */
    mmp_backend *cpu = mmp_backend_cpu();
    cpu->ops->gemm(cpu, 0, 1, n, n, E, 1.0f, img_emb, E, txt_emb, E, 0.0f, sim, n);
    int hit_i = 0, hit_t = 0;
    for (int a = 0; a < n; a++) {
        int ok_i = 1, ok_t = 1;
        float own = sim[(size_t)a * n + a];
        for (int b = 0; b < n; b++) {
            if (b == a) {
                continue;
            }
            if (sim[(size_t)a * n + b] >= own) {
                ok_i = 0; /* image a retrieves text b at least as well as its own */
            }
            if (sim[(size_t)b * n + a] >= own) {
                ok_t = 0; /* text a retrieves image b at least as well */
            }
        }
        hit_i += ok_i;
        hit_t += ok_t;
    }
    free(sim);
    *i2t = n ? (double)hit_i / n : 0;
    *t2i = n ? (double)hit_t / n : 0;
    return MMP_OK;
}
