/* Pre-LN transformer sublayers shared by the text encoder and the fusion stage.
 *
 *   attention   out = x + Wo . Attn(q = Wq LN1(x), k = Wk S, v = Wv S)
 *               self-attention (text): S = LN1(x), keys masked by the text mask;
 *               cross-attention (fusion): S = LN_kv(src), where each query
 *               sequence b attends to source sequence src_of[b], so a source
 *               shared by several query sequences (an image in a positive and
 *               a hard-negative pair) is normalised and projected once.
 *   feed-forward  out = x + W2 . GELU(W1 . LN2(x) + b1) + b2
 *
 * Parameter names under a prefix P ("text.layer1."): P"ln1.{weight,bias}",
 * P"attn.{q,k,v,out}.{weight,bias}", P"ln_kv.{weight,bias}" (cross only),
 * P"ln2.{weight,bias}", P"ffn.fc1.{weight,bias}", P"ffn.fc2.{weight,bias}".
 * Linear weights are UNIFORM_FAN with decay, biases ZERO, LayerNorms ONE/ZERO,
 * none of those three decayed.
 *
 * A sublayer holds pointers into an mmp_params arena: declare its parameters
 * before mmp_params_alloc(), bind them after. It computes on the arena's
 * backend (kept at declare time); every tensor argument below is memory of
 * that backend, except src_of, a HOST table. Saved activations live in a
 * caller's acts struct carved from one slab at acts-creation time; forward and
 * backward never allocate. Backward follows the kernels' convention and
 * accumulates (+=) into parameter gradients and into dx. It adds only the
 * sublayer's branch, not the residual identity, so a caller that keeps one
 * running gradient buffer passes it as both dout and dx (they may alias) and
 * the residual path comes for free. */
#ifndef MMP_NN_TRANSFORMER_H
#define MMP_NN_TRANSFORMER_H

#include <stddef.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "nn/lowp.h"
#include "nn/params.h"

#define MMP_TF_LN_EPS 1e-5f

/* ---- parameter pieces ------------------------------------------------------ */
typedef struct mmp_tf_ref {
    int index;    /* in the arena's table */
    float *w, *g; /* set by bind */
} mmp_tf_ref;

typedef struct mmp_tf_linear {
    int in, out;
    mmp_tf_ref w, b; /* w (out,in), b (out) */
} mmp_tf_linear;

typedef struct mmp_tf_norm {
    int C;
    mmp_tf_ref w, b; /* (C) each */
} mmp_tf_norm;

/* Declare "<name>.weight" (out,in) UNIFORM_FAN decayed and "<name>.bias" ZERO. */
mmp_err mmp_tf_linear_declare(mmp_tf_linear *l, mmp_params *p, const char *name, int in, int out);
/* Declare "<name>.weight" ONE and "<name>.bias" ZERO, not decayed. */
mmp_err mmp_tf_norm_declare(mmp_tf_norm *n, mmp_params *p, const char *name, int C);
void mmp_tf_linear_bind(mmp_tf_linear *l, mmp_params *p);
void mmp_tf_norm_bind(mmp_tf_norm *n, mmp_params *p);
/* Points r at its declared parameter's value and gradient. */
void mmp_tf_ref_bind(mmp_tf_ref *r, mmp_params *p);

/* ---- activation slab ----------------------------------------------------- */
/* Two-pass carving: with base == NULL take() only counts (returns NULL); after
 * allocating `used` floats, reset used to 0 and carve the same way again. */
typedef struct mmp_tf_slab {
    mmp_backend *be; /* the memory's owner, set by alloc */
    float *base;
    size_t used; /* floats, each take rounded up to 16 (64 bytes) */
} mmp_tf_slab;

float *mmp_tf_slab_take(mmp_tf_slab *s, size_t n);
/* Runs carve(ctx, slab) twice around one zeroed allocation of backend be. */
mmp_err mmp_tf_slab_alloc(mmp_tf_slab *s, mmp_backend *be, void (*carve)(void *ctx, mmp_tf_slab *s),
                          void *ctx);
void mmp_tf_slab_free(mmp_tf_slab *s);

/* ---- attention sublayer --------------------------------------------------- */
typedef struct mmp_tf_attn {
    mmp_backend *be;    /* the params' backend */
    const mmp_lowp *lp; /* the network's products' precision; NULL (declare's default): fp32 */
    int D, NH, cross;
    mmp_tf_norm ln1, ln_kv; /* ln_kv only when cross */
    mmp_tf_linear q, k, v, o;
} mmp_tf_attn;

/* Saved activations of one attention sublayer for one micro-batch. N = B*Tq
 * query rows; Nk = key rows (self: N; cross: Ns*Tk, one per source row). */
typedef struct mmp_tf_attn_acts {
    float *ln, *ln_mean, *ln_rstd;    /* (N,D), (N), (N) */
    float *kv_ln, *kv_mean, *kv_rstd; /* cross: (Nk,D), (Nk), (Nk) */
    float *q;                         /* (N,D) */
    float *k, *v;                     /* (Nk,D) */
    float *att;                       /* (B,NH,Tq,Tk) */
    float *ctx;                       /* (N,D) heads' outputs before Wo */
} mmp_tf_attn_acts;

mmp_err mmp_tf_attn_declare(mmp_tf_attn *a, mmp_params *p, const char *prefix, int D, int NH,
                            int cross);
void mmp_tf_attn_bind(mmp_tf_attn *a, mmp_params *p);
/* Carves acts for at most B query sequences of Tq rows attending to Tk keys;
 * Ns source sequences for cross-attention (ignored for self). */
void mmp_tf_attn_acts_carve(mmp_tf_attn_acts *s, mmp_tf_slab *slab, const mmp_tf_attn *a, int B,
                            int Tq, int Tk, int Ns);

/* Backward scratch shared by every sublayer of a network (one backward at a
 * time): sized by mmp_tf_scratch_carve for the largest sublayer. */
typedef struct mmp_tf_scratch {
    float *d_ln, *dq, *dctx; /* (N,D) */
    float *dk, *dv, *d_kvln; /* (Nk,D) */
    float *dh, *dg;          /* (N,H) */
} mmp_tf_scratch;

/* N query rows, Nk key rows, H FFN hidden width (0 if no FFN). */
void mmp_tf_scratch_carve(mmp_tf_scratch *s, mmp_tf_slab *slab, int D, int N, int Nk, int H);

/* Self-attention. x, out (B,T,D) (out must not alias x); key_mask (B,T) 1/0. */
void mmp_tf_self_attn_fwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, float *out, const float *x,
                          const float *key_mask, int B, int T);
/* dx (B,T,D) += branch gradient for dout; x is the forward's input. */
void mmp_tf_self_attn_bwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, mmp_tf_scratch *w, float *dx,
                          const float *dout, const float *x, int B, int T);

/* Cross-attention: x, out (B,Tq,D); src (Ns,Tk,D); query sequence b attends to
 * all Tk rows of src[src_of[b]] (no key mask). */
void mmp_tf_cross_attn_fwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, float *out, const float *x,
                           int B, int Tq, const float *src, int Ns, int Tk, const int *src_of);
/* dx (B,Tq,D) += and dsrc (Ns,Tk,D) += (dsrc may be NULL). Contributions of the
 * query sequences to a shared source are summed in order b = 0..B-1. */
void mmp_tf_cross_attn_bwd(const mmp_tf_attn *a, mmp_tf_attn_acts *s, mmp_tf_scratch *w, float *dx,
                           float *dsrc, const float *dout, const float *x, int B, int Tq,
                           const float *src, int Ns, int Tk, const int *src_of);

/* ---- feed-forward sublayer ------------------------------------------------ */
typedef struct mmp_tf_ffn {
    mmp_backend *be;    /* the params' backend */
    const mmp_lowp *lp; /* as mmp_tf_attn's */
    int D, H;
    mmp_tf_norm ln2;
    mmp_tf_linear fc1, fc2;
} mmp_tf_ffn;

typedef struct mmp_tf_ffn_acts {
    float *ln, *ln_mean, *ln_rstd; /* (N,D), (N), (N) */
    float *h, *g;                  /* (N,H) pre- and post-GELU */
} mmp_tf_ffn_acts;

mmp_err mmp_tf_ffn_declare(mmp_tf_ffn *f, mmp_params *p, const char *prefix, int D, int H);
void mmp_tf_ffn_bind(mmp_tf_ffn *f, mmp_params *p);
void mmp_tf_ffn_acts_carve(mmp_tf_ffn_acts *s, mmp_tf_slab *slab, const mmp_tf_ffn *f, int N);
/* x, out (N,D), out must not alias x. */
void mmp_tf_ffn_fwd(const mmp_tf_ffn *f, mmp_tf_ffn_acts *s, float *out, const float *x, int N);
/* dx (N,D) += branch gradient for dout (dx may alias dout). */
void mmp_tf_ffn_bwd(const mmp_tf_ffn *f, mmp_tf_ffn_acts *s, mmp_tf_scratch *w, float *dx,
                    const float *dout, const float *x, int N);

/* ---- one encoder layer and a network's own state ---------------------------- */
/* A pre-LN layer as the text encoder and the fusion stage stack them:
 * attention (self or cross), then the feed-forward sublayer. */
typedef struct mmp_tf_layer {
    mmp_tf_attn attn;
    mmp_tf_ffn ffn;
} mmp_tf_layer;

typedef struct mmp_tf_layer_acts {
    mmp_tf_attn_acts attn;
    float *mid; /* residual stream between attention and FFN */
    mmp_tf_ffn_acts ffn;
} mmp_tf_layer_acts;

/* Declares both sublayers under prefix (hidden width H, cross-attention when cross). */
mmp_err mmp_tf_layer_declare(mmp_tf_layer *l, mmp_params *p, const char *prefix, int D, int NH,
                             int cross, int H);
/* Binds both sublayers and points their products at lp (the network's precision). */
void mmp_tf_layer_bind(mmp_tf_layer *l, mmp_params *p, const mmp_lowp *lp);

#endif
