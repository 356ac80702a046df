/* The CPU kernels' own threads, for their loops and for the blocks a GEMM
 * is cut into (kernels/cpu/gemm.c: OpenBLAS itself runs one thread).
 * Private to kernels/cpu/ and nn/retrieval.c (a metric the host computes
 * between kernels, with the same thread count).
 *
 * mmp_cpu_set_threads(n) sizes the pool: n - 1 workers that sleep on a
 * condition variable between loops, after looking for the next one for up
 * to 0.1 ms (yielding the CPU between looks: parallel.c). A GEMM called from
 * inside a loop's range finds the pool busy and runs its blocks on that
 * thread.
 *
 * A loop is split into contiguous ranges, one per thread; every kernel that
 * uses this computes each element (or channel) the same way whichever range
 * holds it, so results do not depend on the thread count. */
#ifndef MMP_KERNELS_CPU_PARALLEL_H
#define MMP_KERNELS_CPU_PARALLEL_H

#include <stddef.h>

/* fn(ctx, lo, hi) handles items [lo, hi). */
typedef void (*mmp_cpu_range_fn)(void *ctx, size_t lo, size_t hi);

/* Runs fn over [0, n) split across up to the chosen thread count, at least
 * grain items per range, and returns when every range is done. Blocks.
 * Runs fn(ctx, 0, n) on the calling thread alone when one thread is chosen,
 * n < 2 grain, the pool is busy (a second calling thread) or the process
 * is a fork child of the one that started the workers. */
void mmp_cpu_parallel_for(size_t n, size_t grain, mmp_cpu_range_fn fn, void *ctx);

/* How many ranges mmp_cpu_parallel_for splits a large enough loop into now:
 * the chosen thread count, less workers that could not be started; 1 in a
 * fork child of the process that started them. A caller keeping scratch per
 * range sizes it by this (a busy pool runs every range on the caller). */
int mmp_cpu_pool_threads(void);

/* Starts workers until the pool has n - 1 (never stops any); n <= 1 makes
 * later loops run on the caller. Called by mmp_cpu_set_threads. */
void mmp_cpu_pool_resize(int n);

/* On x86-64 Linux with GCC or clang, a loop function marked MMP_CPU_CLONES is
 * compiled twice, for AVX2 and for the baseline, and the dynamic loader
 * picks one for the CPU (an ifunc). The build keeps floating-point
 * contraction off (no FMA) and never reassociates, so both compute the
 * same bits; only the vector width differs. Elsewhere it is empty. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(MMP_NO_CLONES)
#define MMP_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MMP_CPU_CLONES
#endif
/* For the helpers such a loop calls: inlined into each clone, so that they
 * are compiled for its target too (a call would run the baseline code). */
#if defined(__GNUC__)
#define MMP_CPU_INLINE inline __attribute__((always_inline))
#else
#define MMP_CPU_INLINE inline
#endif

#endif
