/* The CUDA context (device, stream, cuBLAS and cuDNN handles, workspace),
 * device memory helpers and the status checks every launcher uses.
 *
 * Must never be the place a process dies: a missing driver or device is a
 * count of 0 or an error value, never an abort. */
#include "kernels/cuda/internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mmp_err mmp_cuda_status(cudaError_t e, const char *call, const char *file, int line)
{
    if (e == cudaSuccess) {
        return MMP_OK;
    }
    return mmp_errorf(MMP_ERR_CUDA, "%s:%d: %s: %s", file, line, call, cudaGetErrorString(e));
}

mmp_err mmp_cuda_status(cublasStatus_t e, const char *call, const char *file, int line)
{
    if (e == CUBLAS_STATUS_SUCCESS) {
        return MMP_OK;
    }
    return mmp_errorf(MMP_ERR_CUDA, "%s:%d: %s: %s", file, line, call, cublasGetStatusString(e));
}

mmp_err mmp_cuda_status(cudnnStatus_t e, const char *call, const char *file, int line)
{
    if (e == CUDNN_STATUS_SUCCESS) {
        return MMP_OK;
    }
    return mmp_errorf(MMP_ERR_CUDA, "%s:%d: %s: %s", file, line, call, cudnnGetErrorString(e));
}

int mmp_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: not an error for the caller */
        return 0;
    }
    return n;
}

struct mmp_cuda_chunk {
    struct mmp_cuda_chunk *next;
    char *base;
    size_t size, used;
};

mmp_err mmp_cuda_device_info(int d, char *name, size_t name_size, size_t *total_bytes)
{
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, d));
    snprintf(name, name_size, "%s", prop.name);
    *total_bytes = prop.totalGlobalMem;
    return MMP_OK;
}

/* A workspace given back: after the work queued on stream (pools), or at
 * once (the caller has waited for the stream). */
static void ws_free(cudaStream_t stream, int pools, void *buf)
{
    if (buf) {
        (void)(pools ? cudaFreeAsync(buf, stream) : cudaFree(buf));
    }
}

/* Fills a zeroed ctx; on failure what was made is left for destroy. */
static mmp_err ctx_init(mmp_cuda_ctx *ctx, int device)
{
    ctx->device = device;
    /* how bf16/fp16 convolutions compute (kernels/cuda.h) */
    const char *conv_lp = getenv("MMP_CUDA_CONV_LP");
    if (!conv_lp || !conv_lp[0] || strcmp(conv_lp, "cudnn") == 0) {
        ctx->conv_lp = MMP_CUDA_CONV_LP_CUDNN;
    } else if (strcmp(conv_lp, "im2col") == 0) {
        ctx->conv_lp = MMP_CUDA_CONV_LP_IM2COL;
    } else {
        return mmp_errorf(MMP_ERR_INVALID,
                          "MMP_CUDA_CONV_LP=%.40s: the bf16/fp16 convolutions are 'cudnn' (the "
                          "default) or 'im2col'",
                          conv_lp);
    }
    /* A device this process cannot see gets an error that says so, not the
     * runtime's "driver version is insufficient" (what no driver reads as). */
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || device >= count) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        (void)cudaGetLastError(); /* the runtime's last error, cleared */
        return mmp_errorf(MMP_ERR_CUDA,
                          "cuda:%d: %d CUDA devices are visible to this process%s%s%s (%s; "
                          "`mmpipe devices` lists what this build sees)",
                          device, ce == cudaSuccess ? count : 0,
                          cvd ? " (CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "", cvd ? ")" : "",
                          ce == cudaSuccess ? "devices are numbered from 0"
                                            : cudaGetErrorString(ce));
    }
    CU_TRY(cudaSetDevice(device));
    /* A blocking stream: code that still uses the legacy default stream
     * (a plain cudaMemcpy) stays ordered with the kernels queued here. */
    CU_TRY(cudaStreamCreate(&ctx->stream));
    CU_TRY(cublasCreate(&ctx->cublas));
    CU_TRY(cublasSetStream(ctx->cublas, ctx->stream));
    /* Default math is fp32 compute without TF32 (that takes
     * CUBLAS_TF32_TENSOR_OP_MATH), so GEMMs match the CPU's fp32. */
    CU_TRY(cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH));
    /* cuBLAS's workspace, ours and made once (after cublasSetStream, which
     * resets it): the size NVIDIA recommends (32 MiB on Hopper and later,
     * 4 MiB before), never an allocation inside a GEMM, and the setting
     * under which cuBLAS results are bitwise reproducible run to run. */
    int major = 0;
    CU_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    const size_t blas_ws = (size_t)(major >= 9 ? 32 : 4) << 20;
    CU_TRY(cudaMalloc(&ctx->blas_ws, blas_ws));
    ctx->blas_ws_bytes = blas_ws;
    CU_TRY(cublasSetWorkspace(ctx->cublas, ctx->blas_ws, blas_ws));
    CU_TRY(cudnnCreate(&ctx->cudnn));
    CU_TRY(cudnnSetStream(ctx->cudnn, ctx->stream));
    /* Stream-ordered workspaces where the device has memory pools and they
     * work here (a probe: under MPS, too); else the synchronous fallback. */
    int pools = 0;
    void *probe = NULL;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess &&
        pools && cudaMallocAsync(&probe, 256, ctx->stream) == cudaSuccess) {
        pools = cudaFreeAsync(probe, ctx->stream) == cudaSuccess &&
                cudaStreamSynchronize(ctx->stream) == cudaSuccess;
    } else {
        pools = 0;
    }
    (void)cudaGetLastError(); /* a failed probe is no error of the context's */
    ctx->pools = pools;
    return MMP_OK;
}

mmp_err mmp_cuda_ctx_create(mmp_cuda_ctx **out, int device)
{
    *out = NULL;
    mmp_cuda_ctx *ctx = (mmp_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) {
        return mmp_errorf(MMP_ERR_NOMEM, "mmp_cuda_ctx_create: %zu bytes", sizeof *ctx);
    }
    mmp_err ret = ctx_init(ctx, device);
    if (ret != MMP_OK) {
        mmp_cuda_ctx_destroy(ctx);
        return mmp_error_prefix(ret, "CUDA context on device %d", device);
    }
    *out = ctx;
    return MMP_OK;
}

void mmp_cuda_ctx_destroy(mmp_cuda_ctx *ctx)
{
    if (!ctx) {
        return;
    }
    if (ctx->stream) {
        (void)cudaStreamSynchronize(ctx->stream);
    }
    mmp_cuda_conv_plans_clear(ctx);
    if (ctx->cudnn) {
        cudnnDestroy(ctx->cudnn);
    }
    if (ctx->cublas) {
        cublasDestroy(ctx->cublas);
    }
    ws_free(ctx->stream, ctx->pools, ctx->ws);
    ws_free(ctx->stream, ctx->pools, ctx->lp_ws);
    if (ctx->stream && ctx->pools) {
        (void)cudaStreamSynchronize(ctx->stream); /* the frees above are stream-ordered */
    }
    if (ctx->blas_ws) {
        (void)cudaFree(ctx->blas_ws);
    }
    if (ctx->upload_done) {
        (void)cudaEventDestroy(ctx->upload_done);
    }
    for (mmp_cuda_chunk *c = ctx->chunks, *next; c; c = next) {
        next = c->next;
        (void)cudaFree(c->base);
        free(c);
    }
    if (ctx->stream) {
        (void)cudaStreamDestroy(ctx->stream);
    }
    free(ctx);
}

int mmp_cuda_ctx_device(const mmp_cuda_ctx *ctx)
{
    return ctx->device;
}

void *mmp_cuda_ctx_stream(const mmp_cuda_ctx *ctx)
{
    return (void *)ctx->stream;
}

/* *buf (*have bytes) grown to at least bytes. */
static mmp_err ws_grow(cudaStream_t stream, int pools, void **buf, size_t *have, size_t bytes,
                       const char *what)
{
    if (bytes > *have) {
        /* Grow by half again so that a slowly growing shape does not
         * reallocate every call. Rare: a new, larger shape. Work queued on
         * the stream may still read the old workspace: with pools the free
         * and the new allocation are ordered on the stream behind it and
         * nothing waits (a cudaFree would wait for the whole device, NCCL's
         * kernels included, which may be waiting for a peer that waits for
         * this process); without, wait for the stream, then cudaFree. */
        size_t want = bytes + bytes / 2;
        if (!pools) {
            CU_TRY(cudaStreamSynchronize(stream));
        }
        ws_free(stream, pools, *buf);
        *buf = NULL;
        *have = 0;
        cudaError_t e = pools ? cudaMallocAsync(buf, want, stream) : cudaMalloc(buf, want);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            *buf = NULL;
            return mmp_errorf(MMP_ERR_NOMEM, "cudaMalloc(%zu bytes) for the CUDA %s", want, what);
        }
        *have = want;
    }
    return MMP_OK;
}

mmp_err mmp_cuda_ws_get(mmp_cuda_ctx *ctx, size_t bytes, void **out)
{
    MMP_TRY(ws_grow(ctx->stream, ctx->pools, &ctx->ws, &ctx->ws_bytes, bytes, "workspace"));
    *out = ctx->ws;
    return MMP_OK;
}

mmp_err mmp_cuda_lp_ws_get(mmp_cuda_ctx *ctx, size_t bytes, void **out)
{
    MMP_TRY(ws_grow(ctx->stream, ctx->pools, &ctx->lp_ws, &ctx->lp_ws_bytes, bytes,
                    "bf16/fp16 GEMM operands"));
    *out = ctx->lp_ws;
    return MMP_OK;
}

mmp_err mmp_cuda_arena_alloc(mmp_cuda_ctx *ctx, void **out, size_t bytes)
{
    *out = NULL;
    size_t want = ws_align(bytes ? bytes : 1);
    mmp_cuda_chunk *c = ctx->chunks; /* the newest chunk is carved first */
    if (!c || c->size - c->used < want) {
        size_t size = want > MMP_CUDA_ARENA_CHUNK ? want : MMP_CUDA_ARENA_CHUNK;
        c = (mmp_cuda_chunk *)calloc(1, sizeof *c);
        if (!c) {
            return mmp_errorf(MMP_ERR_NOMEM, "device arena: chunk record");
        }
        mmp_err e = mmp_cuda_malloc((void **)&c->base, size);
        if (e != MMP_OK) {
            free(c);
            return mmp_error_prefix(e, "device arena on device %d (%zu bytes held)", ctx->device,
                                    ctx->arena_bytes);
        }
        c->size = size;
        c->next = ctx->chunks;
        ctx->chunks = c;
        ctx->arena_bytes += size;
    }
    *out = c->base + c->used;
    c->used += want;
    return MMP_OK;
}

size_t mmp_cuda_ctx_device_bytes(const mmp_cuda_ctx *ctx)
{
    return ctx->arena_bytes + ctx->ws_bytes + ctx->lp_ws_bytes + ctx->blas_ws_bytes;
}

mmp_err mmp_cuda_upload(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) {
        return MMP_OK;
    }
    if (!ctx->upload_done) {
        CU_TRY(cudaEventCreateWithFlags(&ctx->upload_done, cudaEventDisableTiming));
    }
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CU_TRY(cudaEventRecord(ctx->upload_done, ctx->stream));
    return MMP_OK;
}

mmp_err mmp_cuda_upload_wait(mmp_cuda_ctx *ctx)
{
    if (ctx->upload_done) {
        CU_TRY(cudaEventSynchronize(ctx->upload_done));
    }
    return MMP_OK;
}

void *mmp_cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

void mmp_cuda_host_free(void *p)
{
    if (p) {
        (void)cudaFreeHost(p);
    }
}

mmp_err mmp_cuda_malloc(void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) {
        return MMP_OK;
    }
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return mmp_errorf(e == cudaErrorMemoryAllocation ? MMP_ERR_NOMEM : MMP_ERR_CUDA,
                          "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_free(void *p)
{
    if (!p) {
        return MMP_OK;
    }
    CU_TRY(cudaFree(p));
    return MMP_OK;
}

/* One copy on ctx's stream; sync: wait until it is done (a host buffer
 * is then free to reuse, a host result there to read). */
static mmp_err stream_copy(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes,
                           cudaMemcpyKind kind, int sync)
{
    if (bytes == 0) {
        return MMP_OK;
    }
    CU_TRY(cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream));
    if (sync) {
        CU_TRY(cudaStreamSynchronize(ctx->stream));
    }
    return MMP_OK;
}

mmp_err mmp_cuda_memcpy_h2d(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return stream_copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice, 1);
}

mmp_err mmp_cuda_memcpy_d2h(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return stream_copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost, 1);
}

mmp_err mmp_cuda_memcpy_d2d(mmp_cuda_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    return stream_copy(ctx, dst, src, bytes, cudaMemcpyDeviceToDevice, 0);
}

mmp_err mmp_cuda_memset(mmp_cuda_ctx *ctx, void *dst, int value, size_t bytes)
{
    if (bytes == 0) {
        return MMP_OK;
    }
    CU_TRY(cudaMemsetAsync(dst, value, bytes, ctx->stream));
    return MMP_OK;
}

mmp_err mmp_cuda_sync(mmp_cuda_ctx *ctx)
{
    CU_TRY(cudaStreamSynchronize(ctx->stream));
    return MMP_OK;
}
