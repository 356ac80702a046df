/* Losses: symmetric InfoNCE (CLIP's image-text contrastive loss) and binary
 * cross-entropy with logits. Loss values are summed in double in one block
 * (a fixed order) and come back to the host; gradients stay on the device.
 * The batch here is a micro-batch (tens to hundreds of rows), so the
 * single-block reductions are not a bottleneck. */
#include "kernels/cuda/internal.cuh"
#include "kernels/pointwise.h"

#define REDUCE_THREADS 1024

/* One warp per softmax: rows r < B are image r against every text (row r of
 * sim), rows B + t are text t against every image (column t of sim). Writes
 * the probabilities and the cross-entropy term -log p[target]. */
static __global__ void infonce_softmax_kernel(float *p_i2t, float *p_t2i, double *terms,
                                              const float *sim, float scale, int B)
{
    const int r = warp_row(2 * B);
    if (r < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP;
    const int target = r < B ? r : r - B;
    const float *s = r < B ? sim + (size_t)target * B : sim + target;
    const size_t stride = r < B ? 1 : (size_t)B;
    float *p = r < B ? p_i2t + (size_t)target * B : p_t2i + (size_t)target * B;
    float maxv = -INFINITY;
    for (int j = lane; j < B; j += WARP) {
        maxv = fmaxf(maxv, scale * s[j * stride]);
    }
    maxv = warp_reduce(maxv, max_op());
    float sum = 0.0f;
    for (int j = lane; j < B; j += WARP) {
        sum += expf(scale * s[j * stride] - maxv);
    }
    sum = warp_reduce(sum, sum_op());
    const float inv = 1.0f / sum;
    for (int j = lane; j < B; j += WARP) {
        p[j] = expf(scale * s[j * stride] - maxv) * inv;
    }
    if (lane == 0) {
        terms[r] = (double)maxv + log((double)sum) - (double)(scale * s[target * stride]);
    }
}

/* *loss = 0.5 * (sum of the 2B terms) / B. One block. */
static __global__ void infonce_loss_kernel(float *loss, const double *terms, int B)
{
    double sum = 0.0;
    for (int i = threadIdx.x; i < 2 * B; i += blockDim.x) {
        sum += terms[i];
    }
    sum = block_reduce(sum, sum_op());
    if (threadIdx.x == 0) {
        *loss = (float)(0.5 * sum / B);
    }
}

/* dsim (B,B) = exp(logit_scale) * d loss / d logits, and
 * dlogit_scale += sum over (i,t) of d loss / d logits * logits. One block. */
static __global__ void infonce_dsim_kernel(float *dsim, float *dlogit_scale, const float *sim,
                                           const float *p_i2t, const float *p_t2i, float scale,
                                           float g, int B)
{
    double dscale = 0.0;
    for (size_t idx = threadIdx.x; idx < (size_t)B * B; idx += blockDim.x) {
        const int i = (int)(idx / B), t = (int)(idx % B);
        const float target = i == t ? 1.0f : 0.0f;
        // d loss / d logits[i,t]: from the row CE and from the column CE
        const float dlogit = g * ((p_i2t[idx] - target) + (p_t2i[(size_t)t * B + i] - target));
        dscale += (double)dlogit * scale * sim[idx];
        dsim[idx] = dlogit * scale;
    }
    dscale = block_reduce(dscale, sum_op());
    if (threadIdx.x == 0 && dlogit_scale) {
        *dlogit_scale += (float)dscale;
    }
}

static __global__ void bce_loss_kernel(float *loss, const float *logits, const float *labels, int n)
{
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        double x = logits[i], y = labels[i];
        // log(1 + e^-|x|) form: never overflows
        sum += (x > 0.0 ? x : 0.0) - x * y + log1p(exp(-fabs(x)));
    }
    sum = block_reduce(sum, sum_op());
    if (threadIdx.x == 0) {
        *loss = n > 0 ? (float)(sum / n) : 0.0f;
    }
}

static __global__ void bce_bwd_kernel(float *dlogits, const float *logits, const float *labels,
                                      float dloss, int n)
{
    for (size_t i = thread_index(); i < (size_t)n; i += thread_count()) {
        dlogits[i] += dloss * (mmp_sigmoid(logits[i]) - labels[i]) / (float)n;
    }
}

mmp_err mmp_cuda_infonce_fwd(mmp_cuda_ctx *ctx, float *loss, float *sim, float *p_i2t, float *p_t2i,
                             const float *img, const float *txt, float logit_scale, int B, int C)
{
    // sim (B,B), p_i2t (B,B), p_t2i (B,B), img (B,C), txt (B,C); loss on the host
    ARG_CHECK(B > 0 && C > 0 && loss);
    MMP_TRY(mmp_cuda_gemm(ctx, 0, 1, B, B, C, 1.0f, img, C, txt, C, 0.0f, sim, B));
    void *ws;
    const size_t terms_bytes = ws_align(sizeof(double) * 2 * (size_t)B);
    MMP_TRY(mmp_cuda_ws_get(ctx, terms_bytes + sizeof(float), &ws));
    double *terms = (double *)ws;
    float *d_loss = (float *)((char *)ws + terms_bytes);
    const float scale = expf(logit_scale);
    infonce_softmax_kernel<<<row_blocks(2 * B), BLOCK, 0, ctx->stream>>>(p_i2t, p_t2i, terms, sim,
                                                                         scale, B);
    LAUNCH_CHECK();
    infonce_loss_kernel<<<1, REDUCE_THREADS, 0, ctx->stream>>>(d_loss, terms, B);
    LAUNCH_CHECK();
    return mmp_cuda_memcpy_d2h(ctx, loss, d_loss, sizeof(float));
}

mmp_err mmp_cuda_infonce_bwd(mmp_cuda_ctx *ctx, float *dimg, float *dtxt, float *dlogit_scale,
                             const float *sim, const float *p_i2t, const float *p_t2i,
                             const float *img, const float *txt, float logit_scale, float dloss,
                             int B, int C)
{
    // dimg (B,C), dtxt (B,C), dlogit_scale (1), sim (B,B), p_i2t (B,B), p_t2i (B,B),
    // img (B,C), txt (B,C)
    ARG_CHECK(B > 0 && C > 0);
    if (!dimg && !dtxt && !dlogit_scale) {
        return MMP_OK;
    }
    void *ws;
    MMP_TRY(mmp_cuda_ws_get(ctx, sizeof(float) * (size_t)B * B, &ws));
    float *dsim = (float *)ws;
    const float scale = expf(logit_scale);
    const float g = dloss * 0.5f / (float)B;
    infonce_dsim_kernel<<<1, REDUCE_THREADS, 0, ctx->stream>>>(dsim, dlogit_scale, sim, p_i2t,
                                                               p_t2i, scale, g, B);
    LAUNCH_CHECK();
    if (dimg) {
        // dimg (B,C) += dsim (B,B) @ txt (B,C)
        MMP_TRY(mmp_cuda_gemm(ctx, 0, 0, B, C, B, 1.0f, dsim, B, txt, C, 1.0f, dimg, C));
    }
    if (dtxt) {
        // dtxt (B,C) += dsim^T (B,B) @ img (B,C)
        MMP_TRY(mmp_cuda_gemm(ctx, 1, 0, B, C, B, 1.0f, dsim, B, img, C, 1.0f, dtxt, C));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_bce_fwd(mmp_cuda_ctx *ctx, float *loss, const float *logits, const float *labels,
                         int n)
{
    // logits (n), labels (n); loss on the host
    ARG_CHECK(n >= 0 && loss);
    if (n == 0) {
        *loss = 0.0f;
        return MMP_OK;
    }
    void *ws;
    MMP_TRY(mmp_cuda_ws_get(ctx, sizeof(float), &ws));
    bce_loss_kernel<<<1, REDUCE_THREADS, 0, ctx->stream>>>((float *)ws, logits, labels, n);
    LAUNCH_CHECK();
    return mmp_cuda_memcpy_d2h(ctx, loss, ws, sizeof(float));
}

mmp_err mmp_cuda_bce_bwd(mmp_cuda_ctx *ctx, float *dlogits, const float *logits,
                         const float *labels, float dloss, int n)
{
    // dlogits (n), logits (n), labels (n)
    ARG_CHECK(n >= 0);
    if (n == 0) {
        return MMP_OK;
    }
    bce_bwd_kernel<<<grid_for((size_t)n, BLOCK), BLOCK, 0, ctx->stream>>>(dlogits, logits, labels,
                                                                          dloss, n);
    LAUNCH_CHECK();
    return MMP_OK;
}
