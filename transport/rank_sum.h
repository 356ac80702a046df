/* The replicas' sum order, one definition for every path that sums them:
 * ((v0 + v1) + v2) + ... over the ranks' vectors, element by element, as
 * transport/reduce.c (shm) and transport/reduce_tcp.c add them on the host,
 * and as transport/cuda/rank_sum.cu adds the all-gathered vectors on the
 * device for the NCCL reduce (transport/reduce_nccl.h). IEEE-754 additions
 * in double, rounded to nearest, with nothing to contract (no product), so
 * the host and the device give the same bits for the same order.
 * Compiles as C11 and as CUDA C++ (host and device code under nvcc), like
 * kernels/pointwise.h. Pure: no state, no allocation. */
#ifndef MMP_TRANSPORT_RANK_SUM_H
#define MMP_TRANSPORT_RANK_SUM_H

#include <stddef.h>

#ifdef __CUDACC__
#define MMP_RANK_SUM static __host__ __device__ __forceinline__
#else
#define MMP_RANK_SUM static inline
#endif

/* Element i of the rank-order sum of `ranks` vectors stored one after the
 * other `stride` elements apart (rank k's element i at g[k * stride + i]:
 * what ncclAllGather leaves in its receive buffer). */
MMP_RANK_SUM double mmp_rank_sum_f64(const double *g, size_t stride, int ranks, size_t i)
{
    double acc = g[i];
    for (int k = 1; k < ranks; k++) {
        acc += g[(size_t)k * stride + i];
    }
    return acc;
}

#endif
