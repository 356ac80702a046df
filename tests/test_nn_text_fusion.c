/* The text branch and the fusion/loss stage: gradients against central finite
 * differences, layer-range cuts bitwise equal to the whole, deterministic
 * per-seed initialisation, the text mask, the hard-negative ITM pairs and the
 * retrieval embeddings. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "nn/model.h"
#include "nn/wgrad.h"
#include "stages/fuse.h"
#include "tests/harness.h"

/* Finite differences run the float32 forward at x +- h and x +- 2h and use
 * the fourth-order stencil (8 (f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))) / 12h,
 * whose truncation error is ~h^4/30 f^(5) instead of a central difference's
 * ~h^2/6 f^(3).
 *  - text, h = 1e-2: O(1) curvature, truncation negligible; noise: a loss of
 *    magnitude ~10 in float (relative rounding ~1e-6) gives ~1e-5 per
 *    evaluation, times 18/12h = 150: ~1.5e-3 at worst (seen: 5e-4).
 *  - fusion, h = 2.5e-3: the ITC logits are scaled by exp(logit_scale) ~ 14
 *    and an L2 norm of a short projection amplifies curvature further; at
 *    h = 1e-2 a few entries are off by ~8% from truncation, at 2.5e-3 the
 *    stencil has converged (halving h changes it by < 1e-3). Noise: loss ~3,
 *    ~3e-6 per evaluation times 18/12h = 600: ~2e-3 (seen: 1.9e-3).
 * So an entry passes with |g - fd| <= 5e-3 + 1e-2 |fd|: above that noise,
 * orders below the error of a wrong term (a missing residual, a swapped
 * weight or bias, a dropped 1/n are O(|g|) ~ 0.1-10 here). */
#define TEXT_FD_H 1e-2f
#define FUSION_FD_H 2.5e-3f
#define FD_ATOL 5e-3
#define FD_RTOL 1e-2

static double max_fd_abs, max_fd_rel;

static void note_error(const float *got, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (d > max_fd_abs) {
            max_fd_abs = d;
        }
        if (fabs(ref[i]) > 1e-2 && d / fabs(ref[i]) > max_fd_rel) {
            max_fd_rel = d / fabs(ref[i]);
        }
    }
}

static void plan_tiny(mmp_plan *p)
{
    /* 8 -> 4 -> 2 over three stages: Ni = 4 */
    mmp_test_small_plan(
        p, (mmp_test_net_dims){.image_size = 8, .n_stages = 3, .text_layers = 2, .ffn_mult = 4});
}

typedef double (*loss_fn)(void *ctx);

static double eval_at(float *x, float v, loss_fn f, void *ctx)
{
    *x = v;
    return f(ctx);
}

/* Fourth-order central difference of f with respect to *x, step h. */
static double finite_diff(float *x, float step, loss_fn f, void *ctx)
{
    float old = *x;
    float p1 = old + step, m1 = old - step, p2 = old + 2 * step, m2 = old - 2 * step;
    double d1 = eval_at(x, p1, f, ctx) - eval_at(x, m1, f, ctx);
    double d2 = eval_at(x, p2, f, ctx) - eval_at(x, m2, f, ctx);
    *x = old;
    double h = ((double)p1 - (double)m1) / 2;
    return (8 * d1 - d2) / (12 * h);
}

/* Moves every parameter (but skip) by U(-a, a): O(1) embeddings instead of
 * N(0, 0.02) keep the LayerNorm after them in a regime finite differences can
 * resolve, and nonzero biases and non-unit LayerNorm weights let the check
 * see a bias or a norm wired to the wrong tensor. */
static void jitter_params(mmp_params *p, float a, const char *skip, unsigned long long seed)
{
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        if (skip && strcmp(q->name, skip) == 0) {
            continue;
        }
        float *u = malloc(q->n * sizeof *u);
        mmp_test_fill(u, q->n, -a, a, seed + (unsigned long long)i);
        for (size_t k = 0; k < q->n; k++) {
            q->w[k] += u[k];
        }
        free(u);
    }
}

/* Compares every entry of grad (n) with finite differences over x (n). */
static void check_fd(const char *label, float *x, const float *grad, size_t n, float step,
                     loss_fn f, void *ctx)
{
    float *fd = malloc(n * sizeof *fd);
    for (size_t i = 0; i < n; i++) {
        fd[i] = (float)finite_diff(&x[i], step, f, ctx);
    }
    note_error(grad, fd, n);
    CHECK_CLOSE(label, grad, fd, n, FD_ATOL, FD_RTOL);
    free(fd);
}

/* Every parameter tensor reaches the loss: a gradient check cannot see a
 * parameter wired to the wrong tensor consistently in forward and backward
 * (the model is then just another differentiable function), but the orphan
 * is left with an all-zero gradient. A key bias adds q.b_k to every logit of
 * a query, which softmax ignores, so its gradient is zero up to rounding. */
static void check_all_reached(const char *what, const mmp_params *p, const float *grads,
                              const char *exempt)
{
    for (int i = 0; i < p->count; i++) {
        const mmp_param *q = &p->items[i];
        size_t len = strlen(q->name);
        if (len >= 11 && strcmp(q->name + len - 11, "attn.k.bias") == 0) {
            continue;
        }
        if (exempt && strcmp(q->name, exempt) == 0) {
            continue;
        }
        float m = 0;
        for (size_t k = 0; k < q->n; k++) {
            m = fmaxf(m, fabsf(grads[q->offset + k]));
        }
        CHECK(m > 1e-4f);
        if (!(m > 1e-4f)) {
            fprintf(stderr, "  %s: %s has no gradient\n", what, q->name);
        }
    }
}

/* ---- text branch ---------------------------------------------------------- */
enum { TB = 3, TT = 5, TV = 11, TD = 8 };

typedef struct text_case {
    mmp_text_net *net;
    mmp_text_acts *acts;
    int32_t ids[TB * TT];
    float mask[TB * TT];
    float in[TB * TT * TD]; /* input when the range starts past the embedding */
    float R[TB * TT * TD];  /* loss = sum(out * R) */
    float out[TB * TT * TD];
} text_case;

static void text_inputs(text_case *c)
{
    mmp_rng r;
    mmp_rng_seed(&r, 7, 1);
    for (int i = 0; i < TB * TT; i++) {
        c->ids[i] = (int32_t)mmp_rng_below(&r, TV);
        c->mask[i] = 1.0f;
    }
    /* sample 1 pads its last token, sample 2 its last two */
    c->mask[1 * TT + 4] = 0.0f;
    c->mask[2 * TT + 3] = 0.0f;
    c->mask[2 * TT + 4] = 0.0f;
    mmp_test_fill(c->in, TB * TT * TD, -1.0f, 1.0f, 11);
    mmp_test_fill(c->R, TB * TT * TD, -1.0f, 1.0f, 12);
}

static double text_loss(void *ctx)
{
    text_case *c = ctx;
    mmp_text_net_forward(c->net, c->acts, c->ids, c->in, c->mask, TB, c->out);
    double s = 0;
    for (int i = 0; i < TB * TT * TD; i++) {
        s += (double)c->out[i] * c->R[i];
    }
    return s;
}

static mmp_err text_create(text_case *c, const mmp_plan *plan, int first, int last, uint64_t seed)
{
    MMP_TRY(mmp_text_net_create(&c->net, plan, TV, first, last, seed));
    return mmp_text_acts_create(&c->acts, c->net, TB);
}

static void text_free(text_case *c)
{
    mmp_text_acts_destroy(c->acts);
    mmp_text_net_destroy(c->net);
    c->acts = NULL;
    c->net = NULL;
}

/* Every parameter of the range, and the input gradient when first > 0. */
static void text_gradcheck(const mmp_plan *plan, int first, int last)
{
    text_case *c = calloc(1, sizeof *c);
    text_inputs(c);
    CHECK_OK(text_create(c, plan, first, last, 3));
    if (!c->net) {
        free(c);
        return;
    }
    mmp_params *p = mmp_text_net_params(c->net);
    jitter_params(p, 0.5f, NULL, 100);
    mmp_params_zero_grad(p);
    float din[TB * TT * TD] = {0};
    text_loss(c);
    mmp_text_net_backward(c->net, c->acts, c->R, TB, din);
    float *grads = malloc(p->total * sizeof *grads);
    memcpy(grads, p->grads, p->total * sizeof *grads);
    char label[160];
    snprintf(label, sizeof label, "text[%d,%d)", first, last);
    check_all_reached(label, p, grads, NULL);
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        snprintf(label, sizeof label, "text[%d,%d) %s", first, last, q->name);
        check_fd(label, q->w, grads + q->offset, q->n, TEXT_FD_H, text_loss, c);
    }
    if (first > 0) {
        snprintf(label, sizeof label, "text[%d,%d) din", first, last);
        check_fd(label, c->in, din, TB * TT * TD, TEXT_FD_H, text_loss, c);
    } else {
        /* Layer 0's input is ids: din is never written. */
        float zero[TB * TT * TD] = {0};
        CHECK(memcmp(din, zero, sizeof zero) == 0);
    }
    free(grads);
    text_free(c);
    free(c);
}

static void test_text_names(const mmp_plan *plan)
{
    mmp_text_net *net = NULL;
    CHECK_OK(mmp_text_net_create(&net, plan, TV, 0, mmp_text_net_layers(plan), 1));
    if (!net) {
        return;
    }
    mmp_params *p = mmp_text_net_params(net);
    static const char *const names[] = {
        "text.embed.wte",
        "text.embed.wpe",
        "text.layer1.ln1.weight",
        "text.layer1.attn.q.weight",
        "text.layer1.attn.k.bias",
        "text.layer1.attn.v.weight",
        "text.layer1.attn.out.bias",
        "text.layer2.ln2.bias",
        "text.layer2.ffn.fc1.weight",
        "text.layer2.ffn.fc2.bias",
        "text.ln_f.weight",
        "text.ln_f.bias",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        mmp_param *q = mmp_params_find(p, names[i]);
        CHECK(q != NULL);
        if (!q) {
            fprintf(stderr, "  missing %s\n", names[i]);
        }
    }
    mmp_param *wte = mmp_params_find(p, "text.embed.wte");
    mmp_param *fc1 = mmp_params_find(p, "text.layer1.ffn.fc1.weight");
    mmp_param *b = mmp_params_find(p, "text.layer1.attn.q.bias");
    mmp_param *ln = mmp_params_find(p, "text.layer1.ln1.weight");
    if (wte && fc1 && b && ln) {
        CHECK(wte->shape[0] == TV && wte->shape[1] == TD && !wte->decay);
        CHECK(fc1->shape[0] == 4 * TD && fc1->shape[1] == TD && fc1->decay);
        CHECK(!b->decay && b->w[0] == 0.0f);
        CHECK(!ln->decay && ln->w[0] == 1.0f);
    }
    CHECK(mmp_text_net_layers(plan) == plan->model.text.layers + 2);
    CHECK(mmp_text_net_out_floats(net) == TT * TD);
    mmp_text_net_destroy(net);

    /* A bad range or width is an error, not a crash. */
    mmp_text_net *bad = NULL;
    CHECK(mmp_text_net_create(&bad, plan, TV, 2, 2, 1) == MMP_ERR_INVALID && !bad);
    CHECK(mmp_text_net_create(&bad, plan, TV, 0, 5, 1) == MMP_ERR_INVALID && !bad);
    mmp_plan odd = *plan;
    odd.model.text.heads = 3;
    CHECK(mmp_text_net_create(&bad, &odd, TV, 0, 4, 1) == MMP_ERR_INVALID && !bad);
}

/* Runs the cut points [0,c1), [c1,c2), ... and compares outputs and every
 * parameter gradient, by name, bitwise with the whole network. */
static void text_split(const mmp_plan *plan, const int *cuts, int n_cuts)
{
    const int L = mmp_text_net_layers(plan);
    text_case *whole = calloc(1, sizeof *whole);
    text_inputs(whole);
    CHECK_OK(text_create(whole, plan, 0, L, 5));
    if (!whole->net) {
        free(whole);
        return;
    }
    mmp_params_zero_grad(mmp_text_net_params(whole->net));
    text_loss(whole);
    mmp_text_net_backward(whole->net, whole->acts, whole->R, TB, NULL);

    int bounds[8];
    int n = 0;
    bounds[n++] = 0;
    for (int i = 0; i < n_cuts; i++) {
        bounds[n++] = cuts[i];
    }
    bounds[n++] = L;
    int parts = n - 1;
    mmp_text_net *net[8] = {0};
    mmp_text_acts *acts[8] = {0};
    float act[8][TB * TT * TD];
    for (int s = 0; s < parts; s++) {
        CHECK_OK(mmp_text_net_create(&net[s], plan, TV, bounds[s], bounds[s + 1], 5));
        CHECK_OK(mmp_text_acts_create(&acts[s], net[s], TB));
        if (!net[s] || !acts[s]) {
            goto out;
        }
        mmp_params_zero_grad(mmp_text_net_params(net[s]));
    }
    for (int s = 0; s < parts; s++) {
        mmp_text_net_forward(net[s], acts[s], whole->ids, s ? act[s - 1] : NULL, whole->mask, TB,
                             act[s]);
    }
    CHECK(memcmp(act[parts - 1], whole->out, sizeof act[0]) == 0);
    float grad[2][TB * TT * TD];
    memcpy(grad[0], whole->R, sizeof grad[0]);
    for (int s = parts - 1; s >= 0; s--) {
        float *dout = grad[(parts - 1 - s) % 2], *din = grad[(parts - s) % 2];
        memset(din, 0, sizeof grad[0]);
        mmp_text_net_backward(net[s], acts[s], dout, TB, s ? din : NULL);
    }
    mmp_params *pw = mmp_text_net_params(whole->net);
    int seen = 0;
    for (int s = 0; s < parts; s++) {
        mmp_params *ps = mmp_text_net_params(net[s]);
        for (int i = 0; i < ps->count; i++) {
            mmp_param *q = &ps->items[i], *w = mmp_params_find(pw, q->name);
            CHECK(w != NULL);
            if (!w) {
                continue;
            }
            int same_w = memcmp(q->w, w->w, q->n * sizeof(float)) == 0;
            int same_g = memcmp(q->g, w->g, q->n * sizeof(float)) == 0;
            CHECK(same_w && same_g);
            if (!same_w || !same_g) {
                fprintf(stderr, "  cut differs at %s (values %d grads %d)\n", q->name, same_w,
                        same_g);
            }
            seen++;
        }
    }
    CHECK(seen == pw->count);
out:
    for (int s = 0; s < parts; s++) {
        mmp_text_acts_destroy(acts[s]);
        mmp_text_net_destroy(net[s]);
    }
    text_free(whole);
    free(whole);
}

static void test_text_init_and_mask(const mmp_plan *plan)
{
    const int L = mmp_text_net_layers(plan);
    mmp_text_net *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(mmp_text_net_create(&a, plan, TV, 0, L, 42));
    CHECK_OK(mmp_text_net_create(&b, plan, TV, 0, L, 42));
    CHECK_OK(mmp_text_net_create(&c, plan, TV, 0, L, 43));
    if (a && b && c) {
        mmp_params *pa = mmp_text_net_params(a), *pb = mmp_text_net_params(b),
                   *pc = mmp_text_net_params(c);
        CHECK(pa->total == pb->total && pa->total == pc->total);
        CHECK(memcmp(pa->values, pb->values, pa->total * sizeof(float)) == 0);
        CHECK(memcmp(pa->values, pc->values, pa->total * sizeof(float)) != 0);
    }
    mmp_text_net_destroy(b);
    mmp_text_net_destroy(c);
    if (!a) {
        return;
    }

    /* Padded tokens are keys nobody attends to: changing their ids leaves every
     * unpadded position's output bitwise unchanged. */
    text_case *t = calloc(1, sizeof *t);
    text_inputs(t);
    t->net = a;
    CHECK_OK(mmp_text_acts_create(&t->acts, a, TB));
    if (t->acts) {
        float ref[TB * TT * TD];
        text_loss(t);
        memcpy(ref, t->out, sizeof ref);
        int changed_padded = 0;
        for (int i = 0; i < TB * TT; i++) {
            if (t->mask[i] == 0.0f) {
                t->ids[i] = (t->ids[i] + 5) % TV;
            }
        }
        text_loss(t);
        for (int i = 0; i < TB * TT; i++) {
            int same = memcmp(&t->out[i * TD], &ref[i * TD], TD * sizeof(float)) == 0;
            if (t->mask[i] != 0.0f) {
                CHECK(same);
            } else if (!same) {
                changed_padded = 1;
            }
        }
        CHECK(changed_padded); /* the change did reach the network */
    }
    text_free(t);
    free(t);
}

/* ---- fusion --------------------------------------------------------------- */
enum { FB = 4, FNI = 4, FT = 5, FD = 8 };

typedef struct fusion_case {
    mmp_fusion_net *net;
    mmp_fusion_acts *acts;
    int B;
    float weight;
    float img[FB * FNI * FD];
    float txt[FB * FT * FD];
    float mask[FB * FT];
    mmp_loss_parts parts;
} fusion_case;

static double fusion_loss(void *ctx)
{
    fusion_case *c = ctx;
    mmp_fusion_net_forward(c->net, c->acts, c->img, c->txt, c->mask, c->B, &c->parts);
    return (double)c->weight * c->parts.loss;
}

/* The hard negatives as the stage mines them, recomputed from the retrieval
 * embeddings (the same vectors ITC compares). margin: the smallest gap
 * between a text's most and second most similar other image. */
static void hard_negatives(fusion_case *c, int *neg, float *margin)
{
    float ie[FB * FD], te[FB * FD];
    mmp_fusion_net_embed(c->net, c->acts, c->img, c->txt, c->mask, c->B, ie, te);
    *margin = INFINITY;
    for (int t = 0; t < FB; t++) {
        neg[t] = -1;
    }
    for (int t = 0; t < c->B; t++) {
        float s[FB];
        int best = -1;
        for (int j = 0; j < c->B; j++) {
            s[j] = 0;
            for (int e = 0; e < FD; e++) {
                s[j] += ie[j * FD + e] * te[t * FD + e];
            }
            if (j != t && (best < 0 || s[j] > s[best])) {
                best = j;
            }
        }
        for (int j = 0; j < c->B && best >= 0; j++) {
            if (j != t && j != best && s[best] - s[j] < *margin) {
                *margin = s[best] - s[j];
            }
        }
        neg[t] = best;
    }
}

/* Finite differences that skip entries whose +-2h flips a hard negative
 * (the ITM loss jumps there: no derivative to compare). */
static int fusion_fd_skipped, fusion_fd_total;

static void fusion_check(const char *label, fusion_case *c, float *x, const float *grad, size_t n)
{
    float *got = malloc(n * sizeof *got), *ref = malloc(n * sizeof *ref);
    size_t m = 0;
    int neg0[FB], negp[FB], negm[FB];
    float margin;
    hard_negatives(c, neg0, &margin);
    for (size_t i = 0; i < n; i++) {
        float old = x[i];
        x[i] = old + 2 * FUSION_FD_H;
        hard_negatives(c, negp, &margin);
        x[i] = old - 2 * FUSION_FD_H;
        hard_negatives(c, negm, &margin);
        x[i] = old;
        fusion_fd_total++;
        if (memcmp(neg0, negp, sizeof neg0) || memcmp(neg0, negm, sizeof neg0)) {
            fusion_fd_skipped++;
            continue;
        }
        got[m] = grad[i];
        ref[m] = (float)finite_diff(&x[i], FUSION_FD_H, fusion_loss, c);
        m++;
    }
    note_error(got, ref, m);
    CHECK_CLOSE(label, got, ref, m, FD_ATOL, FD_RTOL);
    free(got);
    free(ref);
}

static void fusion_inputs(fusion_case *c, unsigned long long seed)
{
    mmp_test_fill(c->img, sizeof c->img / sizeof(float), -1.0f, 1.0f, seed);
    mmp_test_fill(c->txt, sizeof c->txt / sizeof(float), -1.0f, 1.0f, seed + 1);
    for (int i = 0; i < FB * FT; i++) {
        c->mask[i] = (i % FT) < FT - 1 || (i / FT) % 2 == 0 ? 1.0f : 0.0f;
    }
}

/* A fusion case on plan: the net (seed 9) and acts for FB samples, inputs
 * from seed (none for 0: the caller fills them), B samples weighted weight.
 * The caller checks c->net and c->acts. */
static fusion_case *fusion_case_new(const mmp_plan *plan, unsigned long long seed, int B,
                                    float weight)
{
    fusion_case *c = calloc(1, sizeof *c);
    if (seed) {
        fusion_inputs(c, seed);
    }
    c->B = B;
    c->weight = weight;
    CHECK_OK(mmp_fusion_net_create(&c->net, plan, 9));
    CHECK_OK(mmp_fusion_acts_create(&c->acts, c->net, FB));
    return c;
}

static void fusion_case_free(fusion_case *c)
{
    mmp_fusion_acts_destroy(c->acts);
    mmp_fusion_net_destroy(c->net);
    free(c);
}

static void fusion_gradcheck(const mmp_plan *plan, int B, float logit_scale)
{
    fusion_case *c = fusion_case_new(plan, 0, B, 0.7f);
    if (!c->net || !c->acts) {
        goto out;
    }
    mmp_params *p = mmp_fusion_net_params(c->net);
    mmp_param *ls = mmp_params_find(p, "fusion.logit_scale");
    CHECK(ls != NULL);
    if (!ls) {
        goto out;
    }
    jitter_params(p, 0.25f, "fusion.logit_scale", 200);
    if (logit_scale != 0) {
        ls->w[0] = logit_scale;
    }
    /* Inputs whose hard negatives win by a clear margin, so that few finite
     * differences flip one (those that do are skipped, and counted). */
    float margin = 0;
    int neg[FB];
    for (unsigned long long seed = 21; seed < 21 + 2 * 1000 && margin < 0.2f; seed += 2) {
        fusion_inputs(c, seed);
        hard_negatives(c, neg, &margin);
    }
    CHECK(margin >= 0.2f);
    mmp_params_zero_grad(p);
    float dimg[FB * FNI * FD] = {0}, dtxt[FB * FT * FD] = {0};
    fusion_loss(c);
    CHECK(isfinite(c->parts.itc) && isfinite(c->parts.itm));
    CHECK(c->parts.loss == c->parts.itc + c->parts.itm);
    mmp_fusion_net_backward(c->net, c->acts, c->weight, dimg, dtxt);

    float *grads = malloc(p->total * sizeof *grads);
    memcpy(grads, p->grads, p->total * sizeof *grads);
    char label[160];
    if (B > 1) { /* with one sample InfoNCE is constant: no ITC gradients */
        snprintf(label, sizeof label, "fusion B=%d", B);
        check_all_reached(label, p, grads, logit_scale > logf(100.0f) ? ls->name : NULL);
    }
    for (int i = 0; i < p->count; i++) {
        mmp_param *q = &p->items[i];
        snprintf(label, sizeof label, "fusion B=%d %s", B, q->name);
        fusion_check(label, c, q->w, grads + q->offset, q->n);
    }
    snprintf(label, sizeof label, "fusion B=%d dimg", B);
    fusion_check(label, c, c->img, dimg, (size_t)B * FNI * FD);
    snprintf(label, sizeof label, "fusion B=%d dtxt", B);
    fusion_check(label, c, c->txt, dtxt, (size_t)B * FT * FD);
    /* Only the [CLS] row reaches either loss. */
    int rest_zero = 1;
    for (int b = 0; b < B; b++) {
        for (int i = FD; i < FT * FD; i++) {
            rest_zero &= dtxt[b * FT * FD + i] == 0.0f;
        }
    }
    CHECK(rest_zero);
    if (logit_scale > logf(100.0f)) {
        /* Clamped: the scale in use is ln 100, whatever the parameter. */
        CHECK(grads[ls->offset] == 0.0f);
    } else if (B > 1) {
        CHECK(grads[ls->offset] != 0.0f);
    }
    free(grads);
out:
    fusion_case_free(c);
}

static void test_fusion_misc(const mmp_plan *plan)
{
    fusion_case *c = fusion_case_new(plan, 31, FB, 1.0f);
    mmp_fusion_acts *small = NULL;
    if (!c->net || !c->acts) {
        goto out;
    }
    mmp_params *p = mmp_fusion_net_params(c->net);
    static const char *const names[] = {
        "fusion.itc.img_proj.weight",  "fusion.itc.txt_proj.bias",
        "fusion.logit_scale",          "fusion.layer0.ln1.weight",
        "fusion.layer0.ln_kv.bias",    "fusion.layer0.attn.q.weight",
        "fusion.layer0.attn.out.bias", "fusion.layer0.ffn.fc2.weight",
        "fusion.itm_ln.weight",        "fusion.itm_head.weight",
        "fusion.itm_head.bias",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(mmp_params_find(p, names[i]) != NULL);
    }
    mmp_param *ip = mmp_params_find(p, "fusion.itc.img_proj.weight");
    mmp_param *ls = mmp_params_find(p, "fusion.logit_scale");
    if (ip && ls) {
        CHECK(ip->shape[0] == FD && ip->shape[1] == FNI * FD);
        CHECK(fabsf(ls->w[0] - logf(1.0f / 0.07f)) < 1e-6f && !ls->decay);
    }
    CHECK(mmp_fusion_embed_dim(c->net) == FD);

    /* Deterministic: the same micro-batch twice gives bitwise the same
     * gradients (shared images sum their pairs' gradients in a fixed order). */
    float dimg[2][FB * FNI * FD] = {{0}}, dtxt[2][FB * FT * FD] = {{0}};
    float *g0 = malloc(p->total * sizeof *g0);
    for (int r = 0; r < 2; r++) {
        mmp_params_zero_grad(p);
        fusion_loss(c);
        mmp_fusion_net_backward(c->net, c->acts, 1.0f, dimg[r], dtxt[r]);
        if (r == 0) {
            memcpy(g0, p->grads, p->total * sizeof *g0);
        }
    }
    CHECK(memcmp(g0, p->grads, p->total * sizeof *g0) == 0);
    CHECK(memcmp(dimg[0], dimg[1], sizeof dimg[0]) == 0);
    CHECK(memcmp(dtxt[0], dtxt[1], sizeof dtxt[0]) == 0);
    free(g0);

    /* Micro-batch accumulation: backward adds. */
    float twice[FB * FNI * FD];
    memcpy(twice, dimg[1], sizeof twice);
    fusion_loss(c);
    mmp_fusion_net_backward(c->net, c->acts, 1.0f, twice, NULL);
    for (int i = 0; i < FB * FNI * FD; i++) {
        twice[i] -= dimg[0][i];
    }
    CHECK_CLOSE("dimg accumulates", twice, dimg[0], FB * FNI * FD, 1e-6, 1e-5);

    /* Retrieval embeddings: unit vectors, the same whether computed in one go
     * or in chunks of a smaller acts' max_batch, and any number of them. */
    enum { NE = 10 };
    float *img = malloc(NE * FNI * FD * sizeof *img), *txt = malloc(NE * FT * FD * sizeof *txt);
    float ie[2][NE * FD], te[2][NE * FD];
    mmp_test_fill(img, NE * FNI * FD, -1, 1, 41);
    mmp_test_fill(txt, NE * FT * FD, -1, 1, 42);
    mmp_fusion_acts *big = NULL;
    CHECK_OK(mmp_fusion_acts_create(&big, c->net, NE));
    CHECK_OK(mmp_fusion_acts_create(&small, c->net, 3));
    if (big && small) {
        mmp_fusion_net_embed(c->net, big, img, txt, NULL, NE, ie[0], te[0]);
        mmp_fusion_net_embed(c->net, small, img, txt, NULL, NE, ie[1], te[1]);
        CHECK_CLOSE("img_emb chunked", ie[1], ie[0], NE * FD, 1e-6, 1e-5);
        CHECK_CLOSE("txt_emb chunked", te[1], te[0], NE * FD, 1e-6, 1e-5);
        for (int b = 0; b < NE; b++) {
            double ni = 0, nt = 0;
            for (int e = 0; e < FD; e++) {
                ni += (double)ie[0][b * FD + e] * ie[0][b * FD + e];
                nt += (double)te[0][b * FD + e] * te[0][b * FD + e];
            }
            CHECK(fabs(ni - 1) < 1e-5 && fabs(nt - 1) < 1e-5);
        }
    }
    mmp_fusion_acts_destroy(big);
    free(img);
    free(txt);

    /* Embedding between a forward and its backward does not disturb it. */
    mmp_params_zero_grad(p);
    float d3[FB * FNI * FD] = {0};
    fusion_loss(c);
    float e1[FB * FD], e2[FB * FD];
    mmp_fusion_net_embed(c->net, c->acts, c->img, c->txt, c->mask, FB, e1, e2);
    mmp_fusion_net_backward(c->net, c->acts, 1.0f, d3, NULL);
    CHECK(memcmp(d3, dimg[0], sizeof d3) == 0);

    /* Deterministic init per seed. */
    mmp_fusion_net *n2 = NULL, *n3 = NULL;
    CHECK_OK(mmp_fusion_net_create(&n2, plan, 9));
    CHECK_OK(mmp_fusion_net_create(&n3, plan, 10));
    if (n2 && n3) {
        mmp_params *p2 = mmp_fusion_net_params(n2), *p3 = mmp_fusion_net_params(n3);
        CHECK(memcmp(p->values, p2->values, p->total * sizeof(float)) == 0);
        CHECK(memcmp(p->values, p3->values, p->total * sizeof(float)) != 0);
    }
    mmp_fusion_net_destroy(n2);
    mmp_fusion_net_destroy(n3);

    /* Bad plans are errors. */
    mmp_plan bad = *plan;
    mmp_fusion_net *none = NULL;
    bad.model.fusion.heads = 3;
    CHECK(mmp_fusion_net_create(&none, &bad, 1) == MMP_ERR_INVALID && !none);
    bad = *plan;
    bad.train.init_temperature = 0;
    CHECK(mmp_fusion_net_create(&none, &bad, 1) == MMP_ERR_INVALID && !none);
out:
    mmp_fusion_acts_destroy(small);
    fusion_case_free(c);
}

/* The ITM pairs' count and labels, seen through the loss: with the head's
 * weight zeroed every logit is the head bias b, so B positives and B
 * negatives give BCE = (softplus(-b) + softplus(b)) / 2, and one sample (only
 * its positive) gives softplus(-b). */
static void test_fusion_pairs(const mmp_plan *plan)
{
    fusion_case *c = fusion_case_new(plan, 51, 0, 0.0f);
    if (c->net && c->acts) {
        mmp_params *p = mmp_fusion_net_params(c->net);
        mmp_param *w = mmp_params_find(p, "fusion.itm_head.weight");
        mmp_param *b = mmp_params_find(p, "fusion.itm_head.bias");
        if (w && b) {
            memset(w->w, 0, w->n * sizeof(float));
            b->w[0] = 0.5f;
            double sp = log1p(exp(-0.5)), sn = log1p(exp(0.5));
            c->B = FB;
            c->weight = 1;
            fusion_loss(c);
            CHECK(fabs(c->parts.itm - (sp + sn) / 2) < 1e-6);
            c->B = 1; /* one sample: only the positive pair */
            fusion_loss(c);
            CHECK(fabs(c->parts.itm - sp) < 1e-6);
            CHECK(fabs(c->parts.itc) < 1e-6); /* InfoNCE over one candidate */
        }
    }
    fusion_case_free(c);
}

/* The hard negatives are the most similar other images: the stage's ITM loss
 * equals one rebuilt from single-pair logits z(j,t) (a forward with B = 1 on
 * image j and text t has only the positive pair, loss softplus(-z)) and the
 * argmax pairing computed here from the retrieval embeddings. */
static double softplus(double x)
{
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

static void test_fusion_hard_negatives(const mmp_plan *plan)
{
    fusion_case *c = fusion_case_new(plan, 61, FB, 1.0f), *one = calloc(1, sizeof *one);
    if (!c->net || !c->acts) {
        goto out;
    }
    jitter_params(mmp_fusion_net_params(c->net), 0.25f, "fusion.logit_scale", 300);
    one->net = c->net;
    one->acts = c->acts;
    one->B = 1;
    one->weight = 1;
    double z[FB][FB]; /* z[j][t]: logit of the pair (image j, text t) */
    for (int j = 0; j < FB; j++) {
        for (int t = 0; t < FB; t++) {
            memcpy(one->img, c->img + j * FNI * FD, FNI * FD * sizeof(float));
            memcpy(one->txt, c->txt + t * FT * FD, FT * FD * sizeof(float));
            fusion_loss(one);
            z[j][t] = -log(expm1((double)one->parts.itm));
        }
    }
    int neg[FB];
    float margin;
    hard_negatives(c, neg, &margin);
    double want = 0, wrong = 0;
    for (int t = 0; t < FB; t++) {
        int other = t == 0 || neg[t] == 0 ? (t == 1 || neg[t] == 1 ? 2 : 1) : 0;
        if (other == t || other == neg[t]) {
            other = 3;
        }
        want += softplus(-z[t][t]) + softplus(z[neg[t]][t]);
        wrong += softplus(-z[t][t]) + softplus(z[other][t]); /* a wrong miner's pick */
    }
    want /= 2 * FB;
    wrong /= 2 * FB;
    fusion_loss(c);
    CHECK(fabs(c->parts.itm - want) < 1e-4 * (1 + want));
    CHECK(fabs(wrong - want) > 1e-3); /* the check can tell pairings apart */
    if (fabs(c->parts.itm - want) >= 1e-4 * (1 + want)) {
        fprintf(stderr, "  itm %.7f, rebuilt from argmax pairs %.7f\n", (double)c->parts.itm, want);
    }
out:
    fusion_case_free(c);
    free(one);
}

/* The fusion stage sizes its image projection with its own copy of the image
 * branch's token arithmetic (so it never needs an image net); both must agree
 * on every shape the plan can give. */
static void test_fusion_image_tokens(const mmp_plan *plan)
{
    static const int sizes[] = {8, 9, 17, 32, 33, 64};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int stages = 1; stages <= 4; stages++) {
            for (int pool = 0; pool <= 1; pool++) {
                mmp_plan q = *plan;
                q.data.image_size = sizes[i];
                q.model.image.n_stages = stages;
                q.model.image.stem_pool = pool;
                for (int s = 0; s < stages; s++) {
                    q.model.image.blocks[s] = 1;
                    q.model.image.channels[s] = 4 << s;
                }
                mmp_fusion_net *net = NULL;
                CHECK_OK(mmp_fusion_net_create(&net, &q, 1));
                if (!net) {
                    continue;
                }
                mmp_param *w =
                    mmp_params_find(mmp_fusion_net_params(net), "fusion.itc.img_proj.weight");
                int ni = w ? (int)(w->shape[1] / q.model.width) : -1;
                CHECK(ni == mmp_image_net_tokens(&q));
                if (ni != mmp_image_net_tokens(&q)) {
                    fprintf(stderr, "  size %d stages %d pool %d: fusion Ni %d, image %d\n",
                            sizes[i], stages, pool, ni, mmp_image_net_tokens(&q));
                }
                mmp_fusion_net_destroy(net);
            }
        }
    }
}

/* ---- zb-h1's split backward (nn/wgrad.h) --------------------------------------- */

/* Text (a range past the embedding, so with an input gradient) and fusion:
 * two micro-batches' B passes, then their W's, equal the fused backwards'
 * input gradients and gradient sums to the bit. */
static void test_split_backward(void)
{
    mmp_plan plan;
    plan_tiny(&plan);
    const int L = mmp_text_net_layers(&plan);
    mmp_wgrad wg[2];
    for (int k = 0; k < 2; k++) {
        mmp_wgrad_init(&wg[k], mmp_backend_cpu());
    }
    /* text */
    text_case *c[2][2] = {{NULL}}; /* [fused, split][mb]: one net per variant, acts per mb */
    for (int v = 0; v < 2; v++) {
        for (int mb = 0; mb < 2; mb++) {
            c[v][mb] = calloc(1, sizeof *c[v][mb]);
            text_inputs(c[v][mb]);
            mmp_test_fill(c[v][mb]->in, TB * TT * TD, -1.0f, 1.0f, 30 + (uint64_t)mb);
            mmp_test_fill(c[v][mb]->R, TB * TT * TD, -1.0f, 1.0f, 40 + (uint64_t)mb);
        }
        CHECK_OK(text_create(c[v][0], &plan, 1, L, 3));
        c[v][1]->net = c[v][0]->net;
        CHECK_OK(mmp_text_acts_create(&c[v][1]->acts, c[v][0]->net, TB));
    }
    float din[2][2][TB * TT * TD] = {{{0}}};
    for (int v = 0; v < 2 && c[0][1]->acts && c[1][1]->acts; v++) {
        mmp_params *p = mmp_text_net_params(c[v][0]->net);
        mmp_params_zero_grad(p);
        for (int mb = 0; mb < 2; mb++) {
            text_loss(c[v][mb]);
        }
        for (int mb = 0; mb < 2; mb++) {
            mmp_params_mb_begin(p);
            if (v) {
                mmp_text_net_backward_input(c[v][0]->net, c[v][mb]->acts, c[v][mb]->R, TB,
                                            din[v][mb], &wg[mb]);
            } else {
                mmp_text_net_backward(c[v][0]->net, c[v][mb]->acts, c[v][mb]->R, TB, din[v][mb]);
            }
            mmp_params_mb_end(p);
        }
        for (int mb = 0; v && mb < 2; mb++) {
            CHECK(mmp_wgrad_pending(&wg[mb]));
            CHECK_OK(mmp_text_net_backward_weights(c[v][0]->net, &wg[mb]));
        }
        mmp_params_grad_finish(p);
    }
    mmp_params *p0 = mmp_text_net_params(c[0][0]->net), *p1 = mmp_text_net_params(c[1][0]->net);
    CHECK(memcmp(din[0], din[1], sizeof din[0]) == 0);
    CHECK(memcmp(p0->grads, p1->grads, p0->total * sizeof(float)) == 0);
    CHECK(mmp_params_grad_sumsq(p1) > 0);
    for (int v = 0; v < 2; v++) {
        mmp_text_acts_destroy(c[v][1]->acts);
        text_free(c[v][0]);
        free(c[v][0]);
        free(c[v][1]);
    }

    /* fusion */
    fusion_case *f[2][2];
    float dimg[2][2][FB * FNI * FD] = {{{0}}}, dtxt[2][2][FB * FT * FD] = {{{0}}};
    for (int v = 0; v < 2; v++) {
        f[v][0] = fusion_case_new(&plan, 50, FB, 0.5f);
        f[v][1] = fusion_case_new(&plan, 60, FB, 0.5f);
        mmp_fusion_acts_destroy(f[v][1]->acts); /* its acts on mb 0's net */
        f[v][1]->acts = NULL;
        CHECK_OK(mmp_fusion_acts_create(&f[v][1]->acts, f[v][0]->net, FB));
    }
    for (int v = 0; v < 2; v++) {
        mmp_fusion_net *net = f[v][0]->net; /* both micro-batches on mb 0's net */
        mmp_params *p = mmp_fusion_net_params(net);
        mmp_params_zero_grad(p);
        for (int mb = 0; mb < 2; mb++) {
            mmp_fusion_net_forward(net, f[v][mb]->acts, f[v][mb]->img, f[v][mb]->txt,
                                   f[v][mb]->mask, FB, &f[v][mb]->parts);
        }
        for (int mb = 0; mb < 2; mb++) {
            mmp_params_mb_begin(p);
            mmp_fusion_net_defer(net, v ? &wg[mb] : NULL);
            mmp_fusion_net_backward(net, f[v][mb]->acts, 0.5f, dimg[v][mb], dtxt[v][mb]);
            mmp_fusion_net_defer(net, NULL);
            mmp_params_mb_end(p);
        }
        for (int mb = 0; v && mb < 2; mb++) {
            CHECK(mmp_wgrad_pending(&wg[mb]));
            CHECK_OK(mmp_fusion_net_backward_weights(net, &wg[mb]));
        }
        mmp_params_grad_finish(p);
    }
    mmp_params *q0 = mmp_fusion_net_params(f[0][0]->net), *q1 = mmp_fusion_net_params(f[1][0]->net);
    CHECK(memcmp(dimg[0], dimg[1], sizeof dimg[0]) == 0);
    CHECK(memcmp(dtxt[0], dtxt[1], sizeof dtxt[0]) == 0);
    CHECK(memcmp(q0->grads, q1->grads, q0->total * sizeof(float)) == 0);
    CHECK(mmp_params_grad_sumsq(q1) > 0);
    for (int v = 0; v < 2; v++) {
        fusion_case_free(f[v][1]); /* its acts first: they belong to mb 0's net */
        fusion_case_free(f[v][0]);
    }
    for (int k = 0; k < 2; k++) {
        mmp_wgrad_fini(&wg[k]);
    }
}

/* The same under the batch-wide loss (stages/fuse.h, mmp_fuse_step): the
 * fusion's backward of the whole batch with its weight gradients deferred
 * (mmp_fuse_step_run_input), then its weight pass (mmp_fuse_step_run_weights)
 * gives mmp_fuse_step_run's input gradients, loss and gradient sums to the
 * bit, in fp32 and bf16, with every row good and with a skipped one (the
 * gathered path), step after step; a replica whose gradients are not kept
 * drops the recorded pass and its sums stay as B left them. */
static void test_split_backward_batch(void)
{
    const size_t img_row = FNI * FD, txt_row = FT * FD;
    for (int prec = 0; prec < 2; prec++) {
        mmp_plan plan;
        plan_tiny(&plan);
        plan.train.precision = prec ? MMP_PREC_BF16 : MMP_PREC_FP32;
        mmp_fusion_net *net[2] = {NULL, NULL}; /* [fused, split] */
        mmp_fusion_acts *acts[2] = {NULL, NULL};
        mmp_fuse fuse[2];
        mmp_fuse_step fs[2];
        for (int v = 0; v < 2; v++) {
            CHECK_OK(mmp_fusion_net_create(&net[v], &plan, 9));
            CHECK_OK(mmp_fusion_acts_create(&acts[v], net[v], FB));
            CHECK_OK(mmp_fuse_init(&fuse[v], mmp_backend_cpu(), FB, img_row, FT, FD));
            CHECK_OK(mmp_fuse_step_init(&fs[v], mmp_backend_cpu(), FB, img_row, FT, FD));
        }
        float img[FB * FNI * FD], txt[FB * FT * FD], mask[FB * FT], valid[FB];
        mmp_params *p[2] = {mmp_fusion_net_params(net[0]), mmp_fusion_net_params(net[1])};
        for (int step = 0; step < 3 && acts[0] && acts[1]; step++) {
            mmp_test_fill(img, FB * FNI * FD, -1.0f, 1.0f, 70 + (uint64_t)step);
            mmp_test_fill(txt, FB * FT * FD, -1.0f, 1.0f, 80 + (uint64_t)step);
            for (int i = 0; i < FB * FT; i++) {
                mask[i] = (i % FT) < FT - 1 || (i / FT) % 2 == 0 ? 1.0f : 0.0f;
            }
            for (int i = 0; i < FB; i++) {
                valid[i] = step == 1 && i == 2 ? 0.0f : 1.0f; /* step 2: row 2 skipped */
            }
            mmp_loss_parts loss[2];
            int skipped[2] = {0, 0};
            for (int v = 0; v < 2; v++) {
                memset(&loss[v], 0, sizeof loss[v]);
                mmp_params_zero_grad(p[v]);
                mmp_fuse_step_begin(&fs[v], 0);
                for (int off = 0; off < FB; off += 2) { /* two micro-batches of 2 */
                    mmp_fuse_step_put(&fs[v], off, 2, img + off * img_row, txt + off * txt_row,
                                      mask + off * FT, valid + off, NULL);
                }
                mmp_params_mb_begin(p[v]);
                (v ? mmp_fuse_step_run_input : mmp_fuse_step_run)(&fs[v], &fuse[v], net[v], acts[v],
                                                                  1.0f, &loss[v], &skipped[v]);
                mmp_params_mb_end(p[v]);
                mmp_params_grad_finish(p[v]);
            }
            CHECK(skipped[0] == (step == 1) && skipped[1] == skipped[0]);
            CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0);
            CHECK(memcmp(fs[0].dimg, fs[1].dimg, FB * img_row * sizeof(float)) == 0);
            CHECK(memcmp(fs[0].dtxt, fs[1].dtxt, FB * txt_row * sizeof(float)) == 0);
            CHECK(!mmp_fuse_step_weights_pending(&fs[0]) && mmp_fuse_step_weights_pending(&fs[1]));
            /* the weight gradients are not there yet */
            CHECK(memcmp(p[0]->grads, p[1]->grads, p[0]->total * sizeof(float)) != 0);
            if (step == 2) {
                /* not kept: dropped, the sums untouched */
                float *before = malloc(p[1]->total * sizeof(float));
                memcpy(before, p[1]->grads, p[1]->total * sizeof(float));
                CHECK_OK(mmp_fuse_step_run_weights(&fs[1], net[1], 0));
                CHECK(!mmp_fuse_step_weights_pending(&fs[1]));
                mmp_params_grad_finish(p[1]);
                CHECK(memcmp(before, p[1]->grads, p[1]->total * sizeof(float)) == 0);
                free(before);
                continue;
            }
            CHECK_OK(mmp_fuse_step_run_weights(&fs[1], net[1], 1));
            CHECK(!mmp_fuse_step_weights_pending(&fs[1]));
            CHECK_OK(mmp_fuse_step_run_weights(&fs[1], net[1], 1)); /* nothing left: no-op */
            mmp_params_grad_finish(p[1]);
            CHECK(memcmp(p[0]->grads, p[1]->grads, p[0]->total * sizeof(float)) == 0);
            CHECK(mmp_params_grad_sumsq(p[1]) > 0);
        }
        for (int v = 0; v < 2; v++) {
            mmp_fuse_step_fini(&fs[v]);
            mmp_fuse_step_fini(&fs[v]); /* idempotent */
            mmp_fuse_fini(&fuse[v]);
            mmp_fusion_acts_destroy(acts[v]);
            mmp_fusion_net_destroy(net[v]);
        }
    }
}

static void test_text(void)
{
    mmp_plan plan;
    plan_tiny(&plan);
    const int L = mmp_text_net_layers(&plan); /* 4: embed, 2 layers, ln_f */

    test_text_names(&plan);
    text_gradcheck(&plan, 0, L);
    text_gradcheck(&plan, 1, L); /* input gradient through both layers and ln_f */
    text_gradcheck(&plan, 2, 3); /* one transformer layer alone */
    fprintf(stderr, "text FD: max |g-fd| %.3g, max rel %.3g (fd > 1e-2)\n", max_fd_abs, max_fd_rel);

    const int cuts_a[] = {1, 3}, cuts_b[] = {2}, cuts_c[] = {1, 2, 3};
    text_split(&plan, cuts_a, 2);
    text_split(&plan, cuts_b, 1);
    text_split(&plan, cuts_c, 3);
    test_text_init_and_mask(&plan);
}

static void test_fusion(void)
{
    mmp_plan plan;
    plan_tiny(&plan);
    max_fd_abs = max_fd_rel = 0;
    fusion_gradcheck(&plan, FB, 0);
    fusion_gradcheck(&plan, 1, 0);
    fusion_gradcheck(&plan, FB, 5.0f); /* logit_scale past ln 100: clamped, zero grad */
    fprintf(stderr,
            "fusion FD: max |g-fd| %.3g, max rel %.3g; %d of %d entries skipped "
            "(hard negative flips at +-2h)\n",
            max_fd_abs, max_fd_rel, fusion_fd_skipped, fusion_fd_total);
    /* Skips must stay rare or the check would check nothing. */
    CHECK(fusion_fd_skipped * 20 < fusion_fd_total);
}

/* Degenerate depths: embedding + ln_f only; the ITM head straight on [CLS]. */
static void test_shallow(void)
{
    mmp_plan shallow;
    plan_tiny(&shallow);
    shallow.model.text.layers = 0;
    shallow.model.fusion.layers = 0;
    text_gradcheck(&shallow, 0, mmp_text_net_layers(&shallow));
    fusion_gradcheck(&shallow, FB, 0);
}

static void test_fusion_behaviour(void)
{
    mmp_plan plan;
    plan_tiny(&plan);
    test_fusion_misc(&plan);
    test_fusion_pairs(&plan);
    test_fusion_hard_negatives(&plan);
    test_fusion_image_tokens(&plan);
}

MMP_TEST_LIST("nn_text_fusion", MMP_TEST_CASE(test_split_backward),
              MMP_TEST_CASE(test_split_backward_batch), MMP_TEST_CASE(test_text),
              MMP_TEST_CASE(test_fusion), MMP_TEST_CASE(test_shallow),
              MMP_TEST_CASE(test_fusion_behaviour))
