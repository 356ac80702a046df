/* The golden test against PyTorch, in the manner of llm.c's test_gpt2.c:
 * bench/torch/mmpipe_ref.py (the same model written in PyTorch) ran one
 * training step's forward and backward on a fixed batch and wrote, into the
 * committed tests/golden/golden.safetensors, the weights it started from,
 * the batch, the loss parts, every parameter gradient and the batch-norm
 * running statistics after the step. This test loads the same weights and
 * batch into mmpipe (one process, CPU backend, the single-process trainer's
 * order of operations: micro-batches, k/batch weights, double accumulation)
 * and compares. No PyTorch is needed to run it.
 *
 * How the file is made (the batch is fixed by mmpipe, PyTorch reads it):
 *   build/tests/test_golden --emit DIR   initial checkpoint of the plan
 *                                        (DIR/ckpt/latest), DIR/batch.safetensors
 *                                        (images, ids, mask from a fixed seed)
 *                                        and DIR/plan.json
 *   mmpipe ckpt export DIR -o DIR/init.safetensors
 *   python3 bench/torch/make_golden.py   does all three, then runs PyTorch
 * Regenerate after changing tests/golden/plan.yaml or the model: the file's
 * metadata carries format "mmpipe-golden" and a version; a mismatch (or a
 * tensor the model now lacks) says so and how to regenerate.
 *
 * Tolerances (fp32 on both sides, different order of operations: OpenBLAS
 * GEMMs and im2col convolutions here, PyTorch's own kernels there; mmpipe
 * sums batch-norm statistics and losses in double, PyTorch in float): each
 * op's result differs by a few ulp (~1e-7 relative), and backward chains
 * ~60 ops, so agreeing entries differ by ~1e-6 relative. Entries that are
 * sums of much larger terms of both signs (batch-norm weight gradients, the
 * first conv's gradients) lose that precision to cancellation, so an
 * absolute part scaled to the tensor is needed as well. And some gradients
 * are exactly zero in exact arithmetic: an attention key bias adds the same
 * constant to every score of a query, which softmax ignores, so
 * attn.k.bias's gradient is pure rounding noise (seen: up to 1.4e-8 in
 * either implementation), which a floor covers. An entry passes when
 *   |mmpipe - torch| <= GRAD_ATOL max|torch over the tensor| + GRAD_FLOOR
 *                       + GRAD_RTOL |torch|.
 * Seen when the file was made: the worst tensor differs by 1.3e-5 of its
 * scale (text.layer1.ln1.bias; the text branch is deepest), the losses by
 * <= 6e-8, so GRAD_ATOL = 1e-4 leaves a margin of ~8 and GRAD_FLOOR = 1e-7
 * one of ~7, while the smallest real gradient scale here is 2e-4.
 * A real mistake (a missing term, a wrong constant, GELU's erf form instead
 * of tanh, a dropped 1/n) moves entries by 1e-3 relative and more, two orders
 * above these bounds; test_wrong_gradient_fails proves the comparison
 * catches a change of 1e-3 of the tensor's scale in one entry. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "nn/model.h"
#include "stages/fuse.h"
#include "tests/harness.h"

#define GOLDEN_PLAN "tests/golden/plan.yaml"
#define GOLDEN_FILE "tests/golden/golden.safetensors"
#define GOLDEN_FORMAT "mmpipe-golden"
#define GOLDEN_VERSION "1"
#define GOLDEN_VOCAB 40
#define GOLDEN_BATCH_SEED 2026
#define REGEN_HINT "regenerate it: python3 bench/torch/make_golden.py (needs torch; see its --help)"

#define LOSS_ATOL 1e-5
#define LOSS_RTOL 1e-5
#define GRAD_ATOL 1e-4
#define GRAD_RTOL 1e-4
#define GRAD_FLOOR 1e-7 /* gradients that are zero but for rounding: see above */
#define STAT_ATOL 1e-5  /* running statistics: one forward, no cancellation */
#define STAT_RTOL 1e-5

typedef struct model {
    mmp_plan plan;
    mmp_image_net *img;
    mmp_text_net *txt;
    mmp_fusion_net *fus;
    mmp_params *tables[3];
} model;

static void model_fini(model *m)
{
    mmp_image_net_destroy(m->img);
    mmp_text_net_destroy(m->txt);
    mmp_fusion_net_destroy(m->fus);
    memset(m, 0, sizeof *m);
}

static mmp_err model_init(model *m, int vocab)
{
    memset(m, 0, sizeof *m);
    MMP_TRY(mmp_plan_load(&m->plan, GOLDEN_PLAN, NULL, 0));
    uint64_t seed = (uint64_t)m->plan.job.seed;
    MMP_TRY(mmp_image_net_create(&m->img, &m->plan, 0, mmp_image_net_layers(&m->plan), seed));
    MMP_TRY(mmp_text_net_create(&m->txt, &m->plan, vocab, 0, mmp_text_net_layers(&m->plan), seed));
    MMP_TRY(mmp_fusion_net_create(&m->fus, &m->plan, seed));
    m->tables[0] = mmp_image_net_params(m->img);
    m->tables[1] = mmp_text_net_params(m->txt);
    m->tables[2] = mmp_fusion_net_params(m->fus);
    return MMP_OK;
}

/* The entry name with shape (ndim, shape) and dtype, or NULL (printed). */
static const mmp_ckpt_entry *find_shaped(const mmp_ckpt *c, const char *name, mmp_dtype dtype,
                                         int ndim, const int64_t *shape)
{
    const mmp_ckpt_entry *e = mmp_ckpt_find(c, name);
    int same = e && e->t.dtype == dtype && e->t.ndim == ndim;
    for (int d = 0; same && d < ndim; d++) {
        same = e->t.shape[d] == shape[d];
    }
    if (!same) {
        fprintf(stderr, "  %s: %s in %s, or not the model's shape; %s\n", name,
                e ? "misshapen" : "missing", GOLDEN_FILE, REGEN_HINT);
        return NULL;
    }
    return e;
}

/* Every parameter and buffer of m from c by name; 0 when one is missing. */
static int load_weights(model *m, const mmp_ckpt *c)
{
    for (int k = 0; k < 3; k++) {
        mmp_params *p = m->tables[k];
        for (int i = 0; i < p->count; i++) {
            mmp_param *q = &p->items[i];
            const mmp_ckpt_entry *e = find_shaped(c, q->name, MMP_F32, q->ndim, q->shape);
            if (!e) {
                return 0;
            }
            p->be->ops->to_device(p->be, q->w, e->t.data, q->n * sizeof(float));
        }
    }
    return 1;
}

/* The same under model.fusion.itc_scope: batch (stages/single.c
 * batch_scope_step): each micro-batch's branch forwards into the step's
 * rows, the fusion once over the whole batch, then each micro-batch's
 * branch backwards. */
static mmp_err run_step_batch(model *m, const float *images, const int32_t *ids, const float *mask,
                              mmp_loss_parts *parts)
{
    const mmp_plan *plan = &m->plan;
    int B = plan->train.batch, mb_max = mmp_plan_mb_size(plan, 0), nmb = plan->train.microbatches;
    int S = plan->data.image_size, T = plan->data.max_text_len, D = plan->model.width;
    mmp_err ret = MMP_OK;
    mmp_image_acts *ia[8] = {0};
    mmp_text_acts *ta[8] = {0};
    mmp_fusion_acts *fa = NULL;
    mmp_fuse fuse = {0};
    mmp_fuse_step fs = {0};
    size_t img_row = (size_t)mmp_image_net_out_floats(m->img);
    size_t txt_row = (size_t)mmp_text_net_out_floats(m->txt);
    if (nmb > 8) {
        return mmp_errorf(MMP_ERR_INVALID, "golden: %d micro-batches (at most 8 here)", nmb);
    }
    for (int mb = 0; mb < nmb && ret == MMP_OK; mb++) {
        if ((ret = mmp_image_acts_create(&ia[mb], m->img, mb_max)) == MMP_OK) {
            ret = mmp_text_acts_create(&ta[mb], m->txt, mb_max);
        }
    }
    if (ret != MMP_OK || (ret = mmp_fusion_acts_create(&fa, m->fus, B)) != MMP_OK ||
        (ret = mmp_fuse_init(&fuse, mmp_backend_cpu(), B, img_row, T, D)) != MMP_OK ||
        (ret = mmp_fuse_step_init(&fs, mmp_backend_cpu(), B, img_row, T, D)) != MMP_OK) {
        goto exit;
    }
    memset(parts, 0, sizeof *parts);
    for (int k = 0; k < 3; k++) {
        mmp_params_zero_grad(m->tables[k]);
    }
    mmp_fuse_step_begin(&fs, 0);
    for (int mb = 0; mb < nmb; mb++) {
        int n = mmp_plan_mb_size(plan, mb), at = mmp_plan_mb_offset(plan, mb);
        const float *mk = mask + (size_t)at * T;
        mmp_image_net_forward(m->img, ia[mb], images + (size_t)at * 3 * S * S, n, 1,
                              fs.img + (size_t)at * img_row);
        mmp_text_net_forward(m->txt, ta[mb], ids + (size_t)at * T, NULL, mk, n,
                             fs.txt + (size_t)at * txt_row);
        mmp_fuse_step_put(&fs, at, n, NULL, NULL, mk, NULL, NULL);
    }
    int skipped = 0;
    mmp_params_mb_begin(m->tables[2]);
    mmp_fuse_step_run(&fs, &fuse, m->fus, fa, 1.0f, parts, &skipped);
    mmp_params_mb_end(m->tables[2]);
    for (int mb = 0; mb < nmb; mb++) {
        int n = mmp_plan_mb_size(plan, mb), at = mmp_plan_mb_offset(plan, mb);
        mmp_params_mb_begin(m->tables[0]);
        mmp_params_mb_begin(m->tables[1]);
        mmp_text_net_backward(m->txt, ta[mb], fs.dtxt + (size_t)at * txt_row, n, NULL);
        mmp_image_net_backward(m->img, ia[mb], fs.dimg + (size_t)at * img_row, n, NULL);
        mmp_params_mb_end(m->tables[0]);
        mmp_params_mb_end(m->tables[1]);
    }
    for (int k = 0; k < 3; k++) {
        mmp_params_grad_finish(m->tables[k]);
    }
exit:
    mmp_fuse_step_fini(&fs);
    mmp_fuse_fini(&fuse);
    for (int mb = 0; mb < 8; mb++) {
        mmp_image_acts_destroy(ia[mb]);
        mmp_text_acts_destroy(ta[mb]);
    }
    mmp_fusion_acts_destroy(fa);
    return ret;
}

/* One training step's forward and backward over the batch, as the
 * single-process trainer runs it (stages/single.c train_step), without the
 * optimizer: gradients end in the params' g. The golden plan's scope is
 * microbatch (the file's unprefixed entries); scope batch runs
 * run_step_batch (the file's "itc_batch." entries). */
static mmp_err run_step(model *m, const float *images, const int32_t *ids, const float *mask,
                        mmp_itc_scope scope, mmp_loss_parts *parts)
{
    if (scope == MMP_ITC_BATCH) {
        return run_step_batch(m, images, ids, mask, parts);
    }
    const mmp_plan *plan = &m->plan;
    int B = plan->train.batch, mb_max = mmp_plan_mb_size(plan, 0);
    int S = plan->data.image_size, T = plan->data.max_text_len, D = plan->model.width;
    mmp_err ret = MMP_OK;
    mmp_image_acts *ia = NULL;
    mmp_text_acts *ta = NULL;
    mmp_fusion_acts *fa = NULL;
    mmp_fuse fuse = {0};
    int64_t img_row = mmp_image_net_out_floats(m->img), txt_row = mmp_text_net_out_floats(m->txt);
    float *img_tok = calloc((size_t)mb_max * (size_t)img_row, sizeof(float));
    float *txt_tok = calloc((size_t)mb_max * (size_t)txt_row, sizeof(float));
    float *dimg = calloc((size_t)mb_max * (size_t)img_row, sizeof(float));
    float *dtxt = calloc((size_t)mb_max * (size_t)txt_row, sizeof(float));
    if (!img_tok || !txt_tok || !dimg || !dtxt) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "golden step buffers");
        goto exit;
    }
    if ((ret = mmp_image_acts_create(&ia, m->img, mb_max)) != MMP_OK ||
        (ret = mmp_text_acts_create(&ta, m->txt, mb_max)) != MMP_OK ||
        (ret = mmp_fusion_acts_create(&fa, m->fus, mb_max)) != MMP_OK ||
        (ret = mmp_fuse_init(&fuse, mmp_backend_cpu(), mb_max, (size_t)img_row, T, D)) != MMP_OK) {
        goto exit;
    }
    memset(parts, 0, sizeof *parts);
    for (int k = 0; k < 3; k++) {
        mmp_params_zero_grad(m->tables[k]);
    }
    for (int mb = 0; mb < plan->train.microbatches; mb++) {
        int n = mmp_plan_mb_size(plan, mb), at = mmp_plan_mb_offset(plan, mb), skipped = 0;
        const float *im = images + (size_t)at * 3 * S * S, *mk = mask + (size_t)at * T;
        const int32_t *id = ids + (size_t)at * T;
        for (int k = 0; k < 3; k++) {
            mmp_params_mb_begin(m->tables[k]);
        }
        mmp_image_net_forward(m->img, ia, im, n, 1, img_tok);
        mmp_text_net_forward(m->txt, ta, id, NULL, mk, n, txt_tok);
        mmp_fuse_forward(&fuse, m->fus, fa, img_tok, txt_tok, mk, NULL, NULL, n, B, parts,
                         &skipped);
        mmp_fuse_backward(&fuse, m->fus, fa, B, 1.0f, dimg, dtxt);
        mmp_text_net_backward(m->txt, ta, dtxt, n, NULL);
        mmp_image_net_backward(m->img, ia, dimg, n, NULL);
        for (int k = 0; k < 3; k++) {
            mmp_params_mb_end(m->tables[k]);
        }
    }
    for (int k = 0; k < 3; k++) {
        mmp_params_grad_finish(m->tables[k]);
    }
exit:
    mmp_fuse_fini(&fuse);
    mmp_image_acts_destroy(ia);
    mmp_text_acts_destroy(ta);
    mmp_fusion_acts_destroy(fa);
    free(img_tok);
    free(txt_tok);
    free(dimg);
    free(dtxt);
    return ret;
}

/* Compares got with ref under |d| <= atol_scale max|ref| + floor + rtol |ref|,
 * prints one line with the max abs/rel difference, and the first mismatches
 * when there are any. Returns 1 when all entries pass. */
static int compare(const char *name, const float *got, const float *ref, size_t n,
                   double atol_scale, double floor, double rtol, int quiet)
{
    double scale = 0, max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs((double)ref[i]));
    }
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        max_abs = fmax(max_abs, isnan(d) ? INFINITY : d);
        if (ref[i] != 0) {
            max_rel = fmax(max_rel, d / fabs((double)ref[i]));
        }
    }
    double atol = atol_scale * scale + floor;
    if (!quiet) {
        printf("  %-40s n=%-6zu max|ref|=%-10.3g max_abs=%-10.3g max_rel=%-10.3g atol=%.3g\n", name,
               n, scale, max_abs, max_rel, atol);
    }
    return mmp_test_close(name, got, ref, n, atol, rtol);
}

static int read_golden(mmp_ckpt *c)
{
    mmp_st_meta meta;
    memset(c, 0, sizeof *c);
    if (mmp_safetensors_read(c, GOLDEN_FILE, &meta) != MMP_OK) {
        fprintf(stderr, "  %s\n  %s\n", mmp_last_error(), REGEN_HINT);
        return 0;
    }
    const char *fmt = mmp_st_meta_get(&meta, "format"), *ver = mmp_st_meta_get(&meta, "version");
    if (!fmt || strcmp(fmt, GOLDEN_FORMAT) != 0 || !ver || strcmp(ver, GOLDEN_VERSION) != 0) {
        fprintf(stderr, "  %s: format '%s' version '%s', this test reads '%s' version %s; %s\n",
                GOLDEN_FILE, fmt ? fmt : "", ver ? ver : "", GOLDEN_FORMAT, GOLDEN_VERSION,
                REGEN_HINT);
        return 0;
    }
    return 1;
}

/* Loads the golden file's weights and batch into a fresh model and runs the
 * step. 0 on any failure (printed). */
static int golden_step(model *m, mmp_ckpt *c, mmp_itc_scope scope, mmp_loss_parts *parts)
{
    if (!read_golden(c)) {
        return 0;
    }
    const mmp_ckpt_entry *wte = mmp_ckpt_find(c, "text.embed.wte");
    if (!wte || wte->t.ndim != 2) {
        fprintf(stderr, "  %s has no text.embed.wte; %s\n", GOLDEN_FILE, REGEN_HINT);
        return 0;
    }
    mmp_err e = model_init(m, (int)wte->t.shape[0]);
    if (e != MMP_OK) {
        fprintf(stderr, "  %s\n", mmp_last_error());
        return 0;
    }
    const mmp_plan *plan = &m->plan;
    int64_t B = plan->train.batch, S = plan->data.image_size, T = plan->data.max_text_len;
    int64_t ishape[4] = {B, 3, S, S}, tshape[2] = {B, T};
    const mmp_ckpt_entry *images = find_shaped(c, "batch.images", MMP_F32, 4, ishape);
    const mmp_ckpt_entry *ids = find_shaped(c, "batch.ids", MMP_I32, 2, tshape);
    const mmp_ckpt_entry *mask = find_shaped(c, "batch.mask", MMP_F32, 2, tshape);
    if (!images || !ids || !mask || !load_weights(m, c)) {
        return 0;
    }
    if (run_step(m, images->t.data, ids->t.data, mask->t.data, scope, parts) != MMP_OK) {
        fprintf(stderr, "  %s\n", mmp_last_error());
        return 0;
    }
    return 1;
}

/* golden_step as a check; m is zeroed first, so model_fini is safe after it
 * either way. */
static int golden_ok(model *m, mmp_ckpt *c, mmp_itc_scope scope, mmp_loss_parts *parts)
{
    memset(m, 0, sizeof *m);
    int ok = golden_step(m, c, scope, parts);
    CHECK(ok);
    return ok;
}

static int check_loss(const mmp_ckpt *c, const char *name, float got)
{
    int64_t one[1] = {1};
    const mmp_ckpt_entry *e = find_shaped(c, name, MMP_F32, 1, one);
    if (!e) {
        return 0;
    }
    float want = *(const float *)e->t.data;
    printf("  %-40s mmpipe %.9g  torch %.9g  diff %.3g\n", name, (double)got, (double)want,
           fabs((double)got - want));
    return fabs((double)got - want) <= LOSS_ATOL + LOSS_RTOL * fabs((double)want);
}

/* Both scopes: the plan's (microbatch: per-micro-batch ITC and hard
 * negatives) under the file's plain names, batch (ITC over the whole batch,
 * hard negatives mined across micro-batches, batch norm still per
 * micro-batch) under "itc_batch.". */
static void matches_pytorch(mmp_itc_scope scope, const char *prefix)
{
    model m;
    mmp_ckpt c;
    mmp_loss_parts parts;
    char key[MMP_NAME_MAX + 32];
    if (!golden_ok(&m, &c, scope, &parts)) {
        goto exit;
    }
    CHECK(m.plan.model.fusion.itc_scope == MMP_ITC_MICROBATCH && m.plan.train.microbatches > 1);
    printf("itc_scope %s: loss parts (|d| <= %g + %g |torch|):\n",
           scope == MMP_ITC_BATCH ? "batch" : "microbatch", LOSS_ATOL, LOSS_RTOL);
    snprintf(key, sizeof key, "%sloss.total", prefix);
    CHECK(check_loss(&c, key, parts.loss));
    snprintf(key, sizeof key, "%sloss.itc", prefix);
    CHECK(check_loss(&c, key, parts.itc));
    snprintf(key, sizeof key, "%sloss.itm", prefix);
    CHECK(check_loss(&c, key, parts.itm));
    printf("gradients (|d| <= %g max|torch| + %g + %g |torch|) and batch-norm statistics after "
           "the step (%g max|torch| + %g |torch|):\n",
           GRAD_ATOL, GRAD_FLOOR, GRAD_RTOL, STAT_ATOL, STAT_RTOL);
    int compared = 0, failed = 0;
    for (int k = 0; k < 3; k++) {
        mmp_params *p = m.tables[k];
        float *host = malloc(p->total * sizeof(float));
        CHECK(host != NULL);
        if (!host) {
            continue;
        }
        for (int i = 0; i < p->count; i++) {
            const mmp_param *q = &p->items[i];
            char name[MMP_NAME_MAX + 32];
            snprintf(name, sizeof name, "%s%s.%s", prefix, q->trainable ? "grad" : "after",
                     q->name);
            const mmp_ckpt_entry *e = find_shaped(&c, name, MMP_F32, q->ndim, q->shape);
            if (!e) {
                failed++;
                continue;
            }
            p->be->ops->to_host(p->be, host, q->trainable ? q->g : q->w, q->n * sizeof(float));
            compared++;
            failed +=
                !compare(name, host, e->t.data, q->n, q->trainable ? GRAD_ATOL : STAT_ATOL,
                         q->trainable ? GRAD_FLOOR : 0, q->trainable ? GRAD_RTOL : STAT_RTOL, 0);
        }
        free(host);
    }
    printf("%d tensors compared, %d outside tolerance\n", compared, failed);
    CHECK(compared > 0 && failed == 0);
exit:
    mmp_ckpt_fini(&c);
    model_fini(&m);
}

static void test_matches_pytorch(void)
{
    matches_pytorch(MMP_ITC_MICROBATCH, "");
}

static void test_batch_scope_matches_pytorch(void)
{
    matches_pytorch(MMP_ITC_BATCH, "itc_batch.");
}

/* The comparison must catch a wrong gradient: one entry of one tensor moved
 * by 1e-3 of the tensor's scale (ten times the absolute tolerance) fails. */
static void test_wrong_gradient_fails(void)
{
    model m;
    mmp_ckpt c;
    mmp_loss_parts parts;
    if (!golden_ok(&m, &c, MMP_ITC_MICROBATCH, &parts)) {
        goto exit;
    }
    const char *victims[] = {"image.layer2.0.conv1.weight", "text.layer1.attn.q.weight",
                             "fusion.logit_scale"};
    for (size_t v = 0; v < sizeof victims / sizeof victims[0]; v++) {
        mmp_param *q = NULL;
        for (int k = 0; k < 3 && !q; k++) {
            q = mmp_params_find(m.tables[k], victims[v]);
        }
        char name[MMP_NAME_MAX + 8];
        snprintf(name, sizeof name, "grad.%s", victims[v]);
        const mmp_ckpt_entry *e = mmp_ckpt_find(&c, name);
        CHECK(q && e);
        if (!q || !e) {
            continue;
        }
        float *g = malloc(q->n * sizeof(float));
        double scale = 0;
        for (size_t i = 0; i < q->n; i++) {
            scale = fmax(scale, fabs(((const float *)e->t.data)[i]));
        }
        memcpy(g, q->g, q->n * sizeof(float)); /* CPU backend: host memory */
        CHECK(compare(name, g, e->t.data, q->n, GRAD_ATOL, GRAD_FLOOR, GRAD_RTOL, 1));
        g[q->n / 2] += (float)(1e-3 * scale);
        printf("  %s with one entry moved by 1e-3 max|ref| (must be reported):\n", name);
        CHECK(!compare(name, g, e->t.data, q->n, GRAD_ATOL, GRAD_FLOOR, GRAD_RTOL, 1));
        free(g);
    }
exit:
    mmp_ckpt_fini(&c);
    model_fini(&m);
}

/* ---- --emit: what make_golden.py feeds PyTorch ------------------------------- */

static mmp_err write_batch(const mmp_plan *plan, int vocab, const char *path)
{
    int B = plan->train.batch, S = plan->data.image_size, T = plan->data.max_text_len;
    mmp_tensor images, ids, mask;
    int64_t ishape[4] = {B, 3, S, S}, tshape[2] = {B, T};
    MMP_TRY(mmp_tensor_init(&images, MMP_F32, 4, ishape));
    MMP_TRY(mmp_tensor_init(&ids, MMP_I32, 2, tshape));
    MMP_TRY(mmp_tensor_init(&mask, MMP_F32, 2, tshape));
    mmp_rng r;
    mmp_rng_seed(&r, GOLDEN_BATCH_SEED, 0);
    float *im = images.data, *mk = mask.data;
    int32_t *id = ids.data;
    for (int64_t i = 0; i < mmp_tensor_numel(&images); i++) {
        im[i] = mmp_rng_normal(&r); /* a normalised image is about N(0, 1) */
    }
    for (int b = 0; b < B; b++) {
        /* [CLS] = 1 first, 0 pads; lengths from 2 to T, sample 0 full */
        int len = b == 0 ? T : 2 + (int)mmp_rng_below(&r, (uint64_t)(T - 1));
        for (int t = 0; t < T; t++) {
            id[b * T + t] = t == 0 ? 1 : t < len ? 2 + (int32_t)mmp_rng_below(&r, vocab - 2) : 0;
            mk[b * T + t] = t < len ? 1.0f : 0.0f;
        }
    }
    mmp_st_item items[] = {{"batch.images", &images}, {"batch.ids", &ids}, {"batch.mask", &mask}};
    mmp_err e = mmp_safetensors_write(path, items, 3, NULL);
    mmp_tensor_fini(&images);
    mmp_tensor_fini(&ids);
    mmp_tensor_fini(&mask);
    return e;
}

static mmp_err emit(const char *dir)
{
    model m;
    char step_dir[1100], path[1400];
    mmp_err e = model_init(&m, GOLDEN_VOCAB);
    const char *files[3] = {"image.ckpt", "text.ckpt", "fusion.ckpt"};
    mmp_ckpt_step_dir(step_dir, sizeof step_dir, dir, 0);
    if (e == MMP_OK) {
        e = mmp_mkdirs(step_dir);
    }
    for (int k = 0; k < 3 && e == MMP_OK; k++) {
        snprintf(path, sizeof path, "%s/%s", step_dir, files[k]);
        e = mmp_params_save(m.tables[k], path);
    }
    if (e == MMP_OK && (e = mmp_ckpt_write_meta(step_dir, 0, &m.plan)) == MMP_OK &&
        (e = mmp_ckpt_mark_latest(dir, 0)) == MMP_OK) {
        snprintf(path, sizeof path, "%s/batch.safetensors", dir);
        e = write_batch(&m.plan, GOLDEN_VOCAB, path);
    }
    if (e == MMP_OK) {
        snprintf(path, sizeof path, "%s/plan.json", dir);
        e = mmp_plan_write_json(&m.plan, path);
    }
    model_fini(&m);
    return e;
}

static const mmp_test_case CASES[] = {
    MMP_TEST_CASE(test_matches_pytorch),
    MMP_TEST_CASE(test_batch_scope_matches_pytorch),
    MMP_TEST_CASE(test_wrong_gradient_fails),
};

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--emit") == 0) {
        if (emit(argv[2]) != MMP_OK) {
            fprintf(stderr, "test_golden --emit: %s\n", mmp_last_error());
            return 1;
        }
        return 0;
    }
    return MMP_TEST_MAIN("test_golden", CASES, argc, argv);
}
