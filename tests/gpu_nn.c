/* The model code on the CUDA backend against the same code on the CPU
 * backend: one training step of the image branch, the text branch and the
 * fusion/loss stage, created with the same seed on both (initial values are
 * computed on the host, so they must match bitwise), fed the same inputs.
 *
 * Judged with |gpu - cpu| <= atol + rtol |cpu|:
 *  - forward outputs, losses, running statistics, embeddings: atol 1e-4,
 *    rtol 1e-3 (a few layers of fp32 GEMMs and convolutions summed in a
 *    different order than OpenBLAS / im2col);
 *  - gradients: atol 1e-3, rtol 1e-2 (batch sums of those differences; a
 *    wrong or missing op is off by O(|g|), orders above this);
 *  - after one AdamW step: the moments as the gradients, the values within
 *    2.5 lr (see check_adam).
 * Determinism is held exactly: a second identical step on the GPU gives
 * bitwise the same gradients (no atomics in backward scatters, deterministic
 * cuDNN algorithms), and the backend records no error.
 *
 * Skips (exit 77) when built without CUDA or when no device is visible. */
#include "tests/harness.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_nn", "built without CUDA");
}

#else

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cuda.h"
#include "nn/model.h"
#include "nn/optim.h"

#define NAME "gpu_nn"
#define FWD_ATOL 1e-4
#define FWD_RTOL 1e-3
#define GRAD_ATOL 1e-3
#define GRAD_RTOL 1e-2
#define B 4
#define VOCAB 50

static mmp_backend *gpu;
static mmp_backend *cpu;

static void die(const char *what)
{
    fprintf(stderr, "%s: cannot continue: %s (%s)\n", NAME, what, mmp_last_error());
    exit(1);
}

static float *rnd(size_t n, float lo, float hi, unsigned long long seed)
{
    float *x = mmp_test_floats(n);
    mmp_test_fill(x, n, lo, hi, seed);
    return x;
}

/* A GPU copy of bytes of host memory (zeros when host is NULL). */
static void *up(const void *host, size_t bytes)
{
    void *p = NULL;
    if (gpu->ops->alloc(gpu, &p, bytes) != MMP_OK) {
        die("device allocation");
    }
    if (host) {
        gpu->ops->to_device(gpu, p, host, bytes);
    }
    return p;
}

/* A host copy of n floats of GPU memory; the caller frees it. */
static float *down(const float *dev, size_t n)
{
    float *h = mmp_test_floats(n);
    gpu->ops->to_host(gpu, h, dev, n * sizeof(float));
    return h;
}

static void close_to(const char *label, const float *dev, const float *ref, size_t n, double atol,
                     double rtol)
{
    float *h = down(dev, n);
    CHECK_CLOSE(label, h, ref, n, atol, rtol);
    free(h);
}

static int same_bits_dev(const float *dev, const float *host, size_t n)
{
    float *h = down(dev, n);
    int same = memcmp(h, host, n * sizeof(float)) == 0;
    free(h);
    return same;
}

static void plan_small(mmp_plan *p)
{
    /* stem 16, pool -> 8, stage 2 -> 4: Ni = 16; two text layers, FFN x4 */
    mmp_test_small_plan(p, (mmp_test_net_dims){16, 2, {8, 16}, 1, 2, 4});
    p->train.optimizer.lr = 1e-3f;
}

/* Parameters of the two nets: the same names, bitwise the same initial values. */
static void check_same_init(const char *what, mmp_params *pc, mmp_params *pg)
{
    CHECK(pc->count == pg->count && pc->total == pg->total);
    CHECK(pg->be == gpu && pc->be == cpu);
    int same = same_bits_dev(pg->values, pc->values, pc->total);
    if (!same) {
        fprintf(stderr, "%s: initial values differ between backends\n", what);
    }
    CHECK(same);
}

/* Gradients and values of the GPU params against the CPU's. */
static void check_params(const char *what, mmp_params *pc, mmp_params *pg, int grads)
{
    char label[256];
    for (int i = 0; i < pc->count; i++) {
        const mmp_param *qc = &pc->items[i], *qg = &pg->items[i];
        if (grads && qc->trainable) {
            snprintf(label, sizeof label, "%s grad %s", what, qc->name);
            close_to(label, qg->g, qc->g, qc->n, GRAD_ATOL, GRAD_RTOL);
        } else if (!grads) {
            snprintf(label, sizeof label, "%s value %s", what, qc->name);
            close_to(label, qg->w, qc->w, qc->n, FWD_ATOL, FWD_RTOL);
        }
    }
}

/* After one AdamW step from zero moments: m = (1-b1) g and v = (1-b2) g^2
 * follow the gradients' tolerance; a parameter moves by about lr sign(g), so
 * a near-zero gradient whose sign differs between the devices may move it
 * 2 lr apart: values are held to 2.5 lr. */
static void check_adam(const char *what, mmp_params *pc, mmp_params *pg, float lr)
{
    char label[256];
    for (int i = 0; i < pc->count; i++) {
        const mmp_param *qc = &pc->items[i], *qg = &pg->items[i];
        if (!qc->trainable) {
            continue;
        }
        snprintf(label, sizeof label, "%s adam_m %s", what, qc->name);
        close_to(label, qg->m, qc->m, qc->n, 0.1 * GRAD_ATOL, GRAD_RTOL);
        snprintf(label, sizeof label, "%s adam_v %s", what, qc->name);
        close_to(label, qg->v, qc->v, qc->n, 1e-6, 2 * GRAD_RTOL);
        snprintf(label, sizeof label, "%s value after AdamW %s", what, qc->name);
        close_to(label, qg->w, qc->w, qc->n, 2.5 * lr, FWD_RTOL);
    }
}

/* ---- image ---------------------------------------------------------------- */
static void image_step(mmp_image_net *net, mmp_image_acts *acts, const float *in, const float *dout,
                       float *out, float *din)
{
    mmp_test_image_step(net, acts, in, dout, B, out, din);
}

static void test_image(void)
{
    mmp_plan plan;
    plan_small(&plan);
    int L = mmp_image_net_layers(&plan);
    mmp_image_net *nc = NULL, *ng = NULL;
    mmp_image_acts *ac = NULL, *ag = NULL;
    CHECK_OK(mmp_image_net_create_on(&nc, cpu, &plan, 0, L, 7));
    CHECK_OK(mmp_image_net_create_on(&ng, gpu, &plan, 0, L, 7));
    if (!nc || !ng) {
        goto out;
    }
    CHECK_OK(mmp_image_acts_create(&ac, nc, B));
    CHECK_OK(mmp_image_acts_create(&ag, ng, B));
    if (!ac || !ag) {
        goto out;
    }
    mmp_params *pc = mmp_image_net_params(nc), *pg = mmp_image_net_params(ng);
    check_same_init("image", pc, pg);
    size_t n_in = (size_t)B * mmp_image_net_in_floats(nc);
    size_t n_out = (size_t)B * mmp_image_net_out_floats(nc);
    float *in = rnd(n_in, -1.0f, 1.0f, 101), *dout = rnd(n_out, -1.0f, 1.0f, 102);
    float *out = mmp_test_floats(n_out), *din = mmp_test_floats(n_in);
    float *g_in = up(in, n_in * sizeof(float)), *g_dout = up(dout, n_out * sizeof(float));
    float *g_out = up(NULL, n_out * sizeof(float)), *g_din = up(NULL, n_in * sizeof(float));

    image_step(nc, ac, in, dout, out, din);
    image_step(ng, ag, g_in, g_dout, g_out, g_din);
    close_to("image out", g_out, out, n_out, FWD_ATOL, FWD_RTOL);
    close_to("image din", g_din, din, n_in, GRAD_ATOL, GRAD_RTOL);
    check_params("image", pc, pg, 1);
    check_params("image (running statistics)", pc, pg, 0);

    /* The same step again on the GPU: bitwise the same gradients. */
    float *g1 = down(pg->grads, pg->total);
    gpu->ops->zero(gpu, g_din, n_in * sizeof(float));
    image_step(ng, ag, g_in, g_dout, g_out, g_din);
    CHECK(same_bits_dev(pg->grads, g1, pg->total));
    free(g1);
    image_step(nc, ac, in, dout, out, din); /* keep the running statistics in step */

    /* Batch-norm statistics rows: logged on the device, replayed on both. */
    int64_t rf = mmp_image_net_bn_row_floats(nc);
    CHECK(rf > 0 && rf == mmp_image_net_bn_row_floats(ng));
    float *row_c = mmp_test_floats((size_t)rf), *row_g = mmp_test_floats((size_t)rf);
    mmp_image_net_bn_log(nc, row_c);
    mmp_image_net_bn_log(ng, row_g);
    mmp_image_net_forward(nc, ac, in, B, 1, out);
    mmp_image_net_forward(ng, ag, g_in, B, 1, g_out);
    mmp_image_net_bn_log(nc, NULL);
    mmp_image_net_bn_log(ng, NULL);
    CHECK_CLOSE("image bn row", row_g, row_c, (size_t)rf, FWD_ATOL, FWD_RTOL);
    mmp_image_net_bn_replay(nc, row_c, 1);
    mmp_image_net_bn_replay(ng, row_c, 1); /* the same row: the replay itself must agree */
    check_params("image (replayed statistics)", pc, pg, 0);
    free(row_c);
    free(row_g);

    /* An inference forward, then one AdamW step (gradients scaled by 0.5). */
    mmp_image_net_forward(nc, ac, in, B, 0, out);
    mmp_image_net_forward(ng, ag, g_in, B, 0, g_out);
    close_to("image eval out", g_out, out, n_out, FWD_ATOL, FWD_RTOL);
    mmp_optim_step(pc, &plan, 0, plan.train.optimizer.lr, 0.5f);
    mmp_optim_step(pg, &plan, 0, plan.train.optimizer.lr, 0.5f);
    check_adam("image", pc, pg, plan.train.optimizer.lr);
    CHECK_OK(mmp_backend_error(gpu));

    free(in);
    free(dout);
    free(out);
    free(din);
    gpu->ops->free(gpu, g_in);
    gpu->ops->free(gpu, g_dout);
    gpu->ops->free(gpu, g_out);
    gpu->ops->free(gpu, g_din);
out:
    mmp_image_acts_destroy(ac);
    mmp_image_acts_destroy(ag);
    mmp_image_net_destroy(nc);
    mmp_image_net_destroy(ng);
}

/* ---- text ----------------------------------------------------------------- */
/* Layers [first, L): first == 0 reads ids, otherwise in (and writes din). */
static void text_range(int first)
{
    mmp_plan plan;
    plan_small(&plan);
    int L = mmp_text_net_layers(&plan), T = plan.data.max_text_len;
    mmp_text_net *nc = NULL, *ng = NULL;
    mmp_text_acts *ac = NULL, *ag = NULL;
    CHECK_OK(mmp_text_net_create_on(&nc, cpu, &plan, VOCAB, first, L, 11));
    CHECK_OK(mmp_text_net_create_on(&ng, gpu, &plan, VOCAB, first, L, 11));
    if (!nc || !ng) {
        goto out;
    }
    CHECK_OK(mmp_text_acts_create(&ac, nc, B));
    CHECK_OK(mmp_text_acts_create(&ag, ng, B));
    if (!ac || !ag) {
        goto out;
    }
    mmp_params *pc = mmp_text_net_params(nc), *pg = mmp_text_net_params(ng);
    check_same_init("text", pc, pg);
    size_t nd = (size_t)B * mmp_text_net_out_floats(nc);
    int32_t ids[B * 5];
    float mask[B * 5];
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % VOCAB); /* repeated ids: the wte scatter adds rows */
        mask[i] = (i % T) < T - 1 - (i / T) % 2 ? 1.0f : 0.0f;
    }
    float *in = rnd(nd, -1.0f, 1.0f, 201), *dout = rnd(nd, -1.0f, 1.0f, 202);
    float *out = mmp_test_floats(nd), *din = mmp_test_floats(nd);
    int32_t *g_ids = up(ids, sizeof ids);
    float *g_mask = up(mask, sizeof mask), *g_in = up(in, nd * sizeof(float));
    float *g_dout = up(dout, nd * sizeof(float)), *g_out = up(NULL, nd * sizeof(float));
    float *g_din = up(NULL, nd * sizeof(float));

    mmp_params_zero_grad(pc);
    mmp_params_zero_grad(pg);
    mmp_text_net_forward(nc, ac, ids, in, mask, B, out);
    mmp_text_net_forward(ng, ag, g_ids, g_in, g_mask, B, g_out);
    close_to(first ? "text [1,L) out" : "text out", g_out, out, nd, FWD_ATOL, FWD_RTOL);
    mmp_text_net_backward(nc, ac, dout, B, din);
    mmp_text_net_backward(ng, ag, g_dout, B, g_din);
    if (first > 0) {
        close_to("text [1,L) din", g_din, din, nd, GRAD_ATOL, GRAD_RTOL);
    }
    check_params(first ? "text [1,L)" : "text", pc, pg, 1);

    float *g1 = down(pg->grads, pg->total);
    mmp_params_zero_grad(pg);
    mmp_text_net_forward(ng, ag, g_ids, g_in, g_mask, B, g_out);
    mmp_text_net_backward(ng, ag, g_dout, B, g_din);
    CHECK(same_bits_dev(pg->grads, g1, pg->total));
    free(g1);
    CHECK_OK(mmp_backend_error(gpu));

    free(in);
    free(dout);
    free(out);
    free(din);
    gpu->ops->free(gpu, g_ids);
    gpu->ops->free(gpu, g_mask);
    gpu->ops->free(gpu, g_in);
    gpu->ops->free(gpu, g_dout);
    gpu->ops->free(gpu, g_out);
    gpu->ops->free(gpu, g_din);
out:
    mmp_text_acts_destroy(ac);
    mmp_text_acts_destroy(ag);
    mmp_text_net_destroy(nc);
    mmp_text_net_destroy(ng);
}

static void test_text(void)
{
    text_range(0);
    text_range(1);
}

/* ---- fusion --------------------------------------------------------------- */
static void test_fusion(void)
{
    mmp_plan plan;
    plan_small(&plan);
    const int D = plan.model.width, T = plan.data.max_text_len;
    const int Ni = mmp_image_net_tokens(&plan);
    mmp_fusion_net *nc = NULL, *ng = NULL;
    mmp_fusion_acts *ac = NULL, *ag = NULL;
    CHECK_OK(mmp_fusion_net_create_on(&nc, cpu, &plan, 13));
    CHECK_OK(mmp_fusion_net_create_on(&ng, gpu, &plan, 13));
    if (!nc || !ng) {
        goto out;
    }
    CHECK_OK(mmp_fusion_acts_create(&ac, nc, B));
    CHECK_OK(mmp_fusion_acts_create(&ag, ng, B));
    if (!ac || !ag) {
        goto out;
    }
    mmp_params *pc = mmp_fusion_net_params(nc), *pg = mmp_fusion_net_params(ng);
    check_same_init("fusion", pc, pg);
    size_t ni = (size_t)B * Ni * D, nt = (size_t)B * T * D, E = (size_t)mmp_fusion_embed_dim(nc);
    float *img = rnd(ni, -1.0f, 1.0f, 301), *txt = rnd(nt, -1.0f, 1.0f, 302);
    float *mask = mmp_test_floats((size_t)B * T);
    for (int i = 0; i < B * T; i++) {
        mask[i] = 1.0f;
    }
    float *dimg = mmp_test_floats(ni), *dtxt = mmp_test_floats(nt);
    float *g_img = up(img, ni * sizeof(float)), *g_txt = up(txt, nt * sizeof(float));
    float *g_mask = up(mask, (size_t)B * T * sizeof(float));
    float *g_dimg = up(NULL, ni * sizeof(float)), *g_dtxt = up(NULL, nt * sizeof(float));

    mmp_loss_parts lc, lg;
    mmp_params_zero_grad(pc);
    mmp_params_zero_grad(pg);
    mmp_fusion_net_forward(nc, ac, img, txt, mask, B, &lc);
    mmp_fusion_net_forward(ng, ag, g_img, g_txt, g_mask, B, &lg);
    float got[3] = {lg.loss, lg.itc, lg.itm}, ref[3] = {lc.loss, lc.itc, lc.itm};
    CHECK_CLOSE("fusion loss, itc, itm", got, ref, 3, FWD_ATOL, FWD_RTOL);
    mmp_fusion_net_backward(nc, ac, 0.5f, dimg, dtxt);
    mmp_fusion_net_backward(ng, ag, 0.5f, g_dimg, g_dtxt);
    close_to("fusion dimg", g_dimg, dimg, ni, GRAD_ATOL, GRAD_RTOL);
    close_to("fusion dtxt", g_dtxt, dtxt, nt, GRAD_ATOL, GRAD_RTOL);
    check_params("fusion", pc, pg, 1);

    float *g1 = down(pg->grads, pg->total);
    mmp_params_zero_grad(pg);
    mmp_fusion_net_forward(ng, ag, g_img, g_txt, g_mask, B, &lg);
    mmp_fusion_net_backward(ng, ag, 0.5f, g_dimg, g_dtxt);
    CHECK(same_bits_dev(pg->grads, g1, pg->total));
    free(g1);

    /* Retrieval embeddings. */
    float *ie = mmp_test_floats((size_t)B * E), *te = mmp_test_floats((size_t)B * E);
    float *g_ie = up(NULL, (size_t)B * E * sizeof(float));
    float *g_te = up(NULL, (size_t)B * E * sizeof(float));
    mmp_fusion_net_embed(nc, ac, img, txt, mask, B, ie, te);
    mmp_fusion_net_embed(ng, ag, g_img, g_txt, g_mask, B, g_ie, g_te);
    close_to("fusion img_emb", g_ie, ie, (size_t)B * E, FWD_ATOL, FWD_RTOL);
    close_to("fusion txt_emb", g_te, te, (size_t)B * E, FWD_ATOL, FWD_RTOL);

    mmp_optim_step(pc, &plan, 0, plan.train.optimizer.lr, 1.0f);
    mmp_optim_step(pg, &plan, 0, plan.train.optimizer.lr, 1.0f);
    check_adam("fusion", pc, pg, plan.train.optimizer.lr);
    CHECK_OK(mmp_backend_error(gpu));

    free(img);
    free(txt);
    free(mask);
    free(dimg);
    free(dtxt);
    free(ie);
    free(te);
    gpu->ops->free(gpu, g_img);
    gpu->ops->free(gpu, g_txt);
    gpu->ops->free(gpu, g_mask);
    gpu->ops->free(gpu, g_dimg);
    gpu->ops->free(gpu, g_dtxt);
    gpu->ops->free(gpu, g_ie);
    gpu->ops->free(gpu, g_te);
out:
    mmp_fusion_acts_destroy(ac);
    mmp_fusion_acts_destroy(ag);
    mmp_fusion_net_destroy(nc);
    mmp_fusion_net_destroy(ng);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_image),
    MMP_TEST_CASE(test_text),
    MMP_TEST_CASE(test_fusion),
};

int main(int argc, char **argv)
{
    if (mmp_cuda_device_count() == 0) {
        return mmp_test_skip(NAME, "no CUDA device");
    }
    cpu = mmp_backend_cpu();
    if (mmp_backend_create(&gpu, &mmp_backend_cuda_ops, 0) != MMP_OK) {
        die("CUDA backend on device 0");
    }
    int rc = MMP_TEST_MAIN(NAME, cases, argc, argv);
    mmp_backend_destroy(gpu);
    return rc;
}

#endif
