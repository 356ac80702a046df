/* The fusion/loss stage: ITC + ITM over one micro-batch of image and text tokens.
 *
 *   ITC  e_img = L2norm(W_img . flatten(img tokens) + b)   "fusion.itc.img_proj"
 *        e_txt = L2norm(W_txt . txt[:,0,:] + b)            "fusion.itc.txt_proj"
 *        symmetric InfoNCE with exp(min(logit_scale, ln 100)) "fusion.logit_scale"
 *        The image side flattens all Ni*D values (not a mean token) so the
 *        embedding keeps the spatial layout that captions such as "left of"
 *        depend on.
 *   ITM  for text t the hard negative image j(t) = argmax_{j != t} sim[j][t]
 *        (ties: lowest j). Pairs 0..B-1 are (img t, txt t, 1), pairs B..2B-1
 *        (img j(t), txt t, 0); with B == 1 only the positive. L pre-LN
 *        cross-attention layers "fusion.layer{i}." (i from 0; text queries,
 *        LN_kv'd image keys/values, no key mask) + GELU FFN, then LayerNorm
 *        "fusion.itm_ln" and a linear head "fusion.itm_head" on token 0: BCE.
 *   loss = ITC + ITM.
 *
 * Only the [CLS] query row goes through the cross-attention layers. These
 * layers have no self-attention, so query row r's output depends on text row r
 * and the image alone; the head reads row 0, hence rows 1..T-1 cannot reach
 * the loss and running them would only cost T times the work for the same
 * loss and the same (zero) gradients. If fusion layers ever get a text
 * self-attention sublayer, ITM_QUERY_ROWS becomes T and the mask its key mask.
 *
 * Keys and values are computed once per image per layer and shared by that
 * image's positive and hard-negative pairs; gradients flowing back to a shared
 * image are summed in pair order, then the ITC gradient is added, so dimg is
 * deterministic. The hard-negative choice is piecewise constant in the
 * similarities, so no gradient flows through it.
 *
 * Everything computes on the params' backend: img, txt, mask, dimg, dtxt and
 * embed's outputs are memory of that backend. Forward copies to the host only
 * what it must read there: the logit scale (1 float), the similarity matrix
 * (B x B) it mines hard negatives from, and the two losses; the ITM labels
 * go the other way (2B floats).
 *
 * This file must never allocate in forward/backward/embed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model.h"
#include "nn/transformer.h"
#include "nn/wgrad.h"

#define ITM_QUERY_ROWS 1
#define L2NORM_EPS 1e-6f

struct mmp_fusion_net {
    mmp_backend *be;
    mmp_params params;
    int D, E, Ni, T, L, NH, H;
    mmp_tf_linear img_proj, txt_proj;
    mmp_tf_ref logit_scale;
    mmp_tf_layer *layers; /* L */
    mmp_tf_norm itm_ln;
    mmp_tf_linear itm_head; /* D -> 1 */
    mmp_lowp lp;            /* train.precision of every product but the ITC similarities */
};

typedef mmp_tf_layer_acts fusion_layer_acts; /* mid (P,Tq,D) */

struct mmp_fusion_acts {
    mmp_fusion_net *net;
    int max_batch;
    int B, P; /* of the last forward; P = pairs */
    mmp_tf_slab slab;
    /* ITC */
    float *img;                 /* (B,Ni,D) copy of the input */
    float *cls;                 /* (B,D) text [CLS] rows */
    float *img_proj, *txt_proj; /* (B,E) */
    float *img_emb, *txt_emb;   /* (B,E) */
    float *img_norm, *txt_norm; /* (B) */
    float *sim, *p_i2t, *p_t2i; /* (B,B) */
    float scale;                /* logit scale used (clamped) */
    int clamped;
    /* ITM */
    int *neg;                      /* (B) hard negative image of each text */
    float *host_sim, *host_labels; /* HOST (B,B) and (P): what forward reads/writes there */
    int *pair_img, *pair_txt;      /* (P) */
    float *labels, *logits;        /* (P) */
    float **stream;                /* L+1 of (P,Tq,D) */
    fusion_layer_acts *layer;      /* L */
    float *head_ln, *head_mean, *head_rstd; /* (P,D), (P), (P) */
    /* backward scratch */
    float *dx, *dhead_ln, *dlogits;                         /* (P,Tq,D), (P,D), (P) */
    float *d_img_emb, *d_txt_emb, *d_img_proj, *d_txt_proj; /* (B,E) */
    float *dcls;                                            /* (B,D) */
    mmp_tf_scratch scratch;
    /* embed: own buffers, so it never disturbs a micro-batch in flight */
    float *emb_proj, *emb_norm, *emb_cls; /* (max_batch,E), (max_batch), (max_batch,D) */
};

/* Image tokens per sample, by the image branch's arithmetic: a stride-1 stem,
 * an optional 3x3/2 pad-1 max pool, then a 3x3/2 pad-1 conv opening each stage
 * after the first. */
static int image_tokens(const mmp_plan *plan)
{
    int S = plan->data.image_size;
    if (plan->model.image.stem_pool) {
        S = (S + 2 - 3) / 2 + 1;
    }
    for (int s = 1; s < plan->model.image.n_stages; s++) {
        S = (S + 2 - 3) / 2 + 1;
    }
    return S * S;
}

static mmp_err declare(mmp_fusion_net *net, float init_logit_scale)
{
    mmp_params *p = &net->params;
    char prefix[MMP_NAME_MAX];
    int64_t one[1] = {1};
    MMP_TRY(
        mmp_tf_linear_declare(&net->img_proj, p, "fusion.itc.img_proj", net->Ni * net->D, net->E));
    MMP_TRY(mmp_tf_linear_declare(&net->txt_proj, p, "fusion.itc.txt_proj", net->D, net->E));
    MMP_TRY(mmp_params_add(p, "fusion.logit_scale", 1, one, 1, 0, MMP_INIT_CONST, init_logit_scale,
                           &net->logit_scale.index));
    for (int i = 0; i < net->L; i++) {
        snprintf(prefix, sizeof prefix, "fusion.layer%d.", i);
        MMP_TRY(mmp_tf_layer_declare(&net->layers[i], p, prefix, net->D, net->NH, 1, net->H));
    }
    MMP_TRY(mmp_tf_norm_declare(&net->itm_ln, p, "fusion.itm_ln", net->D));
    return mmp_tf_linear_declare(&net->itm_head, p, "fusion.itm_head", net->D, 1);
}

static void bind(mmp_fusion_net *net)
{
    mmp_params *p = &net->params;
    mmp_tf_linear_bind(&net->img_proj, p);
    mmp_tf_linear_bind(&net->txt_proj, p);
    mmp_tf_ref_bind(&net->logit_scale, p);
    for (int i = 0; i < net->L; i++) {
        mmp_tf_layer_bind(&net->layers[i], p, &net->lp);
    }
    mmp_tf_norm_bind(&net->itm_ln, p);
    mmp_tf_linear_bind(&net->itm_head, p);
}

mmp_err mmp_fusion_net_create(mmp_fusion_net **out, const mmp_plan *plan, uint64_t seed)
{
    return mmp_fusion_net_create_on(out, mmp_backend_cpu(), plan, seed);
}

mmp_err mmp_fusion_net_create_on(mmp_fusion_net **out, mmp_backend *be, const mmp_plan *plan,
                                 uint64_t seed)
{
    *out = NULL;
    const int D = plan->model.width, NH = plan->model.fusion.heads;
    const int Ni = image_tokens(plan);
    if (D <= 0 || NH <= 0 || D % NH != 0 || plan->model.fusion.layers < 0 ||
        plan->model.text.ffn_mult <= 0 || plan->data.max_text_len <= 0 || Ni <= 0 ||
        !(plan->train.init_temperature > 0)) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "fusion: width %d, heads %d, layers %d, ffn_mult %d, max_text_len %d, "
                          "image tokens %d, init_temperature %g (width must divide by heads)",
                          D, NH, plan->model.fusion.layers, plan->model.text.ffn_mult,
                          plan->data.max_text_len, Ni, (double)plan->train.init_temperature);
    }
    mmp_err ret = MMP_OK;
    mmp_fusion_net *net = calloc(1, sizeof *net);
    if (!net) {
        return mmp_errorf(MMP_ERR_NOMEM, "fusion net");
    }
    net->be = be;
    mmp_params_net_init(&net->params, &net->lp, be, plan->train.precision);
    net->D = D;
    net->E = D;
    net->Ni = Ni;
    net->T = plan->data.max_text_len;
    net->L = plan->model.fusion.layers;
    net->NH = NH;
    /* The plan has no fusion FFN width of its own: its layers are BERT layers
     * like the text encoder's. */
    net->H = plan->model.text.ffn_mult * D;
    net->layers = calloc(net->L > 0 ? (size_t)net->L : 1, sizeof *net->layers);
    if (!net->layers) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "fusion layers");
        goto fail;
    }
    MMP_TRY_GOTO(declare(net, logf(1.0f / plan->train.init_temperature)), ret, fail);
    MMP_TRY_GOTO(mmp_params_alloc(&net->params, seed), ret, fail);
    bind(net);
    *out = net;
exit:
    return ret;
fail:
    mmp_fusion_net_destroy(net);
    goto exit;
}

void mmp_fusion_net_destroy(mmp_fusion_net *net)
{
    if (!net) {
        return;
    }
    mmp_params_net_fini(&net->params, &net->lp);
    free(net->layers);
    free(net);
}

mmp_params *mmp_fusion_net_params(mmp_fusion_net *net)
{
    return &net->params;
}

int mmp_fusion_embed_dim(const mmp_fusion_net *net)
{
    return net->E;
}

/* ---- acts --------------------------------------------------------------- */
static void carve_acts(void *ctx, mmp_tf_slab *slab)
{
    mmp_fusion_acts *a = ctx;
    const mmp_fusion_net *net = a->net;
    const size_t mb = (size_t)a->max_batch, P = 2 * mb, D = (size_t)net->D, E = (size_t)net->E;
    const size_t rows = P * ITM_QUERY_ROWS;
    a->img = mmp_tf_slab_take(slab, mb * net->Ni * D);
    a->cls = mmp_tf_slab_take(slab, mb * D);
    a->img_proj = mmp_tf_slab_take(slab, mb * E);
    a->txt_proj = mmp_tf_slab_take(slab, mb * E);
    a->img_emb = mmp_tf_slab_take(slab, mb * E);
    a->txt_emb = mmp_tf_slab_take(slab, mb * E);
    a->img_norm = mmp_tf_slab_take(slab, mb);
    a->txt_norm = mmp_tf_slab_take(slab, mb);
    a->sim = mmp_tf_slab_take(slab, mb * mb);
    a->p_i2t = mmp_tf_slab_take(slab, mb * mb);
    a->p_t2i = mmp_tf_slab_take(slab, mb * mb);
    a->labels = mmp_tf_slab_take(slab, P);
    a->logits = mmp_tf_slab_take(slab, P);
    for (int l = 0; l <= net->L; l++) {
        a->stream[l] = mmp_tf_slab_take(slab, rows * D);
    }
    for (int l = 0; l < net->L; l++) {
        fusion_layer_acts *la = &a->layer[l];
        mmp_tf_attn_acts_carve(&la->attn, slab, &net->layers[l].attn, (int)P, ITM_QUERY_ROWS,
                               net->Ni, (int)mb);
        la->mid = mmp_tf_slab_take(slab, rows * D);
        mmp_tf_ffn_acts_carve(&la->ffn, slab, &net->layers[l].ffn, (int)rows);
    }
    a->head_ln = mmp_tf_slab_take(slab, P * D);
    a->head_mean = mmp_tf_slab_take(slab, P);
    a->head_rstd = mmp_tf_slab_take(slab, P);
    a->dx = mmp_tf_slab_take(slab, rows * D);
    a->dhead_ln = mmp_tf_slab_take(slab, P * D);
    a->dlogits = mmp_tf_slab_take(slab, P);
    a->d_img_emb = mmp_tf_slab_take(slab, mb * E);
    a->d_txt_emb = mmp_tf_slab_take(slab, mb * E);
    a->d_img_proj = mmp_tf_slab_take(slab, mb * E);
    a->d_txt_proj = mmp_tf_slab_take(slab, mb * E);
    a->dcls = mmp_tf_slab_take(slab, mb * D);
    mmp_tf_scratch_carve(&a->scratch, slab, net->D, (int)rows, (int)mb * net->Ni, net->H);
    a->emb_proj = mmp_tf_slab_take(slab, mb * E);
    a->emb_norm = mmp_tf_slab_take(slab, mb);
    a->emb_cls = mmp_tf_slab_take(slab, mb * D);
}

/* Scratch floats of the largest product at the training precision for
 * max_batch samples (carve_acts' shapes). */
static size_t lp_floats(const mmp_fusion_net *net, int max_batch)
{
    const int mb = max_batch, P = 2 * mb, rows = P * ITM_QUERY_ROWS, Nk = mb * net->Ni;
    const int D = net->D, H = net->H;
    size_t f[] = {
        mmp_lowp_linear_floats(mb, net->Ni * D, net->E),
        mmp_lowp_linear_floats(mb, D, net->E),
        mmp_lowp_linear_floats(P, D, 1),
        mmp_lowp_linear_floats(rows, D, D),
        mmp_lowp_linear_floats(Nk, D, D),
        mmp_lowp_linear_floats(rows, D, H),
        mmp_lowp_linear_floats(rows, H, D),
    };
    size_t m = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        m = f[i] > m ? f[i] : m;
    }
    return m;
}

mmp_err mmp_fusion_acts_create(mmp_fusion_acts **out, mmp_fusion_net *net, int max_batch)
{
    *out = NULL;
    if (max_batch <= 0) {
        return mmp_errorf(MMP_ERR_INVALID, "fusion acts: max_batch %d", max_batch);
    }
    mmp_err ret = MMP_OK;
    mmp_fusion_acts *a = calloc(1, sizeof *a);
    if (!a) {
        return mmp_errorf(MMP_ERR_NOMEM, "fusion acts");
    }
    a->net = net;
    a->max_batch = max_batch;
    a->neg = calloc((size_t)max_batch, sizeof *a->neg);
    a->host_sim = calloc((size_t)max_batch * (size_t)max_batch, sizeof *a->host_sim);
    a->host_labels = calloc(2 * (size_t)max_batch, sizeof *a->host_labels);
    a->pair_img = calloc(2 * (size_t)max_batch, sizeof *a->pair_img);
    a->pair_txt = calloc(2 * (size_t)max_batch, sizeof *a->pair_txt);
    a->stream = calloc((size_t)net->L + 1, sizeof *a->stream);
    a->layer = calloc(net->L > 0 ? (size_t)net->L : 1, sizeof *a->layer);
    if (!a->neg || !a->host_sim || !a->host_labels || !a->pair_img || !a->pair_txt || !a->stream ||
        !a->layer) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "fusion acts tables");
        goto fail;
    }
    MMP_TRY_GOTO(mmp_tf_slab_alloc(&a->slab, net->be, carve_acts, a), ret, fail);
    if ((ret = mmp_lowp_reserve(&net->lp, lp_floats(net, max_batch))) != MMP_OK) {
        mmp_error_prefix(ret, "fusion acts");
        goto fail;
    }
    *out = a;
exit:
    return ret;
fail:
    mmp_fusion_acts_destroy(a);
    goto exit;
}

void mmp_fusion_acts_destroy(mmp_fusion_acts *a)
{
    if (!a) {
        return;
    }
    mmp_tf_slab_free(&a->slab);
    free(a->neg);
    free(a->host_sim);
    free(a->host_labels);
    free(a->pair_img);
    free(a->pair_txt);
    free(a->stream);
    free(a->layer);
    free(a);
}

/* ---- forward / backward ------------------------------------------------- */
// cls (B,D) = txt (B,T,D)[:, 0, :]
static void gather_cls(mmp_backend *be, float *cls, const float *txt, int B, int T, int D)
{
    for (int b = 0; b < B; b++) {
        be->ops->copy(be, cls + (size_t)b * D, txt + (size_t)b * T * D, (size_t)D * sizeof(float));
    }
}

/* neg[t] = argmax_{j != t} sim[j*B + t], ties to the lowest j. */
static void mine_hard_negatives(int *neg, const float *sim, int B)
{
    for (int t = 0; t < B; t++) {
        int best = -1;
        for (int j = 0; j < B; j++) {
            if (j != t && (best < 0 || sim[(size_t)j * B + t] > sim[(size_t)best * B + t])) {
                best = j;
            }
        }
        neg[t] = best;
    }
}

void mmp_fusion_net_forward(mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                            const float *txt, const float *mask, int B, mmp_loss_parts *parts)
{
    (void)mask; /* ITC and ITM read only the [CLS] row (see the top of this file) */
    MMP_ASSERT(acts->net == net && B > 0 && B <= acts->max_batch);
    const int D = net->D, E = net->E, Ni = net->Ni, Tq = ITM_QUERY_ROWS;
    const int P = B > 1 ? 2 * B : B;
    mmp_fusion_acts *a = acts;
    mmp_backend *be = net->be;
    a->B = B;
    a->P = P;

    /* ITC */
    be->ops->copy(be, a->img, img, (size_t)B * Ni * D * sizeof(float));
    gather_cls(be, a->cls, txt, B, net->T, D);
    mmp_lowp_linear_fwd(&net->lp, a->img_proj, a->img, net->img_proj.w.w, net->img_proj.b.w, B,
                        Ni * D, E);
    mmp_lowp_linear_fwd(&net->lp, a->txt_proj, a->cls, net->txt_proj.w.w, net->txt_proj.b.w, B, D,
                        E);
    be->ops->l2norm_fwd(be, a->img_emb, a->img_norm, a->img_proj, B, E, L2NORM_EPS);
    be->ops->l2norm_fwd(be, a->txt_emb, a->txt_norm, a->txt_proj, B, E, L2NORM_EPS);
    const float max_scale = logf(100.0f);
    float ls = 0;
    be->ops->to_host(be, &ls, net->logit_scale.w, sizeof ls);
    a->clamped = ls > max_scale;
    a->scale = a->clamped ? max_scale : ls;
    float itc = be->ops->infonce_fwd(be, a->sim, a->p_i2t, a->p_t2i, a->img_emb, a->txt_emb,
                                     a->scale, B, E);

    /* ITM pairs: mined on the host from a copy of the similarities. */
    for (int t = 0; t < B; t++) {
        a->pair_img[t] = t;
        a->pair_txt[t] = t;
        a->host_labels[t] = 1.0f;
    }
    if (B > 1) {
        be->ops->to_host(be, a->host_sim, a->sim, (size_t)B * B * sizeof(float));
        mine_hard_negatives(a->neg, a->host_sim, B);
        for (int t = 0; t < B; t++) {
            a->pair_img[B + t] = a->neg[t];
            a->pair_txt[B + t] = t;
            a->host_labels[B + t] = 0.0f;
        }
    }
    be->ops->to_device(be, a->labels, a->host_labels, (size_t)P * sizeof(float));
    for (int p = 0; p < P; p++) {
        be->ops->copy(be, a->stream[0] + (size_t)p * Tq * D, a->cls + (size_t)a->pair_txt[p] * D,
                      (size_t)Tq * D * sizeof(float));
    }
    for (int l = 0; l < net->L; l++) {
        fusion_layer_acts *la = &a->layer[l];
        mmp_tf_cross_attn_fwd(&net->layers[l].attn, &la->attn, la->mid, a->stream[l], P, Tq, a->img,
                              B, Ni, a->pair_img);
        mmp_tf_ffn_fwd(&net->layers[l].ffn, &la->ffn, a->stream[l + 1], la->mid, P * Tq);
    }
    /* Head on row 0 of each pair (Tq == 1: the stream is already (P,D)). */
    be->ops->layernorm_fwd(be, a->head_ln, a->head_mean, a->head_rstd, a->stream[net->L],
                           net->itm_ln.w.w, net->itm_ln.b.w, P, D, MMP_TF_LN_EPS);
    mmp_lowp_linear_fwd(&net->lp, a->logits, a->head_ln, net->itm_head.w.w, net->itm_head.b.w, P, D,
                        1);
    float itm = be->ops->bce_fwd(be, a->logits, a->labels, P);

    parts->itc = itc;
    parts->itm = itm;
    parts->loss = itc + itm;
}

void mmp_fusion_net_backward(mmp_fusion_net *net, mmp_fusion_acts *acts, float weight, float *dimg,
                             float *dtxt)
{
    MMP_ASSERT(acts->net == net && acts->B > 0);
    mmp_fusion_acts *a = acts;
    mmp_backend *be = net->be;
    const int B = a->B, P = a->P, D = net->D, E = net->E, Ni = net->Ni, Tq = ITM_QUERY_ROWS;
    const size_t pd = (size_t)P * D;

    /* ITM: head, then the cross-attention layers top-down. */
    be->ops->zero(be, a->dlogits, (size_t)P * sizeof(float));
    be->ops->zero(be, a->dhead_ln, pd * sizeof(float));
    be->ops->zero(be, a->dx, pd * Tq * sizeof(float));
    be->ops->bce_bwd(be, a->dlogits, a->logits, a->labels, weight, P);
    mmp_lowp_linear_bwd(&net->lp, a->dhead_ln, net->itm_head.w.g, net->itm_head.b.g, a->dlogits,
                        a->head_ln, net->itm_head.w.w, P, D, 1);
    be->ops->layernorm_bwd(be, a->dx, net->itm_ln.w.g, net->itm_ln.b.g, a->dhead_ln,
                           a->stream[net->L], net->itm_ln.w.w, a->head_mean, a->head_rstd, P, D);
    for (int l = net->L - 1; l >= 0; l--) {
        fusion_layer_acts *la = &a->layer[l];
        mmp_tf_ffn_bwd(&net->layers[l].ffn, &la->ffn, &a->scratch, a->dx, a->dx, la->mid, P * Tq);
        mmp_tf_cross_attn_bwd(&net->layers[l].attn, &la->attn, &a->scratch, a->dx, dimg, a->dx,
                              a->stream[l], P, Tq, a->img, B, Ni, a->pair_img);
    }
    /* Each pair's text gradient back to its [CLS] row, in pair order. */
    be->ops->zero(be, a->dcls, (size_t)B * D * sizeof(float));
    for (int p = 0; p < P; p++) {
        be->ops->add(be, a->dcls + (size_t)a->pair_txt[p] * D, a->dcls + (size_t)a->pair_txt[p] * D,
                     a->dx + (size_t)p * Tq * D, (size_t)D);
    }

    /* ITC */
    size_t bE = (size_t)B * E;
    be->ops->zero(be, a->d_img_emb, bE * sizeof(float));
    be->ops->zero(be, a->d_txt_emb, bE * sizeof(float));
    be->ops->zero(be, a->d_img_proj, bE * sizeof(float));
    be->ops->zero(be, a->d_txt_proj, bE * sizeof(float));
    /* The kernel adds its one dscale into the parameter's gradient: the same
     * float sum as adding it from a zeroed temporary. A clamped scale gets none. */
    be->ops->infonce_bwd(be, a->d_img_emb, a->d_txt_emb, a->clamped ? NULL : net->logit_scale.g,
                         a->sim, a->p_i2t, a->p_t2i, a->img_emb, a->txt_emb, a->scale, weight, B,
                         E);
    be->ops->l2norm_bwd(be, a->d_img_proj, a->d_img_emb, a->img_emb, a->img_norm, B, E, L2NORM_EPS);
    be->ops->l2norm_bwd(be, a->d_txt_proj, a->d_txt_emb, a->txt_emb, a->txt_norm, B, E, L2NORM_EPS);
    mmp_lowp_linear_bwd(&net->lp, dimg, net->img_proj.w.g, net->img_proj.b.g, a->d_img_proj, a->img,
                        net->img_proj.w.w, B, Ni * D, E);
    mmp_lowp_linear_bwd(&net->lp, a->dcls, net->txt_proj.w.g, net->txt_proj.b.g, a->d_txt_proj,
                        a->cls, net->txt_proj.w.w, B, D, E);
    if (dtxt) {
        for (int b = 0; b < B; b++) {
            float *row = dtxt + (size_t)b * net->T * D;
            be->ops->add(be, row, row, a->dcls + (size_t)b * D, (size_t)D);
        }
    }
}

void mmp_fusion_net_embed(mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                          const float *txt, const float *mask, int B, float *img_emb,
                          float *txt_emb)
{
    (void)mask;
    MMP_ASSERT(acts->net == net && B >= 0);
    mmp_backend *be = net->be;
    const int D = net->D, E = net->E, Ni = net->Ni, T = net->T;
    /* Rows are independent, so any B runs in chunks of the acts' max_batch:
     * retrieval over 256 samples needs no acts (and no ITM buffers) sized 256. */
    for (int b0 = 0; b0 < B; b0 += acts->max_batch) {
        int n = B - b0 < acts->max_batch ? B - b0 : acts->max_batch;
        mmp_lowp_linear_fwd(&net->lp, acts->emb_proj, img + (size_t)b0 * Ni * D, net->img_proj.w.w,
                            net->img_proj.b.w, n, Ni * D, E);
        be->ops->l2norm_fwd(be, img_emb + (size_t)b0 * E, acts->emb_norm, acts->emb_proj, n, E,
                            L2NORM_EPS);
        gather_cls(be, acts->emb_cls, txt + (size_t)b0 * T * D, n, T, D);
        mmp_lowp_linear_fwd(&net->lp, acts->emb_proj, acts->emb_cls, net->txt_proj.w.w,
                            net->txt_proj.b.w, n, D, E);
        be->ops->l2norm_fwd(be, txt_emb + (size_t)b0 * E, acts->emb_norm, acts->emb_proj, n, E,
                            L2NORM_EPS);
    }
}

void mmp_fusion_net_defer(mmp_fusion_net *net, mmp_wgrad *wg)
{
    net->lp.defer = wg;
}

mmp_err mmp_fusion_net_backward_weights(mmp_fusion_net *net, mmp_wgrad *wg)
{
    return mmp_wgrad_run(wg, &net->lp, &net->params);
}
