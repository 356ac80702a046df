/* The CUDA emulator's one header (tests/cuda_emu): what the .cu files of
 * kernels/cuda (as C++) and transport/cuda/cuda_ipc.c (as C) take from cuda_runtime.h, cuda_bf16.h,
 * cuda_fp16.h, cublas_v2.h and cudnn.h, for a host C++ compiler, so that the CUDA backend's own
 * code (its kernels, launchers, index math, workspaces, cuBLAS and cuDNN calls) runs on a machine
 * without a GPU and the gpu_* tests can judge it there.
 *
 * What it is:
 *  - Kernels run on the CPU, one block after another, the last first (a
 *    block that reads what a lower one writes, unordered, sees it
 *    unwritten). Each thread of a block is a fiber of one OS thread; the
 *    lowest runnable thread runs until it reaches __syncthreads, a warp
 *    operation or its end, so a thread and its warp run as far ahead of
 *    the others as the barriers let them: a missing barrier shows. Blocks
 *    alternate between lowest-first and highest-first, so a read of
 *    another thread's write without a barrier between shows either way.
 *  - Found and reported (the process stops, naming the kernel, block and
 *    thread): a deadlock (a barrier some threads never reach), a warp
 *    operation whose mask names a lane that exited or does not exist, or
 *    that its lanes call with different masks, a shuffle reading a lane
 *    outside the mask. A launch configuration the hardware refuses (block
 *    over 1024 threads, grid.y over 65535, an empty grid) is the
 *    cudaErrorInvalidConfiguration it is on a GPU, and the kernel does not
 *    run.
 *  - Device memory is host memory, filled with 0xff bytes (NaN) when
 *    allocated, so a kernel reading what nothing wrote gives NaN; every
 *    copy's kind is checked against where its pointers are (a host pointer
 *    given as device memory, or a copy past an allocation's end, is
 *    cudaErrorInvalidValue), as is every pointer freed. Under
 *    AddressSanitizer (the sanitizer pass) a kernel's access past an
 *    allocation is reported where it happens.
 *  - cuBLAS GEMMs are plain loops in column-major order with cuBLAS's
 *    argument checks (leading dimensions, types), TF32 when the math mode
 *    allows it; a batched GEMM's pointers must lie in device memory and, for
 *    16-bit operands, on 16 bytes.
 *  - cuDNN's convolutions are plain loops, with its descriptor and
 *    workspace checks; its heuristics rank a non-deterministic, an FFT or
 *    Winograd and a down-converting algorithm first, so a caller that does
 *    not filter them runs them (a non-deterministic or Winograd/FFT
 *    algorithm computes with a different rounding here, a down-converting
 *    one in fp16), and TF32 math rounds the operands to TF32.
 *  - Streams run their work at once, in call order; events are complete.
 *  - Interprocess memory is real sharing: every allocation is a memfd's
 *    pages, and a handle names the exporter's pid and fd, which the
 *    importer maps (cuda_ipc's slots); stream memory operations write and
 *    read those pages. NCCL is not here.
 *  - Host waits (what would block the host thread on a GPU: stream, event
 *    and device synchronisation, cudaFree, blocking copies and copies
 *    through pageable host memory) are counted; MMP_EMU_HOST_WAITS=FILE
 *    gets one line per process at exit (tests/cli_cuda_emu.sh).
 * What it is not: a GPU. Rounding of expf and friends, the memory model,
 * atomics across blocks, timing, MPS and NCCL are not modelled; a pass here
 * says the code computes what it means to, not that a GPU will run it. */
#ifndef MMP_CUDA_EMU_H
#define MMP_CUDA_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The libraries' C interface: C linkage, C syntax. */
#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime types -------------------------------------------------------- */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
} cudaError_t;
typedef struct mmp_emu_stream *cudaStream_t;
typedef struct mmp_emu_event *cudaEvent_t;
typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;
typedef enum cudaDeviceAttr {
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrMemoryPoolsSupported = 115,
} cudaDeviceAttr;
typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
} cudaDeviceProp;
#define cudaHostAllocDefault 0u
#define cudaEventDisableTiming 2u
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFree(void *p);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);

/* ---- interprocess memory and events, driver entry points (cuda_ipc) --------
 * A memory handle names the exporter's allocation by its pid and the memfd
 * behind it (/proc/PID/fd/FD): the importer maps the same pages. Events
 * need no sharing: every stream's work is done when its call returns, so an
 * event is complete when recorded and a wait on one has nothing to wait for. */
typedef struct cudaIpcMemHandle_st {
    char reserved[64];
} cudaIpcMemHandle_t;
typedef struct cudaIpcEventHandle_st {
    char reserved[64];
} cudaIpcEventHandle_t;
#define cudaEventInterprocess 4u
#define cudaIpcMemLazyEnablePeerAccess 1u
#define cudaEnableDefault 0ull
typedef enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2,
} cudaDriverEntryPointQueryResult;
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e);
cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaDeviceSynchronize(void);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **f, unsigned version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult *status);
/* the driver's types the entry points above take (<cuda.h>) */
typedef enum cudaError_enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 } CUresult;
typedef struct mmp_emu_stream *CUstream;
typedef unsigned long long CUdeviceptr;
typedef uint32_t cuuint32_t;
#define CU_STREAM_WAIT_VALUE_GEQ 0u
#define CU_STREAM_WRITE_VALUE_DEFAULT 0u

/* ---- cuBLAS ---------------------------------------------------------------- */
typedef struct mmp_emu_cublas *cublasHandle_t;
typedef enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum cublasOperation_t {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2
} cublasOperation_t;
typedef enum cublasMath_t {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;
typedef enum cublasComputeType_t {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta,
                                         float *C, int ldc, long long sc, int batch);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sa, const void *B, cudaDataType bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, long long sc, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *alpha, const void *const A[],
                                   cudaDataType at, int lda, const void *const B[], cudaDataType bt,
                                   int ldb, const void *beta, void *const C[], cudaDataType ct,
                                   int ldc, int batch, cublasComputeType_t compute,
                                   cublasGemmAlgo_t algo);

/* ---- cuDNN ----------------------------------------------------------------- */
typedef struct mmp_emu_cudnn *cudnnHandle_t;
typedef struct mmp_emu_tensor *cudnnTensorDescriptor_t;
typedef struct mmp_emu_filter *cudnnFilterDescriptor_t;
typedef struct mmp_emu_conv *cudnnConvolutionDescriptor_t;
typedef enum cudnnStatus_t {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_NOT_SUPPORTED = 3000,
} cudnnStatus_t;
typedef enum cudnnTensorFormat_t {
    CUDNN_TENSOR_NCHW = 0,
    CUDNN_TENSOR_NHWC = 1
} cudnnTensorFormat_t;
typedef enum cudnnDataType_t {
    CUDNN_DATA_FLOAT = 0,
    CUDNN_DATA_DOUBLE = 1,
    CUDNN_DATA_HALF = 2
} cudnnDataType_t;
typedef enum cudnnConvolutionMode_t {
    CUDNN_CONVOLUTION = 0,
    CUDNN_CROSS_CORRELATION = 1
} cudnnConvolutionMode_t;
typedef enum cudnnMathType_t {
    CUDNN_DEFAULT_MATH = 0,
    CUDNN_TENSOR_OP_MATH = 1,
    CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
    CUDNN_FMA_MATH = 3,
} cudnnMathType_t;
typedef enum cudnnDeterminism_t {
    CUDNN_NON_DETERMINISTIC = 0,
    CUDNN_DETERMINISTIC = 1
} cudnnDeterminism_t;
typedef enum cudnnConvolutionFwdAlgo_t {
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM = 0,
    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
    CUDNN_CONVOLUTION_FWD_ALGO_GEMM = 2,
    CUDNN_CONVOLUTION_FWD_ALGO_DIRECT = 3,
    CUDNN_CONVOLUTION_FWD_ALGO_FFT = 4,
    CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING = 5,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD = 6,
    CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED = 7,
    CUDNN_CONVOLUTION_FWD_ALGO_COUNT = 8,
} cudnnConvolutionFwdAlgo_t;
typedef enum cudnnConvolutionBwdDataAlgo_t {
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 = 0,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 = 1,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT = 2,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING = 3,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD = 4,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED = 5,
    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT = 6,
} cudnnConvolutionBwdDataAlgo_t;
typedef enum cudnnConvolutionBwdFilterAlgo_t {
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 = 0,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 = 1,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT = 2,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 = 3,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD = 4,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED = 5,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING = 6,
    CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT = 7,
} cudnnConvolutionBwdFilterAlgo_t;
/* What a heuristic says of one algorithm (the same fields for each
 * direction). */
#define MMP_EMU_PERF(Algo, Name)                                                                   \
    typedef struct Name {                                                                          \
        Algo algo;                                                                                 \
        cudnnStatus_t status;                                                                      \
        float time;                                                                                \
        size_t memory;                                                                             \
        cudnnDeterminism_t determinism;                                                            \
        cudnnMathType_t mathType;                                                                  \
        int reserved[3];                                                                           \
    } Name
MMP_EMU_PERF(cudnnConvolutionFwdAlgo_t, cudnnConvolutionFwdAlgoPerf_t);
MMP_EMU_PERF(cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdDataAlgoPerf_t);
MMP_EMU_PERF(cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionBwdFilterAlgoPerf_t);

cudnnStatus_t cudnnCreate(cudnnHandle_t *h);
cudnnStatus_t cudnnDestroy(cudnnHandle_t h);
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s);
const char *cudnnGetErrorString(cudnnStatus_t s);
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w);
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w);
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode, cudnnDataType_t t);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t d,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *c,
                                                    int *h, int *wd);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t conv,
                                                     cudnnTensorDescriptor_t y, int want, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf);
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, int want, int *got,
    cudnnConvolutionBwdDataAlgoPerf_t *perf);
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw, int want, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t conv,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *bytes);
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t dx, cudnnConvolutionBwdDataAlgo_t a,
    size_t *bytes);
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t conv, cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t a, size_t *bytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t conv,
                                      cudnnConvolutionFwdAlgo_t a, void *ws, size_t ws_bytes,
                                      const void *beta, cudnnTensorDescriptor_t yd, void *y);
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t conv,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx);
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw);
cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t h, const void *alpha,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           const void *beta, cudnnTensorDescriptor_t dbd, void *db);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *A, const void *beta, cudnnTensorDescriptor_t cd, void *C);

#ifdef __cplusplus
} /* extern "C" */

/* ---- what only the C++ of the kernels sees ---------------------------------- */
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    return cudaMalloc((void **)p, bytes);
}

/* ---- qualifiers ---------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
/* A block's shared arrays: one copy, as blocks run one at a time.
 * rewrite.pl follows each declaration with mmp_emu::shared_poison, which
 * fills the array with 0xff the first time a block reaches it (a read of
 * shared memory nothing wrote gives NaN). */
#define __shared__ static

/* ---- built-in variables --------------------------------------------------- */
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
/* Set by the launcher before it switches to a thread. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

/* ---- device functions ----------------------------------------------------- */
void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
int __any_sync(unsigned mask, int pred);

namespace mmp_emu
{
/* Lane `lane`'s value of the calling warp's exchange: every lane of mask
 * puts `bytes` of v, waits for the others, reads lane src's (src_of(lane)). */
void warp_exchange(unsigned mask, const void *v, void *out, size_t bytes, int src);
int lane_id(void);
/* Fills the shared array at p with 0xff, once per block. */
void shared_poison(void *p, size_t bytes);
} // namespace mmp_emu

template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) <= 8, "the emulator's shuffles move at most 8 bytes");
    const int lane = mmp_emu::lane_id();
    int src = lane ^ lane_mask;
    if (src / width != lane / width) {
        src = lane; /* past the segment: the lane's own value, as on a GPU */
    }
    T out;
    mmp_emu::warp_exchange(mask, &v, &out, sizeof v, src);
    return out;
}

/* CUDA's integer min and max, device functions there. */
inline int min(int a, int b)
{
    return a < b ? a : b;
}
inline int max(int a, int b)
{
    return a > b ? a : b;
}
inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
inline long long min(long long a, long long b)
{
    return a < b ? a : b;
}
inline long long max(long long a, long long b)
{
    return a > b ? a : b;
}

inline unsigned __float_as_uint(float x)
{
    unsigned u;
    memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
/* Plain IEEE single operations (the build turns contraction into FMA off). */
inline float __fmul_rn(float a, float b)
{
    return a * b;
}
inline float __fadd_rn(float a, float b)
{
    return a + b;
}

/* 16-bit storage types: GCC's _Float16 rounds to nearest even as cvt.rn
 * does; bf16 is rounded by its bits (NaN never reaches these: lp_pack
 * handles it first). */
struct __half {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short x;
};
inline __half __float2half_rn(float f)
{
    _Float16 h = (_Float16)f;
    __half r;
    memcpy(&r.x, &h, sizeof r.x);
    return r;
}
inline float __half2float(__half h)
{
    _Float16 v;
    memcpy(&v, &h.x, sizeof v);
    return (float)v;
}
inline unsigned short __half_as_ushort(__half h)
{
    return h.x;
}
inline __half __ushort_as_half(unsigned short u)
{
    return __half{u};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    const unsigned u = __float_as_uint(f);
    return __nv_bfloat16{(unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 b)
{
    return __uint_as_float((unsigned)b.x << 16);
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b)
{
    return b.x;
}

/* ---- kernel launches ------------------------------------------------------ *
 * tests/cuda_emu/rewrite.pl turns `k<<<grid, block, smem, stream>>>(args)`
 * into `mmp_emu::launch("k", mmp_emu::config(grid, block, smem, stream),
 * [&](auto... a) { k(a...); })(args)`: the launcher runs the lambda on
 * every thread of the grid. */
namespace mmp_emu
{
struct config {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    config(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = nullptr)
        : grid(g), block(b), smem(s), stream(st)
    {
    }
};
/* Runs body(arg) on every thread of c's grid, or records the launch error. */
void run_grid(const char *kernel, const config &c, void (*body)(void *), void *arg);

template <typename F> struct launcher {
    const char *name;
    config c;
    F f;
    template <typename... A> void operator()(A... a)
    {
        auto body = [&]() { f(a...); };
        run_grid(
            name, c, [](void *p) { (*(decltype(body) *)p)(); }, &body);
    }
};
template <typename F> launcher<F> launch(const char *name, config c, F f)
{
    return launcher<F>{name, c, f};
}
} // namespace mmp_emu

#endif /* __cplusplus */

#endif
