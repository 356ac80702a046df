/* Low-precision storage on the device: rounding fp32 to bf16/fp16 and back,
 * packing to 2-byte storage and widening it again, through lp_pack /
 * lp_unpack (internal.cuh): the hardware's round to nearest even, NaN by
 * its bits, kernels/cpu/precision.c bit for bit. prec 0 (fp32) is a copy,
 * never a rounding. */
#include "kernels/cuda/internal.cuh"

static __global__ void round_lp_kernel(float *dst, const float *src, size_t n, int prec)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        dst[i] = lp_round(src[i], prec);
    }
}

static __global__ void pack_lp_kernel(unsigned short *dst, const float *src, size_t n, int prec)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        dst[i] = lp_pack(src[i], prec);
    }
}

static __global__ void unpack_lp_kernel(float *dst, const unsigned short *src, size_t n, int prec)
{
    for (size_t i = thread_index(); i < n; i += thread_count()) {
        dst[i] = lp_unpack(src[i], prec);
    }
}

mmp_err mmp_cuda_round_lp(mmp_cuda_ctx *ctx, float *dst, const float *src, size_t n, int prec)
{
    // dst (n), src (n); dst may equal src
    ARG_CHECK(prec >= 0 && prec <= 2);
    if (n == 0 || (prec == 0 && dst == src)) {
        return MMP_OK;
    }
    if (prec == 0) {
        CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx->stream));
        return MMP_OK;
    }
    round_lp_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(dst, src, n, prec);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_pack_lp(mmp_cuda_ctx *ctx, void *dst, const float *src, size_t n, int prec)
{
    // dst (n) of 2 bytes (4 for fp32), src (n)
    ARG_CHECK(prec >= 0 && prec <= 2);
    if (n == 0 || (prec == 0 && dst == (const void *)src)) {
        return MMP_OK;
    }
    if (prec == 0) {
        CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx->stream));
        return MMP_OK;
    }
    pack_lp_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>((unsigned short *)dst, src, n,
                                                                  prec);
    LAUNCH_CHECK();
    return MMP_OK;
}

mmp_err mmp_cuda_unpack_lp(mmp_cuda_ctx *ctx, float *dst, const void *src, size_t n, int prec)
{
    // dst (n), src (n) of 2 bytes (4 for fp32)
    ARG_CHECK(prec >= 0 && prec <= 2);
    if (n == 0 || (prec == 0 && (const void *)dst == src)) {
        return MMP_OK;
    }
    if (prec == 0) {
        CU_TRY(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, ctx->stream));
        return MMP_OK;
    }
    unpack_lp_kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(
        dst, (const unsigned short *)src, n, prec);
    LAUNCH_CHECK();
    return MMP_OK;
}
