/* The NCCL replica reduce's device sum (transport/reduce_nccl.h): after the
 * all-gather, every element is the rank-order sum of transport/rank_sum.h,
 * written over the caller's vector. One thread an element (grid-stride), no
 * shared memory, no atomics: each output has one writer and one fixed
 * order, so every rank computes the same bits, and the bits of the host
 * reduce (shm, tcp). */
#include <cuda_runtime.h>

#include "transport/rank_sum.h"

static __global__ void rank_sum_kernel(double *out, const double *g, size_t n, size_t stride,
                                       int ranks)
{
    size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = mmp_rank_sum_f64(g, stride, ranks, i);
    }
}

/* Declared (C) in transport/reduce_nccl.h, which is not C++. */
extern "C" int mmp_rank_sum_f64_launch(double *out, const double *gathered, size_t n, size_t stride,
                                       int ranks, void *stream)
{
    // out (n), gathered (ranks, stride) with stride >= n; out must not overlap gathered
    if (n == 0) {
        return (int)cudaSuccess;
    }
    if (ranks < 1 || stride < n || !out || !gathered) {
        return (int)cudaErrorInvalidValue;
    }
    const unsigned threads = 256;
    size_t want = (n + threads - 1) / threads;
    unsigned blocks = want < 4096 ? (unsigned)want : 4096u;
    rank_sum_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>(out, gathered, n, stride, ranks);
    return (int)cudaGetLastError();
}
