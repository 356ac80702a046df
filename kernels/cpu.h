/* CPU reference kernels: the numerical spec of every op mmpipe runs.
 *
 * Plain C over contiguous fp32 arrays, shapes in the signatures, GEMMs through
 * OpenBLAS (one thread per call: kernels/cpu/gemm.c); the kernels' own pool
 * (kernels/cpu/parallel.h) is single-threaded unless mmp_cpu_set_threads
 * says otherwise. Every CUDA
 * kernel in kernels/cuda.h is tested against the function of the same name
 * here. Results are deterministic: a fixed reduction order, no threads racing
 * on a sum, the same bits at any thread count.
 *
 * Conventions:
 *  - Forward functions overwrite their outputs.
 *  - Backward functions ACCUMULATE (+=) into every gradient they are given
 *    (input and parameter gradients alike), so residual branches, several
 *    consumers of one tensor and micro-batch accumulation need no extra
 *    adds. Any gradient pointer may be NULL to skip computing it.
 *  - Layouts: images NCHW; sequences (B,T,C) with C innermost.
 *  - Nothing here allocates on the heap except conv2d's im2col buffer when
 *    the caller passes no scratch and attention backward's (Tq,Tk) buffer;
 *    nothing here can fail on valid shapes. */
#ifndef MMP_KERNELS_CPU_H
#define MMP_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/shape.h" /* mmp_conv_shape */

/* Threads the kernels use (default 1): for a GEMM's blocks (each one
 * single-threaded OpenBLAS call) and for the other loops of conv2d
 * (im2col / col2im), batch norm and the elementwise ops. Results do not
 * depend on n. */
void mmp_cpu_set_threads(int n);

/* The BLAS and the kernels it picked for this CPU, e.g. "OpenBLAS 0.3.21
 * DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64 / Haswell": GEMM bits
 * depend on them, so processes that must agree bitwise must agree on this
 * (OpenBLAS reads OPENBLAS_CORETYPE when it loads). Never NULL. */
const char *mmp_cpu_blas_kernels(void);

/* ---- low precision ----------------------------------------------------- */
/* prec is an mmp_precision (common/config.h): 0 fp32, 1 bf16, 2 fp16.
 * bf16: round to nearest even on the fp32 bit pattern, as
 * __float2bfloat16_rn; fp16: bit level too (nearest even, subnormals,
 * overflow to inf), as __float2half_rn. Every NaN narrows to 0x7fff; an fp16
 * NaN widens to 0x7fffffff, bf16 by the shift (the CUDA kernels' bits too).
 * fp32 is never rounded. */
uint16_t mmp_cpu_to_bf16(float x);
float mmp_cpu_from_bf16(uint16_t h);
uint16_t mmp_cpu_to_fp16(float x);
float mmp_cpu_from_fp16(uint16_t h);
/* Bytes of one element stored in prec (2, or 4 for fp32). */
size_t mmp_cpu_lp_bytes(int prec);
/* dst (n) = src (n) rounded to prec and widened back to fp32; dst may equal src. */
void mmp_cpu_round_lp(float *dst, const float *src, size_t n, int prec);
/* dst (n, lp_bytes each) = src (n) stored in prec; unpack widens back. fp32
 * copies. dst and src must not overlap (unless equal, for fp32). */
void mmp_cpu_pack_lp(void *dst, const float *src, size_t n, int prec);
void mmp_cpu_unpack_lp(float *dst, const void *src, size_t n, int prec);

/* ---- GEMM -------------------------------------------------------------- */
/* Row-major C (M,N) = alpha * op(A) @ op(B) + beta * C, op(A) (M,K), op(B) (K,N). */
void mmp_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* ---- linear ------------------------------------------------------------ */
/* out (N,OC) = inp (N,C) @ w^T + b;  w (OC,C), b (OC) or NULL. */
void mmp_cpu_linear_fwd(float *out, const float *inp, const float *w, const float *b, int N, int C,
                        int OC);
/* dinp (N,C) += dout @ w;  dw (OC,C) += dout^T @ inp;  db (OC) += sum_n dout. */
void mmp_cpu_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, int N, int C, int OC);

/* ---- conv2d ------------------------------------------------------------ */
/* Floats of scratch conv2d needs: one image's im2col matrix, or on a small
 * map a group of images' im2col matrices and their output (conv.c). */
size_t mmp_cpu_conv2d_scratch_floats(const mmp_conv_shape *s);
/* out (N,OC,OH,OW) = conv(inp, w) + b;  b (OC) or NULL. scratch may be NULL (then allocated). */
void mmp_cpu_conv2d_fwd(float *out, const float *inp, const float *w, const float *b,
                        const mmp_conv_shape *s, float *scratch);
/* dinp (N,C,H,W) +=, dw (OC,C,KH,KW) +=, db (OC) +=. */
void mmp_cpu_conv2d_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const mmp_conv_shape *s, float *scratch);

/* ---- batch norm (per channel over N and HW) ----------------------------- */
/* Training: normalises with the batch's statistics (biased variance), saves
 * mean (C) and rstd (C) for backward, and updates running_mean / running_var
 * (unbiased variance) with momentum: r = (1 - momentum) r + momentum x, when
 * they are non-NULL. inp/out (N,C,HW), gamma/beta (C). */
void mmp_cpu_batchnorm_fwd_train(float *out, float *mean, float *rstd, float *running_mean,
                                 float *running_var, const float *inp, const float *gamma,
                                 const float *beta, int N, int C, int HW, float eps,
                                 float momentum);
/* Inference: normalises with the running statistics. */
void mmp_cpu_batchnorm_fwd_infer(float *out, const float *inp, const float *gamma,
                                 const float *beta, const float *running_mean,
                                 const float *running_var, int N, int C, int HW, float eps);
void mmp_cpu_batchnorm_bwd(float *dinp, float *dgamma, float *dbeta, const float *dout,
                           const float *inp, const float *mean, const float *rstd,
                           const float *gamma, int N, int C, int HW);
/* mmp_cpu_batchnorm_bwd with dinp written: dinp = 0 + (what it adds), the
 * bits of the accumulating call on a zeroed dinp, dinp neither zeroed nor read. */
void mmp_cpu_batchnorm_bwd_set(float *dinp, float *dgamma, float *dbeta, const float *dout,
                               const float *inp, const float *mean, const float *rstd,
                               const float *gamma, int N, int C, int HW);

/* ---- elementwise ------------------------------------------------------- */
void mmp_cpu_relu_fwd(float *out, const float *inp, size_t n);
/* dinp += dout * (out > 0); out is the forward output (in-place safe). */
void mmp_cpu_relu_bwd(float *dinp, const float *dout, const float *out, size_t n);
/* dinp = 0 + dout * (out > 0): mmp_cpu_relu_bwd's bits on a zeroed dinp. */
void mmp_cpu_relu_bwd_set(float *dinp, const float *dout, const float *out, size_t n);
/* GELU, tanh approximation (as BERT / GPT-2). */
void mmp_cpu_gelu_fwd(float *out, const float *inp, size_t n);
void mmp_cpu_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n);
/* out = a + b (out may alias a or b). */
void mmp_cpu_add(float *out, const float *a, const float *b, size_t n);
/* x *= s */
void mmp_cpu_scale(float *x, float s, size_t n);
/* out (B,C,R) = inp (B,R,C) with its last two axes swapped (out[b,c,r] =
 * inp[b,r,c]); accumulate: out += instead of =. */
void mmp_cpu_transpose(float *out, const float *inp, int B, int R, int C, int accumulate);
/* acc (n) += x (n) in double; x (n) = (float) acc (n): a step's gradient
 * accumulator (nn/params.h says why it is double). */
void mmp_cpu_acc_f64(double *acc, const float *x, size_t n);
void mmp_cpu_round_f64(float *x, const double *acc, size_t n);

/* ---- pooling ----------------------------------------------------------- */
/* Max pool, square window k, stride, padding pad (padding never wins).
 * inp (N,C,H,W) -> out (N,C,OH,OW), argmax (N,C,OH,OW) index into H*W. */
void mmp_cpu_maxpool2d_fwd(float *out, int32_t *argmax, const float *inp, int N, int C, int H,
                           int W, int k, int stride, int pad, int OH, int OW);
void mmp_cpu_maxpool2d_bwd(float *dinp, const float *dout, const int32_t *argmax, int N, int C,
                           int H, int W, int OH, int OW);
/* Mean over the token axis: inp (B,T,C) -> out (B,C). mask (B,T) of 1/0 or
 * NULL: only tokens with mask 1 count (a row with none gives 0). */
void mmp_cpu_meanpool_fwd(float *out, const float *inp, const float *mask, int B, int T, int C);
void mmp_cpu_meanpool_bwd(float *dinp, const float *dout, const float *mask, int B, int T, int C);

/* ---- layer norm -------------------------------------------------------- */
/* out (N,C) = (inp - mean) * rstd * w + b; saves mean (N), rstd (N). */
void mmp_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C, float eps);
void mmp_cpu_layernorm_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                           const float *w, const float *mean, const float *rstd, int N, int C);

/* ---- embedding --------------------------------------------------------- */
/* out (B,T,C) = wte[ids[b,t]] + wpe[t];  ids (B,T), wte (V,C), wpe (>=T,C) or NULL.
 * ids must be in [0,V): callers validate token ids at the data boundary. */
void mmp_cpu_embedding_fwd(float *out, const int32_t *ids, const float *wte, const float *wpe,
                           int B, int T, int C);
void mmp_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *ids, int B,
                           int T, int C);

/* ---- attention --------------------------------------------------------- */
/* Multi-head scaled dot-product attention over already-projected q, k, v:
 *   q (B,Tq,C), k (B,Tk,C), v (B,Tk,C), C = NH * hs;
 *   key_mask (B,Tk): 1 = attend, 0 = padding (NULL: all keys valid);
 *   att (B,NH,Tq,Tk): saved softmax probabilities (masked keys get 0);
 *   out (B,Tq,C).
 * Self-attention passes the same source's projections; cross-attention
 * passes text queries and image keys/values. A query row whose keys are all
 * masked outputs 0.
 * prec (0 fp32, 1 bf16, 2 fp16) is the precision of the two products'
 * inputs: the caller passes q, k, v (and dout) already rounded to it; the op
 * rounds what it makes itself, the probabilities att (after the fp32
 * softmax, so att is saved rounded) and the score gradients, before they
 * enter a product. Products accumulate in fp32. prec 0 rounds nothing. */
void mmp_cpu_attention_fwd(float *out, float *att, const float *q, const float *k, const float *v,
                           const float *key_mask, int B, int Tq, int Tk, int C, int NH, int prec);
/* dq, dk, dv +=. */
void mmp_cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *att,
                           const float *q, const float *k, const float *v, int B, int Tq, int Tk,
                           int C, int NH, int prec);

/* ---- softmax / normalisation -------------------------------------------- */
/* Row softmax over cols, numerically stable: inp/out (rows, cols). */
void mmp_cpu_softmax_fwd(float *out, const float *inp, int rows, int cols);
/* dinp += out * (dout - sum(dout * out)). */
void mmp_cpu_softmax_bwd(float *dinp, const float *dout, const float *out, int rows, int cols);
/* out (N,C) = inp / max(||inp||, eps); saves norm (N). */
void mmp_cpu_l2norm_fwd(float *out, float *norm, const float *inp, int N, int C, float eps);
void mmp_cpu_l2norm_bwd(float *dinp, const float *dout, const float *out, const float *norm, int N,
                        int C, float eps);

/* ---- losses ------------------------------------------------------------ */
/* Symmetric InfoNCE (CLIP): logits (B,B) = exp(logit_scale) * img (B,C) @ txt^T,
 * loss = (CE over each row with target i + CE over each column with target i) / 2,
 * both means over B. Saves sim (B,B) = img @ txt^T (unscaled; the fusion stage
 * mines hard negatives from it), p_i2t (B,B) with p_i2t[i*B+t] the softmax over
 * texts t for image i, and p_t2i (B,B) with p_t2i[t*B+i] the softmax over
 * images i for text t.
 * Returns the loss. */
float mmp_cpu_infonce_fwd(float *sim, float *p_i2t, float *p_t2i, const float *img,
                          const float *txt, float logit_scale, int B, int C);
/* dimg (B,C) +=, dtxt (B,C) +=, dlogit_scale (1) += for loss gradient dloss. */
void mmp_cpu_infonce_bwd(float *dimg, float *dtxt, float *dlogit_scale, const float *sim,
                         const float *p_i2t, const float *p_t2i, const float *img, const float *txt,
                         float logit_scale, float dloss, int B, int C);
/* Binary cross-entropy with logits, mean over n: labels in {0,1} (or [0,1]). */
float mmp_cpu_bce_fwd(const float *logits, const float *labels, int n);
/* dlogits += dloss * (sigmoid(x) - y) / n. */
void mmp_cpu_bce_bwd(float *dlogits, const float *logits, const float *labels, float dloss, int n);

/* ---- optimizer --------------------------------------------------------- */
/* AdamW with decoupled weight decay, bias correction with step t (1-based):
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p). */
void mmp_cpu_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float weight_decay, int t);
/* Sum of squares in double (one tensor's share of the global grad norm). */
double mmp_cpu_sumsq(const float *x, size_t n);

#endif
