/* The backend seam (kernels/backend.h): nn/ computes and allocates only
 * through the backend it was created on.
 *
 * A counting backend forwards every entry of the CPU table and counts the
 * calls, and tracks allocations. The image, text and fusion networks run one
 * training step on it and on the default CPU backend: the results must be
 * bitwise the same, every op the network needs must have been called through
 * the table, and destroying the networks must give back every allocation.
 * Both tables (the CUDA one where it is built) must fill every entry. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "tests/harness.h"

/* Every op of the table, for the counters and the completeness check. */
/* An X-macro list, one op a line (clang-format would reflow it). */
// clang-format off
#define OPS(X) \
    X(alloc) \
    X(free) \
    X(zero) \
    X(to_device) \
    X(to_host) \
    X(copy) \
    X(sync) \
    X(round_lp) \
    X(pack_lp) \
    X(unpack_lp) \
    X(gemm) \
    X(linear_fwd) \
    X(linear_bwd) \
    X(conv2d_scratch_floats) \
    X(conv2d_fwd) \
    X(conv2d_bwd) \
    X(batchnorm_fwd_train) \
    X(batchnorm_fwd_infer) \
    X(batchnorm_bwd) \
    X(batchnorm_bwd_set) \
    X(relu_fwd) \
    X(relu_bwd) \
    X(relu_bwd_set) \
    X(gelu_fwd) \
    X(gelu_bwd) \
    X(add) \
    X(scale) \
    X(transpose) \
    X(acc_f64) \
    X(round_f64) \
    X(maxpool2d_fwd) \
    X(maxpool2d_bwd) \
    X(layernorm_fwd) \
    X(layernorm_bwd) \
    X(embedding_fwd) \
    X(embedding_bwd) \
    X(attention_fwd) \
    X(attention_bwd) \
    X(l2norm_fwd) \
    X(l2norm_bwd) \
    X(infonce_fwd) \
    X(infonce_bwd) \
    X(bce_fwd) \
    X(bce_bwd) \
    X(adamw) \
    X(sumsq)
// clang-format on

#define ENUM(op) K_##op,
enum { OPS(ENUM) K_COUNT };
#define NAME_OF(op) #op,
static const char *op_names[K_COUNT] = {OPS(NAME_OF)};

static long calls[K_COUNT];
static long live_allocs;

#define CPU (&mmp_backend_cpu_ops)
/* A void op: count, then forward to the CPU table. */
#define FWD(op, params, args)                                                                      \
    static void c_##op params                                                                      \
    {                                                                                              \
        calls[K_##op]++;                                                                           \
        CPU->op args;                                                                              \
    }

static mmp_err c_alloc(mmp_backend *be, void **out, size_t bytes)
{
    calls[K_alloc]++;
    mmp_err e = CPU->alloc(be, out, bytes);
    live_allocs += e == MMP_OK;
    return e;
}

static void c_free(mmp_backend *be, void *p)
{
    calls[K_free]++;
    live_allocs -= p != NULL;
    CPU->free(be, p);
}

static size_t c_conv2d_scratch_floats(const mmp_conv_shape *s)
{
    calls[K_conv2d_scratch_floats]++;
    return CPU->conv2d_scratch_floats(s);
}

static float c_infonce_fwd(mmp_backend *be, float *sim, float *p_i2t, float *p_t2i,
                           const float *img, const float *txt, float logit_scale, int B, int C)
{
    calls[K_infonce_fwd]++;
    return CPU->infonce_fwd(be, sim, p_i2t, p_t2i, img, txt, logit_scale, B, C);
}

static float c_bce_fwd(mmp_backend *be, const float *logits, const float *labels, int n)
{
    calls[K_bce_fwd]++;
    return CPU->bce_fwd(be, logits, labels, n);
}

FWD(sumsq, (mmp_backend * be, double *out, const float *const *x, const size_t *n, int count),
    (be, out, x, n, count))

FWD(zero, (mmp_backend * be, void *d, size_t n), (be, d, n))
FWD(to_device, (mmp_backend * be, void *d, const void *s, size_t n), (be, d, s, n))
FWD(to_host, (mmp_backend * be, void *d, const void *s, size_t n), (be, d, s, n))
FWD(copy, (mmp_backend * be, void *d, const void *s, size_t n), (be, d, s, n))
FWD(sync, (mmp_backend * be), (be))
FWD(round_lp, (mmp_backend * be, float *d, const float *s, size_t n, mmp_precision p),
    (be, d, s, n, p))
FWD(pack_lp, (mmp_backend * be, void *d, const float *s, size_t n, mmp_precision p),
    (be, d, s, n, p))
FWD(unpack_lp, (mmp_backend * be, float *d, const void *s, size_t n, mmp_precision p),
    (be, d, s, n, p))
FWD(gemm,
    (mmp_backend * be, int ta, int tb, int M, int N, int K, float al, const float *A, int lda,
     const float *Bm, int ldb, float bt, float *C, int ldc),
    (be, ta, tb, M, N, K, al, A, lda, Bm, ldb, bt, C, ldc))
FWD(linear_fwd,
    (mmp_backend * be, float *o, const float *i, const float *w, const float *b, int N, int C,
     int OC),
    (be, o, i, w, b, N, C, OC))
FWD(linear_bwd,
    (mmp_backend * be, float *di, float *dw, float *db, const float *d, const float *i,
     const float *w, int N, int C, int OC),
    (be, di, dw, db, d, i, w, N, C, OC))
FWD(conv2d_fwd,
    (mmp_backend * be, float *o, const float *i, const float *w, const float *b,
     const mmp_conv_shape *s, float *sc),
    (be, o, i, w, b, s, sc))
FWD(conv2d_bwd,
    (mmp_backend * be, float *di, float *dw, float *db, const float *d, const float *i,
     const float *w, const mmp_conv_shape *s, float *sc),
    (be, di, dw, db, d, i, w, s, sc))
FWD(batchnorm_fwd_train,
    (mmp_backend * be, float *o, float *m, float *r, float *rm, float *rv, const float *i,
     const float *g, const float *b, int N, int C, int HW, float eps, float mom),
    (be, o, m, r, rm, rv, i, g, b, N, C, HW, eps, mom))
FWD(batchnorm_fwd_infer,
    (mmp_backend * be, float *o, const float *i, const float *g, const float *b, const float *rm,
     const float *rv, int N, int C, int HW, float eps),
    (be, o, i, g, b, rm, rv, N, C, HW, eps))
FWD(batchnorm_bwd,
    (mmp_backend * be, float *di, float *dg, float *db, const float *d, const float *i,
     const float *m, const float *r, const float *g, int N, int C, int HW),
    (be, di, dg, db, d, i, m, r, g, N, C, HW))
FWD(batchnorm_bwd_set,
    (mmp_backend * be, float *di, float *dg, float *db, const float *d, const float *i,
     const float *m, const float *r, const float *g, int N, int C, int HW),
    (be, di, dg, db, d, i, m, r, g, N, C, HW))
FWD(relu_fwd, (mmp_backend * be, float *o, const float *i, size_t n), (be, o, i, n))
FWD(relu_bwd, (mmp_backend * be, float *di, const float *d, const float *o, size_t n),
    (be, di, d, o, n))
FWD(relu_bwd_set, (mmp_backend * be, float *di, const float *d, const float *o, size_t n),
    (be, di, d, o, n))
FWD(gelu_fwd, (mmp_backend * be, float *o, const float *i, size_t n), (be, o, i, n))
FWD(gelu_bwd, (mmp_backend * be, float *di, const float *d, const float *i, size_t n),
    (be, di, d, i, n))
FWD(add, (mmp_backend * be, float *o, const float *a, const float *b, size_t n), (be, o, a, b, n))
FWD(scale, (mmp_backend * be, float *x, float s, size_t n), (be, x, s, n))
FWD(transpose, (mmp_backend * be, float *o, const float *i, int B, int R, int C, int acc),
    (be, o, i, B, R, C, acc))
FWD(acc_f64, (mmp_backend * be, double *a, const float *x, size_t n), (be, a, x, n))
FWD(round_f64, (mmp_backend * be, float *x, const double *a, size_t n), (be, x, a, n))
FWD(maxpool2d_fwd,
    (mmp_backend * be, float *o, int32_t *am, const float *i, int N, int C, int H, int W, int k,
     int s, int p, int OH, int OW),
    (be, o, am, i, N, C, H, W, k, s, p, OH, OW))
FWD(maxpool2d_bwd,
    (mmp_backend * be, float *di, const float *d, const int32_t *am, int N, int C, int H, int W,
     int k, int s, int p, int OH, int OW),
    (be, di, d, am, N, C, H, W, k, s, p, OH, OW))
FWD(layernorm_fwd,
    (mmp_backend * be, float *o, float *m, float *r, const float *i, const float *w, const float *b,
     int N, int C, float eps),
    (be, o, m, r, i, w, b, N, C, eps))
FWD(layernorm_bwd,
    (mmp_backend * be, float *di, float *dw, float *db, const float *d, const float *i,
     const float *w, const float *m, const float *r, int N, int C),
    (be, di, dw, db, d, i, w, m, r, N, C))
FWD(embedding_fwd,
    (mmp_backend * be, float *o, const int32_t *ids, const float *wte, const float *wpe, int B,
     int T, int C),
    (be, o, ids, wte, wpe, B, T, C))
FWD(embedding_bwd,
    (mmp_backend * be, float *dwte, float *dwpe, const float *d, const int32_t *ids, int B, int T,
     int C),
    (be, dwte, dwpe, d, ids, B, T, C))
FWD(attention_fwd,
    (mmp_backend * be, float *o, float *att, const float *q, const float *k, const float *v,
     const float *mask, int B, int Tq, int Tk, int C, int NH, mmp_precision p),
    (be, o, att, q, k, v, mask, B, Tq, Tk, C, NH, p))
FWD(attention_bwd,
    (mmp_backend * be, float *dq, float *dk, float *dv, const float *d, const float *att,
     const float *q, const float *k, const float *v, int B, int Tq, int Tk, int C, int NH,
     mmp_precision p),
    (be, dq, dk, dv, d, att, q, k, v, B, Tq, Tk, C, NH, p))
FWD(l2norm_fwd, (mmp_backend * be, float *o, float *nm, const float *i, int N, int C, float eps),
    (be, o, nm, i, N, C, eps))
FWD(l2norm_bwd,
    (mmp_backend * be, float *di, const float *d, const float *o, const float *nm, int N, int C,
     float eps),
    (be, di, d, o, nm, N, C, eps))
FWD(infonce_bwd,
    (mmp_backend * be, float *di, float *dt, float *ds, const float *sim, const float *pi,
     const float *pt, const float *img, const float *txt, float ls, float dl, int B, int C),
    (be, di, dt, ds, sim, pi, pt, img, txt, ls, dl, B, C))
FWD(bce_bwd, (mmp_backend * be, float *dl, const float *l, const float *y, float dloss, int n),
    (be, dl, l, y, dloss, n))
FWD(adamw,
    (mmp_backend * be, float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
     float b2, float eps, float wd, int t),
    (be, p, g, m, v, n, lr, b1, b2, eps, wd, t))

#define ENTRY(op) .op = c_##op,
static const mmp_backend_ops counting_ops = {.name = "counting", OPS(ENTRY)};
static mmp_backend counting = {.ops = &counting_ops, .ctx = NULL, .err = MMP_OK};

static void reset_counts(void)
{
    memset(calls, 0, sizeof calls);
}

/* Every op in need[] was called through the table at least once. */
static void check_called(const char *what, const int *need, int n)
{
    for (int i = 0; i < n; i++) {
        if (calls[need[i]] == 0) {
            fprintf(stderr, "%s: %s never called through the backend\n", what, op_names[need[i]]);
        }
        CHECK(calls[need[i]] > 0);
    }
}

static int same_bits(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

static void plan_small(mmp_plan *p)
{
    /* stem 8, pool -> 4, stage 2 -> 2: Ni = 4; one text layer, FFN x2 */
    mmp_test_small_plan(p, (mmp_test_net_dims){8, 2, {4, 8}, 1, 1, 2});
}

#define B 3

/* ---- cases ------------------------------------------------------------------ */
static void test_tables_complete(void)
{
    const mmp_backend_ops *tables[] = {
        &mmp_backend_cpu_ops,
#ifdef MMP_HAVE_CUDA
        &mmp_backend_cuda_ops,
#endif
    };
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        const mmp_backend_ops *o = tables[t];
#define NONNULL(op)                                                                                \
    if (!o->op) {                                                                                  \
        fprintf(stderr, "backend %s: no %s\n", o->name, #op);                                      \
    }                                                                                              \
    CHECK(o->op != NULL);
        OPS(NONNULL)
#undef NONNULL
    }
}

/* mmp_backend_error keeps the first failed op's message: a fault that makes
 * every later op fail too (CUDA's sticky errors) must not hide which op
 * failed first. */
static void test_first_error(void)
{
    mmp_backend *be = NULL;
    CHECK_OK(mmp_backend_create(&be, &mmp_backend_cpu_ops, 0));
    if (!be) {
        return;
    }
    CHECK(mmp_backend_error(be) == MMP_OK);
    mmp_backend_fail(be, MMP_OK);
    CHECK(mmp_backend_error(be) == MMP_OK);
    mmp_backend_fail(be, mmp_errorf(MMP_ERR_CUDA, "conv2d_fwd: the first"));
    mmp_backend_fail(be, mmp_errorf(MMP_ERR_INVALID, "gemm: a later one"));
    (void)mmp_errorf(MMP_ERR_IO, "unrelated");
    CHECK(mmp_backend_error(be) == MMP_ERR_CUDA);
    CHECK(strcmp(mmp_last_error(), "conv2d_fwd: the first") == 0);
    mmp_backend_clear_error(be);
    CHECK(mmp_backend_error(be) == MMP_OK);
    mmp_backend_fail(be, mmp_errorf(MMP_ERR_NOMEM, "after clear"));
    CHECK(mmp_backend_error(be) == MMP_ERR_NOMEM);
    CHECK(strcmp(mmp_last_error(), "after clear") == 0);
    mmp_backend_destroy(be);
}

/* One training step (micro-batch accumulation, norm, AdamW) of the image
 * branch on be; returns the output, input gradient and parameter arena. */
static void image_run(mmp_backend *be, const mmp_plan *plan, const float *in, const float *dout,
                      float *out, float *din, float *values, float *grads)
{
    mmp_image_net *net = NULL;
    mmp_image_acts *acts = NULL;
    int L = mmp_image_net_layers(plan);
    CHECK_OK(mmp_image_net_create_on(&net, be, plan, 0, L, 3));
    if (net) {
        CHECK_OK(mmp_image_acts_create(&acts, net, B));
    }
    if (!net || !acts) {
        goto out;
    }
    mmp_test_image_step(net, acts, in, dout, B, out, din);
    mmp_params *p = mmp_image_net_params(net);
    CHECK(mmp_params_grad_sumsq(p) > 0);
    memcpy(grads, p->grads, p->total * sizeof(float));
    mmp_optim_step(p, plan, 0, 1e-3f, 0.5f);
    float row[256];
    CHECK(mmp_image_net_bn_row_floats(net) <= 256);
    mmp_image_net_bn_log(net, row);
    mmp_image_net_forward(net, acts, in, B, 1, out);
    mmp_image_net_bn_log(net, NULL);
    mmp_image_net_bn_replay(net, row, 1);
    mmp_image_net_forward(net, acts, in, B, 0, out);
    memcpy(values, p->values, p->total * sizeof(float));
out:
    mmp_image_acts_destroy(acts);
    mmp_image_net_destroy(net);
}

static void test_image_through_table(void)
{
    mmp_plan plan;
    plan_small(&plan);
    mmp_image_net *probe = NULL;
    CHECK_OK(mmp_image_net_create(&probe, &plan, 0, mmp_image_net_layers(&plan), 3));
    if (!probe) {
        return;
    }
    size_t n_in = (size_t)B * mmp_image_net_in_floats(probe);
    size_t n_out = (size_t)B * mmp_image_net_out_floats(probe);
    size_t total = mmp_image_net_params(probe)->total;
    mmp_image_net_destroy(probe);
    float *in = calloc(n_in, sizeof(float)), *dout = calloc(n_out, sizeof(float));
    float *buf[2][4];
    for (int k = 0; k < 2; k++) {
        buf[k][0] = calloc(n_out, sizeof(float));
        buf[k][1] = calloc(n_in, sizeof(float));
        buf[k][2] = calloc(total, sizeof(float));
        buf[k][3] = calloc(total, sizeof(float));
    }
    mmp_test_fill(in, n_in, -1.0f, 1.0f, 1);
    mmp_test_fill(dout, n_out, -1.0f, 1.0f, 2);
    image_run(mmp_backend_cpu(), &plan, in, dout, buf[0][0], buf[0][1], buf[0][2], buf[0][3]);
    reset_counts();
    live_allocs = 0;
    image_run(&counting, &plan, in, dout, buf[1][0], buf[1][1], buf[1][2], buf[1][3]);
    CHECK(same_bits(buf[0][0], buf[1][0], n_out * sizeof(float)));
    CHECK(same_bits(buf[0][1], buf[1][1], n_in * sizeof(float)));
    CHECK(same_bits(buf[0][2], buf[1][2], total * sizeof(float)));
    CHECK(same_bits(buf[0][3], buf[1][3], total * sizeof(float)));
    const int need[] = {K_alloc,
                        K_free,
                        K_zero,
                        K_to_device,
                        K_to_host,
                        K_copy,
                        K_conv2d_fwd,
                        K_conv2d_bwd,
                        K_batchnorm_fwd_train,
                        K_batchnorm_fwd_infer,
                        K_batchnorm_bwd_set,
                        K_relu_fwd,
                        K_relu_bwd_set,
                        K_add,
                        K_transpose,
                        K_maxpool2d_fwd,
                        K_maxpool2d_bwd,
                        K_linear_fwd,
                        K_linear_bwd,
                        K_acc_f64,
                        K_round_f64,
                        K_sumsq,
                        K_scale,
                        K_adamw};
    check_called("image", need, (int)(sizeof need / sizeof need[0]));
    CHECK(live_allocs == 0); /* the net and its acts gave back all they took */
    free(in);
    free(dout);
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 4; j++) {
            free(buf[k][j]);
        }
    }
}

static void text_run(mmp_backend *be, const mmp_plan *plan, const int32_t *ids, const float *mask,
                     const float *dout, float *out, float *grads, size_t *total)
{
    mmp_text_net *net = NULL;
    mmp_text_acts *acts = NULL;
    CHECK_OK(mmp_text_net_create_on(&net, be, plan, 20, 0, mmp_text_net_layers(plan), 5));
    if (net) {
        CHECK_OK(mmp_text_acts_create(&acts, net, B));
    }
    if (!net || !acts) {
        goto out;
    }
    mmp_params *p = mmp_text_net_params(net);
    mmp_params_zero_grad(p);
    mmp_text_net_forward(net, acts, ids, NULL, mask, B, out);
    mmp_text_net_backward(net, acts, dout, B, NULL);
    *total = p->total;
    memcpy(grads, p->grads, p->total * sizeof(float));
out:
    mmp_text_acts_destroy(acts);
    mmp_text_net_destroy(net);
}

static void fusion_run(mmp_backend *be, const mmp_plan *plan, const float *img, const float *txt,
                       const float *mask, mmp_loss_parts *parts, float *dimg, float *dtxt,
                       float *grads, float *emb)
{
    mmp_fusion_net *net = NULL;
    mmp_fusion_acts *acts = NULL;
    CHECK_OK(mmp_fusion_net_create_on(&net, be, plan, 9));
    if (net) {
        CHECK_OK(mmp_fusion_acts_create(&acts, net, B));
    }
    if (!net || !acts) {
        goto out;
    }
    mmp_params *p = mmp_fusion_net_params(net);
    int E = mmp_fusion_embed_dim(net);
    mmp_params_zero_grad(p);
    mmp_fusion_net_forward(net, acts, img, txt, mask, B, parts);
    mmp_fusion_net_backward(net, acts, 0.5f, dimg, dtxt);
    memcpy(grads, p->grads, p->total * sizeof(float));
    mmp_fusion_net_embed(net, acts, img, txt, mask, B, emb, emb + (size_t)B * E);
out:
    mmp_fusion_acts_destroy(acts);
    mmp_fusion_net_destroy(net);
}

static void test_text_fusion_through_table(void)
{
    mmp_plan plan;
    plan_small(&plan);
    enum { T = 5, D = 8, NI = 4, MAXP = 1 << 14 };
    int32_t ids[B * T];
    float mask[B * T];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)((i * 7 + 1) % 20);
        mask[i] = (i % T) < T - (i / T) ? 1.0f : 0.0f;
    }
    static float dout[B * T * D], out[2][B * T * D], grads[2][MAXP];
    mmp_test_fill(dout, B * T * D, -1.0f, 1.0f, 3);
    size_t total[2] = {0, 0};
    text_run(mmp_backend_cpu(), &plan, ids, mask, dout, out[0], grads[0], &total[0]);
    reset_counts();
    live_allocs = 0;
    text_run(&counting, &plan, ids, mask, dout, out[1], grads[1], &total[1]);
    CHECK(total[0] == total[1] && total[0] <= MAXP);
    CHECK(same_bits(out[0], out[1], sizeof out[0]));
    CHECK(same_bits(grads[0], grads[1], total[0] * sizeof(float)));
    const int need_t[] = {K_embedding_fwd, K_embedding_bwd, K_layernorm_fwd, K_layernorm_bwd,
                          K_attention_fwd, K_attention_bwd, K_gelu_fwd,      K_gelu_bwd,
                          K_linear_fwd,    K_linear_bwd,    K_add,           K_copy};
    check_called("text", need_t, (int)(sizeof need_t / sizeof need_t[0]));
    CHECK(live_allocs == 0);

    static float img[B * NI * D], txt[B * T * D], dimg[2][B * NI * D], dtxt[2][B * T * D];
    static float emb[2][2 * B * D];
    mmp_test_fill(img, B * NI * D, -1.0f, 1.0f, 4);
    mmp_test_fill(txt, B * T * D, -1.0f, 1.0f, 5);
    mmp_loss_parts parts[2];
    memset(grads, 0, sizeof grads);
    fusion_run(mmp_backend_cpu(), &plan, img, txt, mask, &parts[0], dimg[0], dtxt[0], grads[0],
               emb[0]);
    reset_counts();
    live_allocs = 0;
    fusion_run(&counting, &plan, img, txt, mask, &parts[1], dimg[1], dtxt[1], grads[1], emb[1]);
    CHECK(same_bits(&parts[0], &parts[1], sizeof parts[0]));
    CHECK(same_bits(dimg[0], dimg[1], sizeof dimg[0]));
    CHECK(same_bits(dtxt[0], dtxt[1], sizeof dtxt[0]));
    CHECK(same_bits(grads[0], grads[1], sizeof grads[0]));
    CHECK(same_bits(emb[0], emb[1], sizeof emb[0]));
    const int need_f[] = {K_infonce_fwd,   K_infonce_bwd,   K_bce_fwd,       K_bce_bwd,
                          K_l2norm_fwd,    K_l2norm_bwd,    K_to_host,       K_to_device,
                          K_attention_fwd, K_attention_bwd, K_layernorm_fwd, K_linear_bwd};
    check_called("fusion", need_f, (int)(sizeof need_f / sizeof need_f[0]));
    CHECK(live_allocs == 0);
}

MMP_TEST_LIST("test_backend", MMP_TEST_CASE(test_tables_complete), MMP_TEST_CASE(test_first_error),
              MMP_TEST_CASE(test_image_through_table),
              MMP_TEST_CASE(test_text_fusion_through_table))
