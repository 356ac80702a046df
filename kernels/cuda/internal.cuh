/* Private to the .cu files of kernels/cuda: the context's layout, the one status-check
 * macro, the workspace, launch-size helpers and the warp / block reductions
 * the kernels share. Nothing outside kernels/cuda includes this. */
#ifndef MMP_KERNELS_CUDA_INTERNAL_CUH
#define MMP_KERNELS_CUDA_INTERNAL_CUH

/* common/err.h is C11: its _Noreturn is spelled [[noreturn]] in C++. */
#if defined(__cplusplus) && !defined(_Noreturn)
#define _Noreturn [[noreturn]]
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/cuda.h" /* also brings common/err.h, with C linkage */

/* ---- status checks ------------------------------------------------------ */
/* One overload per library, so one macro checks any call. They return
 * MMP_OK or record "<file>:<line>: <call>: <reason>" as MMP_ERR_CUDA. */
mmp_err mmp_cuda_status(cudaError_t e, const char *call, const char *file, int line);
mmp_err mmp_cuda_status(cublasStatus_t e, const char *call, const char *file, int line);
mmp_err mmp_cuda_status(cudnnStatus_t e, const char *call, const char *file, int line);

/* Returns from the enclosing function on failure. */
#define CU_TRY(call) MMP_TRY(mmp_cuda_status((call), #call, __FILE__, __LINE__))
/* After a kernel launch: a bad configuration shows up here, not later. */
#define LAUNCH_CHECK() CU_TRY(cudaGetLastError())
/* A shape or argument the op cannot take: nothing was queued. */
#define ARG_CHECK(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            return mmp_errorf(MMP_ERR_INVALID, "%s: %s does not hold", __func__, #cond);           \
        }                                                                                          \
    } while (0)

/* Public functions are declared extern "C" in kernels/cuda.h; their
 * definitions in the .cu files inherit that linkage. Kernels and helpers are
 * static so that the files' names never collide. */

/* ---- the context -------------------------------------------------------- */
/* One convolution shape's cuDNN descriptors and chosen algorithms. */
typedef struct mmp_cuda_conv_plan {
    mmp_conv_shape shape;
    int tf32; /* TF32 tensor ops allowed (operands rounded to bf16/fp16 by the caller) */
    cudnnTensorDescriptor_t x, y, bias;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    /* the math each direction runs with, set on conv before its call (the
     * workspace sizes are asked with it set too) */
    cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
    size_t fwd_ws, bwd_data_ws, bwd_filter_ws; /* bytes */
} mmp_cuda_conv_plan;

/* A ResNet at one micro-batch size has a few dozen conv shapes. */
#define MMP_CUDA_CONV_PLANS 64

typedef struct mmp_cuda_chunk mmp_cuda_chunk;

struct mmp_cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cudnnHandle_t cudnn;
    /* Whether the device has stream-ordered memory pools: the workspaces
     * below then grow with cudaFreeAsync/cudaMallocAsync on the stream. */
    int pools;
    void *ws; /* workspace: grows, never shrinks */
    size_t ws_bytes;
    /* The 16-bit operands of bf16/fp16 GEMMs (gemm.cu), or the rounded fp32
     * operands of a bf16/fp16 cuDNN convolution (conv_lp.cu): grows, never
     * shrinks; apart from ws, which may hold one of a GEMM's fp32 inputs
     * (and holds cuDNN's workspace). */
    void *lp_ws;
    size_t lp_ws_bytes;
    /* cuBLAS's own workspace (cublasSetWorkspace), made once with the
     * context: no allocation in a GEMM call, and the one-stream, own-workspace
     * setting under which cuBLAS is bitwise reproducible. */
    void *blas_ws;
    size_t blas_ws_bytes;
    /* The per-stage device arena (mmp_cuda_arena_alloc): chunks carved in
     * order, given back only with the context. */
    mmp_cuda_chunk *chunks;
    cudaEvent_t upload_done; /* recorded after the last mmp_cuda_upload; NULL until one */
    size_t arena_bytes;      /* reserved in chunks */
    mmp_cuda_conv_plan conv[MMP_CUDA_CONV_PLANS];
    int n_conv;               /* plans in use */
    int conv_next;            /* the plan evicted next once all are in use */
    mmp_cuda_conv_lp conv_lp; /* how conv2d_*_lp computes (kernels/cuda.h) */
};

/* A workspace of at least bytes, valid until the next call that asks for
 * workspace, for work on the context's stream. Growing is ordered on that
 * stream (cudaFreeAsync, cudaMallocAsync): no cudaFree, whose device-wide
 * wait would also wait for NCCL kernels blocked on a peer that waits for
 * this stage (a deadlock across processes). Without memory pools it waits
 * for the stream, then cudaFree. */
mmp_err mmp_cuda_ws_get(mmp_cuda_ctx *ctx, size_t bytes, void **out);
/* The same for the lp workspace (gemm.cu's packed 16-bit operands). */
mmp_err mmp_cuda_lp_ws_get(mmp_cuda_ctx *ctx, size_t bytes, void **out);
/* Bytes rounded up so that carved sub-buffers stay 256-byte aligned. */
static inline size_t ws_align(size_t bytes)
{
    return (bytes + 255) & ~(size_t)255;
}

/* Destroys every cached conv plan (conv.cu). */
void mmp_cuda_conv_plans_clear(mmp_cuda_ctx *ctx);
/* conv2d through cuDNN with TF32 tensor ops allowed (conv.cu), for
 * operands the caller rounded to bf16/fp16 (exact in TF32): conv_lp.cu's
 * CUDNN path. As mmp_cuda_conv2d_fwd/_bwd otherwise. */
mmp_err mmp_cuda_conv2d_fwd_tf32(mmp_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                                 const float *b, const mmp_conv_shape *s);
mmp_err mmp_cuda_conv2d_bwd_tf32(mmp_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                                 const float *dout, const float *inp, const float *w,
                                 const mmp_conv_shape *s);

/* Row-major strided-batched GEMM on the context's stream (gemm.cu):
 * for i < batch: C_i (M,N) = alpha op(A_i) @ op(B_i) + beta C_i,
 * X_i = X + i * strideX. batch == 1 is a plain GEMM. prec 0: fp32 Sgemm;
 * 1 bf16, 2 fp16: A and B rounded to it, tensor cores, fp32 accumulation
 * and C (gemm.cu's top comment); uses the lp workspace. */
mmp_err mmp_cuda_gemm_batched(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N,
                              int K, float alpha, const float *A, int lda, long long stride_a,
                              const float *B, int ldb, long long stride_b, float beta, float *C,
                              int ldc, long long stride_c, int batch);

/* bf16/fp16 operands packed for the tensor cores (gemm.cu): 16-bit values,
 * rows of lp_ld(cols) elements (16 bytes), batches stride elements apart. */
typedef struct mmp_cuda_packed {
    const void *p;
    int ld;
    long long stride;
} mmp_cuda_packed;
static inline int lp_ld(int cols)
{
    return (cols + 7) / 8 * 8;
}
/* Bytes of batch packed (rows, cols) operands, 256-byte aligned. */
static inline size_t lp_packed_bytes(int rows, int cols, int batch)
{
    return ws_align((size_t)batch * rows * lp_ld(cols) * 2);
}
/* Packs src (batch at stride, rows at ld, cols) into dst (lp_packed_bytes
 * of rows, cols, batch), rounded to prec (1 bf16, 2 fp16) on the way;
 * padding columns 0 (gemm.cu). */
mmp_err mmp_cuda_pack_rows(mmp_cuda_ctx *ctx, int prec, void *dst, const float *src, int rows,
                           int cols, int ld, long long stride, int batch, mmp_cuda_packed *out);
/* Row-major C_i (M,N) = alpha op(A_i) op(B_i) + beta C_i on packed operands
 * (prec 1 bf16, 2 fp16), fp32 accumulation and C (gemm.cu). */
mmp_err mmp_cuda_gemm_packed(mmp_cuda_ctx *ctx, int prec, int trans_a, int trans_b, int M, int N,
                             int K, float alpha, mmp_cuda_packed A, mmp_cuda_packed B, float beta,
                             float *C, int ldc, long long stride_c, int batch);

/* ---- launch sizes ------------------------------------------------------- */
#define WARP 32
#define BLOCK 256                     /* threads per block unless a kernel says otherwise */
#define ROWS_PER_BLOCK (BLOCK / WARP) /* warp-per-row kernels */

/* Blocks for a grid-stride loop over n items: enough to fill the device,
 * never more than the items need. */
static inline unsigned grid_for(size_t n, int threads)
{
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    const size_t cap = 65536;
    return (unsigned)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

/* Launches a grid-stride kernel over n items (grid_for(n, BLOCK) blocks of
 * BLOCK threads) on ctx's stream and checks the launch; nothing for n == 0.
 * So the launcher of such a kernel is its shape checks and this one call. */
template <typename... Params, typename... Args>
static inline mmp_err launch_grid(mmp_cuda_ctx *ctx, void (*kernel)(Params...), size_t n,
                                  Args... args)
{
    if (n == 0) {
        return MMP_OK;
    }
    kernel<<<grid_for(n, BLOCK), BLOCK, 0, ctx->stream>>>(args...);
    LAUNCH_CHECK();
    return MMP_OK;
}

/* Warp-per-row kernels: ROWS_PER_BLOCK rows to a block of BLOCK threads.
 * warp_row() is the calling warp's row, or -1 past the end (the whole warp
 * then leaves together, so its shuffles stay full). */
static inline unsigned row_blocks(int rows)
{
    return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}
static __device__ inline int warp_row(int rows)
{
    const int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    return row < rows ? row : -1;
}

/* Grid-stride loops read
 *     for (size_t i = thread_index(); i < n; i += thread_count())
 * and visit [0, n) whatever the grid's size. */
static __device__ inline size_t thread_index()
{
    return blockIdx.x * (size_t)blockDim.x + threadIdx.x;
}
static __device__ inline size_t thread_count()
{
    return (size_t)gridDim.x * blockDim.x;
}

/* fp32 to 16-bit storage (prec 1 bf16, 2 fp16) and back, bit for bit as
 * kernels/cpu/precision.c (the spec): every kernel converts through these.
 * Numbers go through the hardware's round to nearest even (cvt.rn); NaN is
 * handled here, by its bits, because the PTX ISA leaves the NaN that
 * cvt.rn.f16.f32 / cvt.rn.bf16.f32 / cvt.f32.f16 give unspecified (and
 * __bfloat162float is a cvt.f32.bf16 on sm_90, a plain shift before): every
 * NaN narrows to 0x7fff (sign and payload dropped), an fp16 NaN widens to
 * 0x7fffffff, and bf16 widens by the 16-bit shift, NaN or not (as the CUDA
 * headers' own host code of these intrinsics does). */
static __device__ inline unsigned short lp_pack(float x, int prec)
{
    if ((__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u) {
        return 0x7fff;
    }
    return prec == 1 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                     : __half_as_ushort(__float2half_rn(x));
}
static __device__ inline float lp_unpack(unsigned short h, int prec)
{
    if (prec == 1) {
        return __uint_as_float((unsigned)h << 16);
    }
    if ((h & 0x7fffu) > 0x7c00u) {
        return __uint_as_float(0x7fffffffu);
    }
    return __half2float(__ushort_as_half(h));
}

/* x rounded to prec (0 fp32: unchanged, 1 bf16, 2 fp16) and widened back:
 * what a product reads from low-precision storage (kernels/cpu.h's
 * mmp_cpu_round_lp is the spec). */
static __device__ inline float lp_round(float x, int prec)
{
    return prec == 1 || prec == 2 ? lp_unpack(lp_pack(x, prec), prec) : x;
}

/* ---- reductions --------------------------------------------------------- */
struct sum_op {
    template <typename T> __device__ T operator()(T a, T b) const
    {
        return a + b;
    }
};
struct max_op {
    __device__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

/* Every lane gets the reduction of the warp's 32 values. */
template <typename T, typename Op> __device__ inline T warp_reduce(T v, Op op)
{
    for (int off = WARP / 2; off > 0; off /= 2) {
        v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    return v;
}

/* Every lane gets sum_i a[i] * b[i] over one row of n values, each lane
 * summing its stride-WARP share in T (float or double) before the warp
 * reduction: the one dot product of the warp-per-row kernels. */
template <typename T> __device__ inline T warp_dot(const float *a, const float *b, int n)
{
    T s = 0;
    for (int i = threadIdx.x % WARP; i < n; i += WARP) {
        s += (T)a[i] * b[i];
    }
    return warp_reduce(s, sum_op());
}

/* Every thread gets the reduction of the block's values, in a fixed order.
 * blockDim.x must be a multiple of 32; all threads must call it. */
template <typename T, typename Op> __device__ inline T block_reduce(T v, Op op)
{
    __shared__ T partial[32];
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int warps = blockDim.x / WARP;
    v = warp_reduce(v, op);
    __syncthreads(); /* an earlier call may still be reading partial */
    if (lane == 0) {
        partial[warp] = v;
    }
    __syncthreads();
    v = partial[0];
    for (int i = 1; i < warps; i++) {
        v = op(v, partial[i]);
    }
    return v;
}

/* One warp writes p (n) = softmax of x (n) over the entries with
 * valid[j] != 0 (all when valid is NULL); the rest get 0 and a row with none
 * valid is all 0, as the CPU's masked_softmax. p may alias x. */
__device__ inline void warp_softmax_row(float *p, const float *x, const float *valid, int n)
{
    const int lane = threadIdx.x % WARP;
    float maxv = -INFINITY;
    int any = 0;
    for (int j = lane; j < n; j += WARP) {
        if (!valid || valid[j] != 0.0f) {
            maxv = fmaxf(maxv, x[j]);
            any = 1;
        }
    }
    maxv = warp_reduce(maxv, max_op());
    if (!__any_sync(0xffffffffu, any)) {
        for (int j = lane; j < n; j += WARP) {
            p[j] = 0.0f;
        }
        return;
    }
    float sum = 0.0f;
    for (int j = lane; j < n; j += WARP) {
        if (!valid || valid[j] != 0.0f) {
            sum += expf(x[j] - maxv);
        }
    }
    const float inv = 1.0f / warp_reduce(sum, sum_op());
    for (int j = lane; j < n; j += WARP) {
        p[j] = (!valid || valid[j] != 0.0f) ? expf(x[j] - maxv) * inv : 0.0f;
    }
}

#endif
