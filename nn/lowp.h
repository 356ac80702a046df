/* Products at the training precision: linear and conv2d whose inputs are
 * rounded to bf16/fp16 (train.precision) and accumulated in fp32.
 *
 * A network holds one mmp_lowp: its precision and a scratch buffer of
 * backend memory the rounded copies of an op's inputs (activation, weight,
 * output gradient) are written to just before the fp32 op runs. Nothing
 * rounded is kept: backward rounds its saved fp32 input again, which gives
 * the same values, so the saved activations, the fp32 master weights and the
 * gradients never change. fp32 calls the op directly (no copy), so an fp32
 * network computes bitwise what it did before this existed.
 *
 * Attention rounds its own inputs: the callers round q, k, v and the context
 * gradient in place (they feed nothing else) and pass the precision to the
 * attention ops, which round the probabilities and score gradients. */
#ifndef MMP_NN_LOWP_H
#define MMP_NN_LOWP_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"
#include "kernels/backend.h"

typedef struct mmp_lowp {
    mmp_backend *be;
    mmp_precision prec;
    float *buf; /* backend memory, cap floats; NULL for fp32 */
    size_t cap;
    /* Set (by the stage running a zero-bubble schedule's B pass): the
     * linear/conv backwards below compute only the input gradient and record
     * the weight gradients there for the W pass (nn/wgrad.h). NULL: fused. */
    struct mmp_wgrad *defer;
} mmp_lowp;

/* No scratch yet; prec MMP_PREC_FP32 never needs any. */
void mmp_lowp_init(mmp_lowp *lp, mmp_backend *be, mmp_precision prec);
/* Grows the scratch to hold floats (no-op for fp32 or when it does already).
 * On failure the old scratch is kept. */
mmp_err mmp_lowp_reserve(mmp_lowp *lp, size_t floats);
/* NULL-safe, idempotent. */
void mmp_lowp_fini(mmp_lowp *lp);

/* Scratch floats the ops below need for these shapes. */
size_t mmp_lowp_linear_floats(int N, int C, int OC);
size_t mmp_lowp_conv2d_floats(const mmp_conv_shape *s);

/* The backend's linear_fwd/_bwd and conv2d_fwd/_bwd with inp, w and dout
 * rounded to lp->prec first; b, db and every gradient stay fp32 (db sums
 * the rounded dout). The scratch must hold the shapes' *_floats. */
void mmp_lowp_linear_fwd(const mmp_lowp *lp, float *out, const float *inp, const float *w,
                         const float *b, int N, int C, int OC);
void mmp_lowp_linear_bwd(const mmp_lowp *lp, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, int N, int C, int OC);
void mmp_lowp_conv2d_fwd(const mmp_lowp *lp, float *out, const float *inp, const float *w,
                         const float *b, const mmp_conv_shape *s, float *scratch);
void mmp_lowp_conv2d_bwd(const mmp_lowp *lp, float *dinp, float *dw, float *db, const float *dout,
                         const float *inp, const float *w, const mmp_conv_shape *s, float *scratch);
/* x (n) rounded in place (a tensor that only feeds products). */
void mmp_lowp_round(const mmp_lowp *lp, float *x, size_t n);

#endif
