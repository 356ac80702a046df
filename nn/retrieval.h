/* Retrieval recall@1 over ITC embeddings, in O(n) memory.
 *
 * Pair i (image i, text i) is an image->text hit when image i's similarity
 * to text i is strictly above its similarity to every other text (a tie
 * counts against the model; a NaN similarity never beats anything, and a
 * NaN own similarity is beaten by nothing); text->image the same with the
 * roles swapped. A similarity is the dot product of two HOST embeddings,
 * summed in one fixed order: s = 0; for k in 0..E-1: s = fma(img[k], txt[k], s)
 * (one rounding per term), whatever the number of pairs, the tile sizes or
 * the CPU's vector width, so the recall is a function of the embeddings
 * alone. It is the order OpenBLAS's sgemm kernels use up to their K block
 * (E <= 448 with 0.3.21's AVX-512 kernels; a longer E they sum in two
 * parts), so the n x n sgemm this replaced gave the same bits there. Never
 * holds more than one tile of similarities: three floats per pair plus a
 * fixed scratch per thread.
 *
 * Threads: each block of image rows is split by texts across the CPU
 * kernels' pool (mmp_cpu_set_threads, i.e. train.threads; kernels/cpu/
 * parallel.h), and the recall and every similarity are the same bits
 * whatever the thread count. */
#ifndef MMP_NN_RETRIEVAL_H
#define MMP_NN_RETRIEVAL_H

#include <stdint.h>

#include "common/err.h"

/* Called after each block of image rows (done of n rows compared against
 * every text), always on the thread that called mmp_retrieval_r1_blocked,
 * never on a pool worker; may be NULL. Evaluation uses it to keep talking to the
 * coordinator's stall watchdog while a large set is compared. */
typedef void (*mmp_retrieval_progress)(void *ctx, int64_t done, int64_t n);

/* Recall@1 both ways over n pairs of HOST embeddings img_emb (n,E), txt_emb
 * (n,E) into *i2t and *t2i (hits / n; 0 when n is 0). rows: image rows per
 * block (<= 0: the default); results do not depend on it. MMP_ERR_NOMEM
 * names the bytes it could not get (O(n + threads * E) of them). Returns
 * when done; called from a second thread while the pool is busy, it
 * computes alone (the same bits). */
mmp_err mmp_retrieval_r1_blocked(const float *img_emb, const float *txt_emb, int n, int E, int rows,
                                 mmp_retrieval_progress progress, void *ctx, double *i2t,
                                 double *t2i);

/* For tests (n small): every similarity the recall compares, sim (n,n),
 * sim[a*n + b] = image a . text b, computed with rows per block as
 * mmp_retrieval_r1_blocked computes it. */
mmp_err mmp_retrieval_similarities(const float *img_emb, const float *txt_emb, int n, int E,
                                   int rows, float *sim);

/* For tests: the similarity kernel to use from now on in this process,
 * "scalar", "avx2" or "avx512" (NULL: the best this CPU has, the default).
 * Returns 0, changing nothing, when this CPU or build lacks it. Every kernel
 * computes the same bits. Not thread-safe. */
int mmp_retrieval_force_isa(const char *isa);

#endif
