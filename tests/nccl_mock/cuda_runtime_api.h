/* A stand-in for the CUDA runtime header, for tests/nccl_mock only: "device"
 * memory is host memory, every stream runs its work at once (so stream order
 * is call order), events are always complete. Just the calls
 * transport/cuda/nccl.c and reduce_nccl.c make. Not a model of a GPU: it
 * lets their own logic (rendezvous, side channel, slots, sizes, credits,
 * chunking, errors) run on a machine without one. */
#ifndef MMP_NCCL_MOCK_CUDA_RUNTIME_API_H
#define MMP_NCCL_MOCK_CUDA_RUNTIME_API_H
#include <stddef.h>

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorNotReady = 600,
    cudaErrorMemoryAllocation = 2
} cudaError_t;
typedef struct mock_stream *cudaStream_t;
typedef struct mock_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyDefault = 4 };
enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
};
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u

cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                            cudaStream_t s);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
#endif
