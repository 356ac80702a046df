/* The text branch: a BERT-style pre-LN encoder cut into numbered layers.
 *
 *   layer 0        embedding: x = wte[ids] + wpe[t]        "text.embed.{wte,wpe}"
 *   layers 1..L    pre-LN transformer layer, masked         "text.layer{i}."
 *                  self-attention then GELU FFN (nn/transformer.h)
 *   layer L+1      final LayerNorm                          "text.ln_f.{weight,bias}"
 *
 * A range [first, last) holds only its layers' parameters, named globally, so
 * any cut initialises to the same numbers as the whole. Between layers the
 * activation is the residual stream (B,T,D). Everything computes on the
 * params' backend; ids, in, mask, out, dout and din are memory of that
 * backend. This file must never allocate in forward/backward and never read
 * the mask beyond using it as the key mask. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model.h"
#include "nn/transformer.h"
#include "nn/wgrad.h"

typedef mmp_tf_layer text_layer;

struct mmp_text_net {
    mmp_backend *be;
    mmp_params params;
    int first, last; /* global layer range [first, last) */
    int L, V, T, D, NH, H;
    mmp_tf_ref wte, wpe; /* when first == 0 */
    text_layer *layers;  /* L entries; only those in range are declared */
    mmp_tf_norm ln_f;    /* when last == L + 2 */
    mmp_lowp lp;         /* train.precision of the layers' products */
};

typedef mmp_tf_layer_acts text_layer_acts; /* mid (B,T,D) */

struct mmp_text_acts {
    mmp_text_net *net;
    int max_batch;
    int B; /* of the last forward */
    mmp_tf_slab slab;
    int32_t *ids;           /* (max_batch,T) copy for the embedding backward (in the slab) */
    float **stream;         /* n+1 (B,T,D): stream[k] is the input of layer first+k */
    text_layer_acts *layer; /* L entries, those in range carved */
    float *lnf_mean, *lnf_rstd;
    float *dx, *dtmp; /* (B,T,D) running gradient and a spare */
    mmp_tf_scratch scratch;
};

int mmp_text_net_layers(const mmp_plan *plan)
{
    return plan->model.text.layers + 2;
}

static int is_block(const mmp_text_net *net, int g)
{
    return g >= 1 && g <= net->L;
}

static mmp_err declare(mmp_text_net *net)
{
    mmp_params *p = &net->params;
    char prefix[MMP_NAME_MAX];
    for (int g = net->first; g < net->last; g++) {
        if (g == 0) {
            int64_t te[2] = {net->V, net->D}, pe[2] = {net->T, net->D};
            MMP_TRY(mmp_params_add(p, "text.embed.wte", 2, te, 1, 0, MMP_INIT_NORMAL, 0.02f,
                                   &net->wte.index));
            MMP_TRY(mmp_params_add(p, "text.embed.wpe", 2, pe, 1, 0, MMP_INIT_NORMAL, 0.02f,
                                   &net->wpe.index));
        } else if (is_block(net, g)) {
            text_layer *l = &net->layers[g - 1];
            snprintf(prefix, sizeof prefix, "text.layer%d.", g);
            MMP_TRY(mmp_tf_layer_declare(l, p, prefix, net->D, net->NH, 0, net->H));
        } else {
            MMP_TRY(mmp_tf_norm_declare(&net->ln_f, p, "text.ln_f", net->D));
        }
    }
    return MMP_OK;
}

static void bind(mmp_text_net *net)
{
    mmp_params *p = &net->params;
    for (int g = net->first; g < net->last; g++) {
        if (g == 0) {
            mmp_tf_ref_bind(&net->wte, p);
            mmp_tf_ref_bind(&net->wpe, p);
        } else if (is_block(net, g)) {
            mmp_tf_layer_bind(&net->layers[g - 1], p, &net->lp);
        } else {
            mmp_tf_norm_bind(&net->ln_f, p);
        }
    }
}

mmp_err mmp_text_net_create(mmp_text_net **out, const mmp_plan *plan, int vocab_size, int first,
                            int last, uint64_t seed)
{
    return mmp_text_net_create_on(out, mmp_backend_cpu(), plan, vocab_size, first, last, seed);
}

mmp_err mmp_text_net_create_on(mmp_text_net **out, mmp_backend *be, const mmp_plan *plan,
                               int vocab_size, int first, int last, uint64_t seed)
{
    *out = NULL;
    int n_layers = mmp_text_net_layers(plan);
    const int D = plan->model.width, NH = plan->model.text.heads;
    if (plan->model.text.layers < 0 || first < 0 || last > n_layers || first >= last) {
        return mmp_errorf(MMP_ERR_INVALID, "text branch: layer range [%d,%d) outside [0,%d)", first,
                          last, n_layers);
    }
    if (D <= 0 || NH <= 0 || D % NH != 0 || plan->model.text.ffn_mult <= 0 ||
        plan->data.max_text_len <= 0 || vocab_size <= 0) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "text branch: width %d, heads %d, ffn_mult %d, max_text_len %d, "
                          "vocab %d (width must divide by heads, all > 0)",
                          D, NH, plan->model.text.ffn_mult, plan->data.max_text_len, vocab_size);
    }
    mmp_err ret = MMP_OK;
    mmp_text_net *net = calloc(1, sizeof *net);
    if (!net) {
        return mmp_errorf(MMP_ERR_NOMEM, "text net");
    }
    net->be = be;
    mmp_params_net_init(&net->params, &net->lp, be, plan->train.precision);
    net->first = first;
    net->last = last;
    net->L = plan->model.text.layers;
    net->V = vocab_size;
    net->T = plan->data.max_text_len;
    net->D = D;
    net->NH = NH;
    net->H = plan->model.text.ffn_mult * D;
    net->layers = calloc(net->L > 0 ? (size_t)net->L : 1, sizeof *net->layers);
    if (!net->layers) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "text layers");
        goto fail;
    }
    MMP_TRY_GOTO(declare(net), ret, fail);
    MMP_TRY_GOTO(mmp_params_alloc(&net->params, seed), ret, fail);
    bind(net);
    *out = net;
exit:
    return ret;
fail:
    mmp_text_net_destroy(net);
    goto exit;
}

void mmp_text_net_destroy(mmp_text_net *net)
{
    if (!net) {
        return;
    }
    mmp_params_net_fini(&net->params, &net->lp);
    free(net->layers);
    free(net);
}

mmp_params *mmp_text_net_params(mmp_text_net *net)
{
    return &net->params;
}

int64_t mmp_text_net_out_floats(const mmp_text_net *net)
{
    return (int64_t)net->T * net->D;
}

/* ---- acts --------------------------------------------------------------- */
static void carve_acts(void *ctx, mmp_tf_slab *slab)
{
    mmp_text_acts *a = ctx;
    const mmp_text_net *net = a->net;
    int N = a->max_batch * net->T;
    size_t nd = (size_t)N * net->D;
    /* int32 ids in float-sized slots: the slab is floats, the sizes match */
    a->ids = (int32_t *)mmp_tf_slab_take(slab, (size_t)N);
    for (int k = 0; k <= net->last - net->first; k++) {
        a->stream[k] = mmp_tf_slab_take(slab, nd);
    }
    for (int g = net->first; g < net->last; g++) {
        if (is_block(net, g)) {
            text_layer_acts *la = &a->layer[g - 1];
            mmp_tf_attn_acts_carve(&la->attn, slab, &net->layers[g - 1].attn, a->max_batch, net->T,
                                   net->T, 0);
            la->mid = mmp_tf_slab_take(slab, nd);
            mmp_tf_ffn_acts_carve(&la->ffn, slab, &net->layers[g - 1].ffn, N);
        }
    }
    a->lnf_mean = mmp_tf_slab_take(slab, (size_t)N);
    a->lnf_rstd = mmp_tf_slab_take(slab, (size_t)N);
    a->dx = mmp_tf_slab_take(slab, nd);
    a->dtmp = mmp_tf_slab_take(slab, nd);
    mmp_tf_scratch_carve(&a->scratch, slab, net->D, N, N, net->H);
}

mmp_err mmp_text_acts_create(mmp_text_acts **out, mmp_text_net *net, int max_batch)
{
    *out = NULL;
    if (max_batch <= 0) {
        return mmp_errorf(MMP_ERR_INVALID, "text acts: max_batch %d", max_batch);
    }
    mmp_err ret = MMP_OK;
    mmp_text_acts *a = calloc(1, sizeof *a);
    if (!a) {
        return mmp_errorf(MMP_ERR_NOMEM, "text acts");
    }
    a->net = net;
    a->max_batch = max_batch;
    a->stream = calloc((size_t)(net->last - net->first + 1), sizeof *a->stream);
    a->layer = calloc(net->L > 0 ? (size_t)net->L : 1, sizeof *a->layer);
    if (!a->stream || !a->layer) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "text acts tables");
        goto fail;
    }
    if ((ret = mmp_tf_slab_alloc(&a->slab, net->be, carve_acts, a)) != MMP_OK) {
        mmp_error_prefix(ret,
                         "text branch activations for a micro-batch of %d samples "
                         "(train.batch / train.microbatches: more micro-batches need less)",
                         max_batch);
        goto fail;
    }
    /* the largest product: attention's D x D projections or the FFN's two */
    int N = max_batch * net->T;
    size_t lp = mmp_lowp_linear_floats(N, net->D, net->D);
    size_t fc = mmp_lowp_linear_floats(N, net->D, net->H);
    if ((ret = mmp_lowp_reserve(&net->lp, fc > lp ? fc : lp)) != MMP_OK) {
        mmp_error_prefix(ret, "text acts");
        goto fail;
    }
    *out = a;
exit:
    return ret;
fail:
    mmp_text_acts_destroy(a);
    goto exit;
}

void mmp_text_acts_destroy(mmp_text_acts *a)
{
    if (!a) {
        return;
    }
    mmp_tf_slab_free(&a->slab);
    free(a->stream);
    free(a->layer);
    free(a);
}

/* ---- forward / backward ------------------------------------------------- */
void mmp_text_net_forward(mmp_text_net *net, mmp_text_acts *acts, const int32_t *ids,
                          const float *in, const float *mask, int B, float *out)
{
    MMP_ASSERT(acts->net == net && B > 0 && B <= acts->max_batch);
    const int T = net->T, D = net->D, N = B * T;
    const size_t nd = (size_t)N * D;
    mmp_backend *be = net->be;
    acts->B = B;
    if (net->first == 0) {
        be->ops->copy(be, acts->ids, ids, (size_t)N * sizeof *ids);
    } else {
        /* Kept: the LayerNorm backward of the first layer needs its input, and
         * the caller's receive buffer may be reused before the backward. */
        be->ops->copy(be, acts->stream[0], in, nd * sizeof(float));
    }
    for (int g = net->first; g < net->last; g++) {
        int k = g - net->first;
        float *x = acts->stream[k], *y = acts->stream[k + 1];
        if (g == 0) {
            be->ops->embedding_fwd(be, y, acts->ids, net->wte.w, net->wpe.w, B, T, D);
        } else if (is_block(net, g)) {
            text_layer *l = &net->layers[g - 1];
            text_layer_acts *la = &acts->layer[g - 1];
            mmp_tf_self_attn_fwd(&l->attn, &la->attn, la->mid, x, mask, B, T);
            mmp_tf_ffn_fwd(&l->ffn, &la->ffn, y, la->mid, N);
        } else {
            be->ops->layernorm_fwd(be, y, acts->lnf_mean, acts->lnf_rstd, x, net->ln_f.w.w,
                                   net->ln_f.b.w, N, D, MMP_TF_LN_EPS);
        }
    }
    be->ops->copy(be, out, acts->stream[net->last - net->first], nd * sizeof(float));
}

void mmp_text_net_backward(mmp_text_net *net, mmp_text_acts *acts, const float *dout, int B,
                           float *din)
{
    MMP_ASSERT(acts->net == net && B == acts->B);
    const int T = net->T, D = net->D, N = B * T;
    const size_t nd = (size_t)N * D;
    mmp_backend *be = net->be;
    float *dx = acts->dx;
    be->ops->copy(be, dx, dout, nd * sizeof(float));
    for (int g = net->last - 1; g >= net->first; g--) {
        int k = g - net->first;
        float *x = acts->stream[k];
        if (g == 0) {
            be->ops->embedding_bwd(be, net->wte.g, net->wpe.g, dx, acts->ids, B, T, D);
        } else if (is_block(net, g)) {
            text_layer *l = &net->layers[g - 1];
            text_layer_acts *la = &acts->layer[g - 1];
            /* One running buffer: each sublayer adds its branch to the
             * residual gradient already in dx. */
            mmp_tf_ffn_bwd(&l->ffn, &la->ffn, &acts->scratch, dx, dx, la->mid, N);
            mmp_tf_self_attn_bwd(&l->attn, &la->attn, &acts->scratch, dx, dx, x, B, T);
        } else {
            float *dprev = acts->dtmp;
            be->ops->zero(be, dprev, nd * sizeof(float));
            be->ops->layernorm_bwd(be, dprev, net->ln_f.w.g, net->ln_f.b.g, dx, x, net->ln_f.w.w,
                                   acts->lnf_mean, acts->lnf_rstd, N, D);
            acts->dtmp = dx;
            acts->dx = dx = dprev;
        }
    }
    if (net->first > 0 && din) {
        be->ops->add(be, din, din, dx, nd);
    }
}

void mmp_text_net_backward_input(mmp_text_net *net, mmp_text_acts *acts, const float *dout, int B,
                                 float *din, mmp_wgrad *wg)
{
    net->lp.defer = wg;
    mmp_text_net_backward(net, acts, dout, B, din);
    net->lp.defer = NULL;
}

mmp_err mmp_text_net_backward_weights(mmp_text_net *net, mmp_wgrad *wg)
{
    return mmp_wgrad_run(wg, &net->lp, &net->params);
}
