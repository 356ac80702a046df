/* Token + position embedding. Token ids are trusted here, as on the CPU: the
 * data loader validates them against the vocabulary. */
#include "kernels/cuda/internal.cuh"

static __global__ void embedding_fwd_kernel(float *out, const int32_t *ids, const float *wte,
                                            const float *wpe, int B, int T, int C)
{
    for (size_t i = thread_index(); i < (size_t)B * T * C; i += thread_count()) {
        const size_t bt = i / C;
        const int c = (int)(i % C), t = (int)(bt % T);
        float v = wte[(size_t)ids[bt] * C + c];
        if (wpe) {
            v += wpe[(size_t)t * C + c];
        }
        out[i] = v;
    }
}

/* Repeated ids add into the same row of dwte. Deterministic, no atomics:
 * one thread per channel c walks the positions bt = 0..B*T-1 in order, so
 * every dwte[v, c] sums its positions in the CPU reference's order (bitwise
 * the same sums); threads never share an address. Parallel over C only,
 * which is plenty for the text branch's B*T of a micro-batch. */
static __global__ void embedding_bwd_wte_kernel(float *dwte, const float *dout, const int32_t *ids,
                                                int B, int T, int C)
{
    for (size_t c = thread_index(); c < (size_t)C; c += thread_count()) {
        for (size_t bt = 0; bt < (size_t)B * T; bt++) {
            dwte[(size_t)ids[bt] * C + c] += dout[bt * C + c];
        }
    }
}

/* dwpe (t, c) sums over b in order: one thread per (t, c), no atomics. */
static __global__ void embedding_bwd_wpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    for (size_t i = thread_index(); i < (size_t)T * C; i += thread_count()) {
        float sum = 0.0f;
        for (int b = 0; b < B; b++) {
            sum += dout[(size_t)b * T * C + i];
        }
        dwpe[i] += sum;
    }
}

mmp_err mmp_cuda_embedding_fwd(mmp_cuda_ctx *ctx, float *out, const int32_t *ids, const float *wte,
                               const float *wpe, int B, int T, int C)
{
    // out (B,T,C), ids (B,T), wte (V,C), wpe (>=T,C) or NULL
    ARG_CHECK(B >= 0 && T >= 0 && C >= 0);
    size_t total = (size_t)B * T * C;
    return launch_grid(ctx, embedding_fwd_kernel, total, out, ids, wte, wpe, B, T, C);
}

mmp_err mmp_cuda_embedding_bwd(mmp_cuda_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                               const int32_t *ids, int B, int T, int C)
{
    // dwte (V,C), dwpe (>=T,C), dout (B,T,C), ids (B,T)
    ARG_CHECK(B >= 0 && T >= 0 && C >= 0);
    size_t total = (size_t)B * T * C;
    if (total == 0) {
        return MMP_OK;
    }
    if (dwte) {
        embedding_bwd_wte_kernel<<<grid_for((size_t)C, BLOCK), BLOCK, 0, ctx->stream>>>(
            dwte, dout, ids, B, T, C);
        LAUNCH_CHECK();
    }
    if (dwpe) {
        size_t tc = (size_t)T * C;
        embedding_bwd_wpe_kernel<<<grid_for(tc, BLOCK), BLOCK, 0, ctx->stream>>>(dwpe, dout, B, T,
                                                                                 C);
        LAUNCH_CHECK();
    }
    return MMP_OK;
}
