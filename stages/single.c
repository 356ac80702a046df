/* Single-process trainer: loads micro-batches, runs image -> text -> fusion
 * forward and backward per micro-batch, accumulates gradients, clips by the
 * global norm and steps AdamW; evaluates retrieval on held-out pairs and
 * writes metrics and checkpoints. Never parallel inside: its order of
 * operations is the spec the pipeline reproduces. With `compute: simulated`
 * each micro-batch sleeps the sum of every stage's simulated costs instead,
 * the honest baseline for a simulated pipeline's speed-up. */
#include "stages/single.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/ckpt.h"
#include "common/interrupt.h"
#include "common/loss_scale.h"
#include "common/metrics.h"
#include "common/pin.h"
#include "common/progress.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "kernels/cpu.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "stages/fuse.h"

typedef struct trainer {
    const mmp_plan *plan;
    /* The device: the plan's first slot (a CUDA ordinal, or -1: the CPU
     * reference). Nets and every buffer they read or write are be's memory;
     * on a GPU the loaded batch is uploaded into d_images / d_ids / d_mask
     * and evaluation's embeddings come back through emb_dev. */
    mmp_backend *be;
    int gpu;
    float *d_images, *d_mask, *emb_dev[2];
    int32_t *d_ids;
    /* GPU: the last micro-batch of each loader, until its upload is done */
    mmp_batch *up_img, *up_txt;
    int load_failed; /* the last error came from a loader (a bad sample) */
    const char *out_dir;
    mmp_dataset *train, *val;
    mmp_image_net *img;
    mmp_text_net *txt;
    mmp_fusion_net *fus;
    mmp_image_acts *ia;
    mmp_text_acts *ta;
    mmp_fusion_acts *fa; /* for mb_max rows, or train.batch under batch scope */
    /* model.fusion.itc_scope: batch: every micro-batch's branch activations
     * are held until the fusion has seen the whole step (ia_mb[0] is ia) */
    int batch_scope;
    mmp_image_acts **ia_mb;
    mmp_text_acts **ta_mb;
    mmp_fuse_step fstep;
    int mb_max, T, S;
    int64_t img_tok_floats, txt_tok_floats;
    float *images, *mask, *img_tok, *txt_tok, *dimg, *dtxt;
    int32_t *ids;
    int64_t *samples;
    mmp_loader *img_loader, *txt_loader;
    mmp_fuse fuse;
    float *img_valid, *txt_valid;
    FILE *metrics;
    mmp_loss_scale ls;       /* fp16 loss scaling: the coordinator's arithmetic */
    mmp_sim_clock sim_clock; /* compute: simulated, as a stage's (common/progress.h) */
} trainer;

static void *xcalloc(size_t n, size_t size, mmp_err *err)
{
    void *p = calloc(n ? n : 1, size);
    if (!p && *err == MMP_OK) {
        *err = mmp_errorf(MMP_ERR_NOMEM, "trainer buffers: %zu x %zu bytes", n, size);
    }
    return p;
}

static void *balloc(mmp_backend *be, size_t bytes, mmp_err *err)
{
    void *p = NULL;
    if (*err == MMP_OK) {
        *err = be->ops->alloc(be, &p, bytes);
    }
    return p;
}

/* The batch's images, ids and mask where the nets read them: in place on
 * the CPU, uploaded on a GPU. */
static void inputs_on_device(trainer *t, int n, const float **images, const int32_t **ids,
                             const float **mask, int async)
{
    if (t->gpu < 0) {
        return;
    }
    mmp_backend *be = t->be;
    /* the loader's pinned batches go up asynchronously (handed back after
     * upload_wait, at the next get); evaluation's host buffers with a wait */
    void (*up)(mmp_backend *, void *, const void *, size_t) =
        async ? mmp_backend_upload : be->ops->to_device;
    size_t tok = (size_t)n * (size_t)t->T;
    if (images && *images) {
        up(be, t->d_images, *images, (size_t)n * 3 * (size_t)t->S * (size_t)t->S * sizeof(float));
        *images = t->d_images;
    }
    if (ids && *ids) {
        up(be, t->d_ids, *ids, tok * sizeof(int32_t));
        *ids = t->d_ids;
    }
    if (mask && *mask) {
        up(be, t->d_mask, *mask, tok * sizeof(float));
        *mask = t->d_mask;
    }
}

/* Hands the uploaded batches back to their loaders once the uploads are done. */
static void release_uploaded(trainer *t)
{
    if (t->up_img || t->up_txt) {
        mmp_backend_upload_wait(t->be);
    }
    if (t->up_img) {
        mmp_loader_release(t->img_loader, t->up_img);
    }
    if (t->up_txt) {
        mmp_loader_release(t->txt_loader, t->up_txt);
    }
    t->up_img = t->up_txt = NULL;
}

/* Micro-batch mb's image and text batches; *data_s += the time waited. */
static mmp_err get_batches(trainer *t, int step, int mb, mmp_batch **bi, mmp_batch **bt,
                           double *data_s)
{
    double t0 = mmp_now();
    release_uploaded(t);
    mmp_err e = mmp_loader_get(t->img_loader, step, mb, bi);
    if (e != MMP_OK) {
        t->load_failed = 1;
        return e;
    }
    e = mmp_loader_get(t->txt_loader, step, mb, bt);
    if (e != MMP_OK) {
        t->load_failed = 1;
        mmp_loader_release(t->img_loader, *bi);
        return e;
    }
    *data_s += mmp_now() - t0;
    return MMP_OK;
}

/* The batches back to their loaders; on a GPU only at the next
 * release_uploaded, as their uploads may be in flight. */
static void done_with_batches(trainer *t, mmp_batch *bi, mmp_batch *bt)
{
    if (t->gpu >= 0) {
        t->up_img = bi;
        t->up_txt = bt;
    } else {
        mmp_loader_release(t->img_loader, bi);
        mmp_loader_release(t->txt_loader, bt);
    }
}

static void *loader_host_alloc(void *ctx, size_t bytes)
{
    return mmp_backend_host_alloc(ctx, bytes);
}

static void loader_host_free(void *ctx, void *p)
{
    mmp_backend_host_free(ctx, p);
}

static void trainer_fini(trainer *t)
{
    release_uploaded(t);
    mmp_loader_destroy(t->img_loader);
    mmp_loader_destroy(t->txt_loader);
    mmp_fuse_fini(&t->fuse);
    mmp_fuse_step_fini(&t->fstep);
    mmp_backend *be = t->be ? t->be : mmp_backend_cpu();
    void *dev[] = {t->img_tok, t->txt_tok, t->dimg,       t->dtxt,      t->d_images,
                   t->d_mask,  t->d_ids,   t->emb_dev[0], t->emb_dev[1]};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) {
        be->ops->free(be, dev[i]);
    }
    free(t->img_valid);
    free(t->txt_valid);
    for (int i = 1; t->ia_mb && i < t->plan->train.microbatches; i++) {
        mmp_image_acts_destroy(t->ia_mb[i]);
    }
    for (int i = 1; t->ta_mb && i < t->plan->train.microbatches; i++) {
        mmp_text_acts_destroy(t->ta_mb[i]);
    }
    free(t->ia_mb);
    free(t->ta_mb);
    mmp_image_acts_destroy(t->ia);
    mmp_text_acts_destroy(t->ta);
    mmp_fusion_acts_destroy(t->fa);
    mmp_image_net_destroy(t->img);
    mmp_text_net_destroy(t->txt);
    mmp_fusion_net_destroy(t->fus);
    mmp_dataset_close(t->train);
    mmp_dataset_close(t->val);
    free(t->images);
    free(t->mask);
    free(t->ids);
    free(t->samples);
    if (t->metrics) {
        fclose(t->metrics);
    }
    mmp_backend_destroy(t->be); /* last: its memory is freed above */
    t->be = NULL;
}

static mmp_err trainer_init(trainer *t, const mmp_plan *plan, const char *out_dir)
{
    memset(t, 0, sizeof *t);
    t->plan = plan;
    t->out_dir = out_dir;
    mmp_loss_scale_init(&t->ls, plan);
    uint64_t seed = (uint64_t)plan->job.seed;
    MMP_TRY(mmp_dataset_open(&t->train, plan->data.manifest, plan->data.vocab, plan));
    if (mmp_plan_evaluates(plan)) { /* only then is there a validation set to read */
        MMP_TRY(mmp_dataset_open(&t->val, plan->data.val_manifest, plan->data.vocab, plan));
    }
    int V = mmp_dataset_vocab_size(t->train);
    t->gpu = mmp_plan_slot_device(plan, 0);
    t->be = mmp_backend_cpu(); /* the CPU reference, unless the plan's first device is a GPU */
    if (t->gpu >= 0) {
#ifdef MMP_HAVE_CUDA
        MMP_TRY(mmp_backend_create_cuda(&t->be, t->gpu));
        MMP_INFO("single-process training on cuda:%d", t->gpu);
#else
        return mmp_errorf(MMP_ERR_INVALID,
                          "the plan's first device is cuda:%d, but this mmpipe "
                          "was built without CUDA",
                          t->gpu);
#endif
    }
    mmp_backend *be = t->be;
    MMP_TRY(mmp_image_net_create_on(&t->img, be, plan, 0, mmp_image_net_layers(plan), seed));
    MMP_TRY(mmp_text_net_create_on(&t->txt, be, plan, V, 0, mmp_text_net_layers(plan), seed));
    MMP_TRY(mmp_fusion_net_create_on(&t->fus, be, plan, seed));
    t->mb_max = mmp_plan_mb_size(plan, 0);
    t->batch_scope =
        plan->model.fusion.itc_scope == MMP_ITC_BATCH && plan->compute != MMP_COMPUTE_SIMULATED;
    /* the fusion runs over a micro-batch, or over the whole batch at once */
    int fusion_rows = t->batch_scope ? plan->train.batch : t->mb_max;
    MMP_TRY(mmp_image_acts_create(&t->ia, t->img, t->mb_max));
    MMP_TRY(mmp_text_acts_create(&t->ta, t->txt, t->mb_max));
    MMP_TRY(mmp_fusion_acts_create(&t->fa, t->fus, fusion_rows));
    if (t->batch_scope) {
        int m = plan->train.microbatches;
        t->ia_mb = calloc((size_t)m, sizeof *t->ia_mb);
        t->ta_mb = calloc((size_t)m, sizeof *t->ta_mb);
        if (!t->ia_mb || !t->ta_mb) {
            return mmp_errorf(MMP_ERR_NOMEM, "trainer: activations of %d micro-batches", m);
        }
        t->ia_mb[0] = t->ia;
        t->ta_mb[0] = t->ta;
        for (int i = 1; i < m; i++) {
            MMP_TRY(mmp_image_acts_create(&t->ia_mb[i], t->img, t->mb_max));
            MMP_TRY(mmp_text_acts_create(&t->ta_mb[i], t->txt, t->mb_max));
        }
    }
    t->T = plan->data.max_text_len;
    t->S = plan->data.image_size;
    t->img_tok_floats = mmp_image_net_out_floats(t->img);
    t->txt_tok_floats = mmp_text_net_out_floats(t->txt);
    size_t n = (size_t)t->mb_max;
    mmp_err err = MMP_OK;
    t->images = xcalloc(n * 3 * (size_t)t->S * (size_t)t->S, sizeof(float), &err);
    t->mask = xcalloc(n * (size_t)t->T, sizeof(float), &err);
    t->ids = xcalloc(n * (size_t)t->T, sizeof(int32_t), &err);
    t->img_tok = balloc(be, n * (size_t)t->img_tok_floats * sizeof(float), &err);
    t->dimg = balloc(be, n * (size_t)t->img_tok_floats * sizeof(float), &err);
    t->txt_tok = balloc(be, n * (size_t)t->txt_tok_floats * sizeof(float), &err);
    t->dtxt = balloc(be, n * (size_t)t->txt_tok_floats * sizeof(float), &err);
    if (t->gpu >= 0) {
        size_t emb = n * (size_t)mmp_fusion_embed_dim(t->fus) * sizeof(float);
        t->d_images = balloc(be, n * 3 * (size_t)t->S * (size_t)t->S * sizeof(float), &err);
        t->d_mask = balloc(be, n * (size_t)t->T * sizeof(float), &err);
        t->d_ids = balloc(be, n * (size_t)t->T * sizeof(int32_t), &err);
        t->emb_dev[0] = balloc(be, emb, &err);
        t->emb_dev[1] = balloc(be, emb, &err);
    }
    t->samples = xcalloc(n, sizeof(int64_t), &err);
    t->img_valid = xcalloc(n, sizeof(float), &err);
    t->txt_valid = xcalloc(n, sizeof(float), &err);
    MMP_TRY(err);
    if (t->batch_scope) {
        MMP_TRY(mmp_fuse_step_init(&t->fstep, be, fusion_rows, (size_t)t->img_tok_floats, t->T,
                                   plan->model.width));
    }
    return mmp_fuse_init(&t->fuse, be, fusion_rows, (size_t)t->img_tok_floats, t->T,
                         plan->model.width);
}

/* Retrieval recall@1 both ways over the first val_samples pairs, with the
 * embeddings ITC compares. Ties count against the model. Bad pairs follow
 * data.on_bad_sample: under skip they are left out of both sides (and
 * counted in the log), as training leaves them out of the loss. */
/* What crosses between a branch and fusion travels in the training
 * precision in the pipeline (stages/worker_internal.h, chan): the image and
 * text outputs (n samples) and their gradients, rounded here at the same
 * points so that one process computes what the stages compute. */
static void branch_outputs_lp(trainer *t, int n, float *img, float *txt)
{
    mmp_precision p = t->plan->train.precision;
    if (p != MMP_PREC_FP32) {
        t->be->ops->round_lp(t->be, img, img, (size_t)n * (size_t)t->img_tok_floats, p);
        t->be->ops->round_lp(t->be, txt, txt, (size_t)n * (size_t)t->txt_tok_floats, p);
    }
}

/* Runs both branches on n samples of host inputs (train: batch statistics
 * and the inputs' copies asynchronous) into t->img_tok and t->txt_tok.
 * Returns the mask where the fusion stage reads it (the device's copy when
 * there is a device). */
static const float *branches_forward(trainer *t, int n, const float *images, const int32_t *ids,
                                     const float *mask, int train)
{
    inputs_on_device(t, n, &images, &ids, &mask, train);
    mmp_image_net_forward(t->img, t->ia, images, n, train, t->img_tok);
    mmp_text_net_forward(t->txt, t->ta, ids, NULL, mask, n, t->txt_tok);
    branch_outputs_lp(t, n, t->img_tok, t->txt_tok);
    return mask;
}

static mmp_err evaluate(trainer *t, double *i2t, double *t2i)
{
    int64_t nv = mmp_dataset_size(t->val);
    if (nv > t->plan->data.val_samples) {
        nv = t->plan->data.val_samples;
    }
    if (t->plan->compute == MMP_COMPUTE_SIMULATED) {
        *i2t = *t2i = 0; /* no embeddings to compare */
        return MMP_OK;
    }
    int E = mmp_fusion_embed_dim(t->fus);
    mmp_err err = MMP_OK;
    float *ie = xcalloc((size_t)nv * (size_t)E, sizeof(float), &err);
    float *te = xcalloc((size_t)nv * (size_t)E, sizeof(float), &err);
    uint8_t *valid = xcalloc((size_t)t->mb_max, 1, &err);
    int64_t kept = 0;
    if (err != MMP_OK) {
        goto exit;
    }
    for (int64_t s = 0; s < nv; s += t->mb_max) {
        int n = (int)(nv - s < t->mb_max ? nv - s : t->mb_max);
        for (int i = 0; i < n; i++) {
            t->samples[i] = s + i;
        }
        err =
            mmp_dataset_load_valid(t->val, t->samples, n, t->images, t->ids, t->mask, valid, NULL);
        if (err != MMP_OK) {
            goto exit;
        }
        const float *mask = branches_forward(t, n, t->images, t->ids, t->mask, 0);
        float *ih = ie + kept * E, *th = te + kept * E;
        mmp_fusion_net_embed(t->fus, t->fa, t->img_tok, t->txt_tok, mask, n,
                             t->emb_dev[0] ? t->emb_dev[0] : ih,
                             t->emb_dev[1] ? t->emb_dev[1] : th);
        if (t->emb_dev[0]) {
            t->be->ops->to_host(t->be, ih, t->emb_dev[0], (size_t)n * E * sizeof(float));
            t->be->ops->to_host(t->be, th, t->emb_dev[1], (size_t)n * E * sizeof(float));
        }
        int64_t base = kept;
        for (int i = 0; i < n; i++) { /* keep the good rows, in order */
            if (valid[i]) {
                memmove(ie + kept * E, ie + (base + i) * E, (size_t)E * sizeof(float));
                memmove(te + kept * E, te + (base + i) * E, (size_t)E * sizeof(float));
                kept++;
            }
        }
    }
    if (mmp_backend_error(t->be) != MMP_OK) {
        /* a failed device op: no recall from what it left (a CPU never fails) */
        err = mmp_error_prefix(mmp_backend_error(t->be), "evaluation on cuda:%d", t->gpu);
        goto exit;
    }
    if (kept < nv) {
        MMP_WARN("evaluation: %lld of %lld validation pairs skipped (bad data, "
                 "data.on_bad_sample: skip)",
                 (long long)(nv - kept), (long long)nv);
    }
    if (kept == 0) {
        *i2t = *t2i = 0;
        goto exit;
    }
    err = mmp_retrieval_r1(ie, te, (int)kept, E, i2t, t2i);
exit:
    free(ie);
    free(te);
    free(valid);
    return err;
}

static mmp_err write_params(const char *dir, const char *file, mmp_params *p)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return mmp_params_save(p, path);
}

static mmp_err write_checkpoint(trainer *t, int steps_done)
{
    char dir[1100];
    MMP_TRY(mmp_ckpt_step_begin(t->out_dir, steps_done, dir, sizeof dir));
    MMP_TRY(write_params(dir, "image.ckpt", mmp_image_net_params(t->img)));
    MMP_TRY(write_params(dir, "text.ckpt", mmp_text_net_params(t->txt)));
    MMP_TRY(write_params(dir, "fusion.ckpt", mmp_fusion_net_params(t->fus)));
    MMP_TRY(mmp_ckpt_write_meta_scaled(dir, steps_done, t->plan, &t->ls));
    MMP_TRY(mmp_ckpt_mark_latest(t->out_dir, steps_done));
    return mmp_ckpt_prune(t->out_dir, steps_done, t->plan->train.ckpt_keep);
}

/* Simulated compute of one micro-batch of n samples: what the three whole
 * branch stages would take one after the other. */
static double sim_ms(const mmp_plan *plan, int step, int n, int backward)
{
    return mmp_plan_sim_ms(plan, MMP_BRANCH_IMAGE, 0, mmp_plan_image_layers(plan), n, step,
                           backward, 0) +
           mmp_plan_sim_ms(plan, MMP_BRANCH_TEXT, 0, mmp_plan_text_layers(plan), n, step, backward,
                           0) +
           mmp_plan_sim_ms(plan, MMP_BRANCH_FUSION, 0, 0, n, step, backward, 0);
}

/* n flags of a batch as floats (the form the pipeline's messages carry). */
static void valid_floats(float *dst, const mmp_batch *b)
{
    for (int i = 0; i < b->n; i++) {
        dst[i] = b->valid[i] ? 1.0f : 0.0f;
    }
}

/* The micro-batches of one step under model.fusion.itc_scope: batch: each
 * micro-batch's branch forwards, their outputs gathered into the step's rows
 * (stages/fuse.h, mmp_fuse_step); the fusion forward and backward once over
 * the whole batch; then each micro-batch's branch backwards in ascending
 * order. The pipeline's stages do the same arithmetic in the same order
 * (stages/worker_exec.c), so they still match this bitwise. */
static mmp_err batch_scope_step(trainer *t, int step, mmp_loss_parts *out, double *data_s,
                                int *skipped, float loss_mult)
{
    const mmp_plan *plan = t->plan;
    int m = plan->train.microbatches;
    mmp_params *pi = mmp_image_net_params(t->img), *pt = mmp_text_net_params(t->txt),
               *pf = mmp_fusion_net_params(t->fus);
    mmp_fuse_step *fs = &t->fstep;
    size_t ir = (size_t)t->img_tok_floats, tr = (size_t)t->txt_tok_floats;
    mmp_fuse_step_begin(fs, 0);
    for (int mb = 0; mb < m; mb++) {
        mmp_batch *bi, *bt;
        MMP_TRY(get_batches(t, step, mb, &bi, &bt, data_s));
        int n = bi->n;
        size_t off = (size_t)mmp_plan_mb_offset(plan, mb);
        valid_floats(t->img_valid, bi);
        valid_floats(t->txt_valid, bt);
        const float *images = bi->images, *mask = bt->mask;
        const int32_t *ids = bt->ids;
        inputs_on_device(t, n, &images, &ids, &mask, 1);
        float *img_out = fs->img + off * ir, *txt_out = fs->txt + off * tr;
        mmp_image_net_forward(t->img, t->ia_mb[mb], images, n, 1, img_out);
        mmp_text_net_forward(t->txt, t->ta_mb[mb], ids, NULL, mask, n, txt_out);
        branch_outputs_lp(t, n, img_out, txt_out);
        mmp_fuse_step_put(fs, (int)off, n, NULL, NULL, mask, t->img_valid, t->txt_valid);
        done_with_batches(t, bi, bt);
    }
    mmp_params_mb_begin(pf);
    mmp_fuse_step_run(fs, &t->fuse, t->fus, t->fa, loss_mult, out, skipped);
    mmp_params_mb_end(pf);
    for (int mb = 0; mb < m; mb++) {
        int n = mmp_plan_mb_size(plan, mb);
        size_t off = (size_t)mmp_plan_mb_offset(plan, mb);
        float *dimg = fs->dimg + off * ir, *dtxt = fs->dtxt + off * tr;
        branch_outputs_lp(t, n, dimg, dtxt);
        mmp_params_mb_begin(pi);
        mmp_params_mb_begin(pt);
        mmp_text_net_backward(t->txt, t->ta_mb[mb], dtxt, n, NULL);
        mmp_image_net_backward(t->img, t->ia_mb[mb], dimg, n, NULL);
        mmp_params_mb_end(pi);
        mmp_params_mb_end(pt);
    }
    return MMP_OK;
}

/* One step; *step_skipped: the optimizer step was skipped (an fp16
 * overflow, common/loss_scale.h). */
static mmp_err train_step(trainer *t, int step, mmp_loss_parts *out, double *grad_norm,
                          double *data_s, int *skipped, int *step_skipped)
{
    const mmp_plan *plan = t->plan;
    int B = plan->train.batch, m = plan->train.microbatches;
    mmp_params *pi = mmp_image_net_params(t->img), *pt = mmp_text_net_params(t->txt),
               *pf = mmp_fusion_net_params(t->fus);
    /* a step cut short puts back the running statistics it moved (keep_trained) */
    MMP_TRY(mmp_params_buffers_mark(pi));
    mmp_params_zero_grad(pi);
    mmp_params_zero_grad(pt);
    mmp_params_zero_grad(pf);
    memset(out, 0, sizeof *out);
    *skipped = 0;
    float loss_mult = mmp_loss_scale_grad_mult(t->ls.scale, plan, step);
    if (t->batch_scope) {
        MMP_TRY(batch_scope_step(t, step, out, data_s, skipped, loss_mult));
        m = 0; /* the micro-batches ran there */
    }
    for (int mb = 0; mb < m; mb++) {
        /* Two loaders, one per modality, as the two branch stages have: a bad
         * image and a bad caption are flagged (and zeroed) each on its side. */
        mmp_batch *bi, *bt;
        MMP_TRY(get_batches(t, step, mb, &bi, &bt, data_s));
        int n = bi->n, skip = 0;
        if (plan->compute == MMP_COMPUTE_SIMULATED) {
            mmp_loader_release(t->img_loader, bi);
            mmp_loader_release(t->txt_loader, bt);
            /* the loss stays 0, the gradients 0 */
            mmp_sim_sleep(&t->sim_clock, sim_ms(plan, step, n, 0));
            mmp_sim_sleep(&t->sim_clock, sim_ms(plan, step, n, 1));
            continue;
        }
        valid_floats(t->img_valid, bi);
        valid_floats(t->txt_valid, bt);
        mmp_params_mb_begin(pi); /* each micro-batch's gradients apart: see nn/params.h */
        mmp_params_mb_begin(pt);
        mmp_params_mb_begin(pf);
        const float *mask = branches_forward(t, n, bi->images, bt->ids, bt->mask, 1);
        mmp_fuse_forward(&t->fuse, t->fus, t->fa, t->img_tok, t->txt_tok, mask, t->img_valid,
                         t->txt_valid, n, B, out, &skip);
        done_with_batches(t, bi, bt);
        mmp_fuse_backward(&t->fuse, t->fus, t->fa, B, loss_mult, t->dimg, t->dtxt);
        branch_outputs_lp(t, n, t->dimg, t->dtxt);
        mmp_text_net_backward(t->txt, t->ta, t->dtxt, n, NULL);
        mmp_image_net_backward(t->img, t->ia, t->dimg, n, NULL);
        mmp_params_mb_end(pi);
        mmp_params_mb_end(pt);
        mmp_params_mb_end(pf);
        *skipped += skip;
    }
    mmp_params_grad_finish(pi);
    mmp_params_grad_finish(pt);
    mmp_params_grad_finish(pf);
    mmp_params_grad_unscale(pi, t->ls.scale);
    mmp_params_grad_unscale(pt, t->ls.scale);
    mmp_params_grad_unscale(pf, t->ls.scale);
    if (mmp_backend_error(t->be) != MMP_OK) {
        return mmp_error_prefix(mmp_backend_error(t->be), "step %d on cuda:%d", step + 1, t->gpu);
    }
    /* The global norm sums the stages in a fixed order (image, text, fusion),
     * as the pipeline's coordinator does. */
    double sumsq =
        mmp_params_grad_sumsq(pi) + mmp_params_grad_sumsq(pt) + mmp_params_grad_sumsq(pf);
    *grad_norm = sqrt(sumsq);
    *step_skipped = mmp_loss_scale_update(&t->ls, plan, sumsq);
    /* a skipped fp16 step's loss may be inf or NaN too (an overflow in the
     * forward), as in the pipeline, whose coordinator judges the norm only */
    if (!*step_skipped && (!isfinite(*grad_norm) || !isfinite(out->loss))) {
        return mmp_errorf(MMP_ERR_DATA, "step %d: loss or gradient is not finite (loss %g)",
                          step + 1, (double)out->loss);
    }
    if (*step_skipped) {
        return MMP_OK; /* the caller logs it */
    }
    float coef = mmp_clip_coef(plan, *grad_norm);
    float lr = mmp_lr_at(plan, step);
    int opt_step = mmp_loss_scale_opt_step(&t->ls, step);
    mmp_optim_step(pi, plan, opt_step, lr, coef);
    mmp_optim_step(pt, plan, opt_step, lr, coef);
    mmp_optim_step(pf, plan, opt_step, lr, coef);
    return MMP_OK;
}

/* A bad sample (data.on_bad_sample: fail) stopped step `step` before its
 * optimizer step: the running statistics go back to the end of the step
 * before and, unless a checkpoint holds that state already, it is
 * checkpointed, so the run resumes there once the sample is mended (the
 * pipeline keeps it the same way: stages/worker.c hold). Returns err with
 * its message saying so. */
static mmp_err keep_trained(trainer *t, int step, mmp_err err)
{
    char msg[2048], dir[1200];
    snprintf(msg, sizeof msg, "%s", mmp_last_error());
    mmp_params_buffers_rewind(mmp_image_net_params(t->img));
    if (step == 0) {
        return mmp_errorf(err, "%s", msg); /* nothing trained */
    }
    int latest = -1;
    if (mmp_ckpt_latest(t->out_dir, dir, sizeof dir, &latest) != MMP_OK || latest != step) {
        MMP_INFO("keeping what was trained: checkpointing step %d", step);
        if (write_checkpoint(t, step) != MMP_OK) {
            return mmp_errorf(err, "%s (the checkpoint of step %d failed too: %s)", msg, step,
                              mmp_last_error());
        }
    }
    mmp_ckpt_step_dir(dir, sizeof dir, t->out_dir, step);
    return mmp_errorf(err,
                      "%s; what was trained is kept: step %d of %d in %s; mend what the error "
                      "names and resume with: mmpipe launch %s/plan.json --single-process "
                      "--resume %s",
                      msg, step, t->plan->job.steps, dir, t->out_dir, t->out_dir);
}

static long peak_rss_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

mmp_err mmp_train_single(const mmp_plan *plan, const char *out_dir, int resume)
{
    trainer t;
    int first_step = 0;
    mmp_err err = mmp_plan_check_runnable(plan);
    if (err != MMP_OK) {
        return err;
    }
    err = trainer_init(&t, plan, out_dir);
    if (err != MMP_OK) {
        goto exit;
    }
    if (resume) {
        char dir[1200];
        mmp_ckpt c = {0};
        err = mmp_ckpt_latest(out_dir, dir, sizeof dir, &first_step);
        if (err == MMP_OK) {
            err = mmp_ckpt_read_dir(&c, dir);
        }
        if (err == MMP_OK) {
            err = mmp_params_load(mmp_image_net_params(t.img), &c);
        }
        if (err == MMP_OK) {
            err = mmp_params_load(mmp_text_net_params(t.txt), &c);
        }
        if (err == MMP_OK) {
            err = mmp_params_load(mmp_fusion_net_params(t.fus), &c);
        }
        if (err == MMP_OK) {
            err = mmp_ckpt_read_loss_scale(dir, plan, &t.ls);
        }
        mmp_ckpt_fini(&c);
        if (err != MMP_OK) {
            goto exit;
        }
        MMP_INFO("resuming %s at step %d of %d", out_dir, first_step, plan->job.steps);
    }
    mmp_cpu_set_threads(plan->train.threads);
    if (plan->train.pin.mode != MMP_PIN_OFF) {
        char cores[256];
        if ((err = mmp_pin_apply(plan, 0, NULL, cores, sizeof cores)) != MMP_OK) {
            goto exit;
        }
        MMP_INFO("pinned to core%s %s (train.pin)", strchr(cores, ',') ? "s" : "", cores);
    }
    for (int k = 0; k < 2; k++) {
        mmp_loader_cfg lc = {.ds = t.train,
                             .plan = plan,
                             .images = k == 0,
                             .text = k == 1,
                             .first_step = first_step,
                             .last_step = plan->job.steps,
                             .depth = plan->train.microbatches + 1,
                             /* GPU: page-locked, so uploads run asynchronously */
                             .host_alloc = t.gpu >= 0 ? loader_host_alloc : NULL,
                             .host_free = t.gpu >= 0 ? loader_host_free : NULL,
                             .alloc_ctx = t.be};
        if ((err = mmp_loader_create(k == 0 ? &t.img_loader : &t.txt_loader, &lc)) != MMP_OK) {
            goto exit;
        }
    }
    char path[1200];
    snprintf(path, sizeof path, "%s/plan.json", out_dir);
    if ((err = mmp_plan_write_json(plan, path)) != MMP_OK) {
        goto exit;
    }
    if ((err = mmp_metrics_continue(out_dir, resume ? first_step : -1, &t.metrics)) != MMP_OK) {
        goto exit;
    }
    mmp_interrupt_install(1);
    MMP_INFO("single-process training: %d steps, batch %d in %d micro-batches, %lld train / "
             "%lld val samples",
             plan->job.steps, plan->train.batch, plan->train.microbatches,
             (long long)mmp_dataset_size(t.train),
             (long long)(t.val ? mmp_dataset_size(t.val) : 0));
    if (first_step > 0 && mmp_plan_eval_due(plan, first_step)) {
        /* the step resumed from had its evaluation due and its line has
         * none (the run stopped during it; the checkpoint came first) */
        off_t at = -1;
        double i2t = 0, t2i = 0;
        if ((err = mmp_metrics_eval_pending(t.metrics, first_step, &at)) != MMP_OK) {
            err = mmp_error_prefix(err, "%s/metrics.jsonl", out_dir);
            goto exit;
        }
        if (at >= 0) {
            MMP_INFO("step %d: its evaluation was cut short; evaluating it now", first_step);
            if ((err = evaluate(&t, &i2t, &t2i)) != MMP_OK ||
                (err = mmp_metrics_add_eval(t.metrics, at, i2t, t2i)) != MMP_OK) {
                goto exit;
            }
            MMP_INFO("step %d: val recall@1 image->text %.3f, text->image %.3f", first_step, i2t,
                     t2i);
        }
    }
    mmp_progress progress;
    mmp_progress_init(&progress, first_step, plan->job.steps, 10);
    double run_t0 = mmp_now(), cpu_mark = mmp_metrics_cpu_ms();
    for (int step = first_step; step < plan->job.steps; step++) {
        double t0 = mmp_now(), data_s = 0, grad_norm = 0;
        mmp_loss_parts parts;
        int skipped = 0, step_skipped = 0;
        err = train_step(&t, step, &parts, &grad_norm, &data_s, &skipped, &step_skipped);
        if (err != MMP_OK) {
            mmp_progress_end(&progress);
            if (t.load_failed) {
                err = keep_trained(&t, step, err);
            }
            goto exit;
        }
        double step_s = mmp_now() - t0, cpu_now = mmp_metrics_cpu_ms();
        /* from the previous step's record: what happens between steps counts */
        double cpu_ms = cpu_now - cpu_mark;
        cpu_mark = cpu_now;
        int done = step + 1;
        if (step_skipped) {
            mmp_progress_end(&progress);
            MMP_INFO("step %d: fp16 gradient overflow: optimizer step skipped, loss scale now %g",
                     done, (double)t.ls.scale);
        }
        double sps = plan->train.batch / step_s;
        static mmp_metrics_step rec;
        mmp_metrics_step_clear(&rec);
        rec.step = done;
        rec.loss = parts.loss;
        rec.itc_loss = parts.itc;
        rec.itm_loss = parts.itm;
        rec.lr = mmp_lr_at(plan, step);
        rec.grad_norm = grad_norm;
        rec.samples_per_s = sps;
        rec.step_ms = step_s * 1e3;
        rec.data_ms = data_s * 1e3;
        rec.skipped_samples = skipped;
        rec.bubble = 0;
        rec.loss_scale = t.ls.scale;
        rec.step_skipped = step_skipped;
        rec.cpu_ms = cpu_ms;
        rec.n_stages = 1;
        mmp_metrics_stage *st = &rec.stages[0];
        snprintf(st->name, sizeof st->name, "single");
        st->replica = 0;
        st->busy_ms = step_s * 1e3;
        st->idle_ms = 0;
        st->cpu_ms = cpu_ms;
        st->peak_mem_bytes =
            t.gpu >= 0 ? (double)mmp_backend_device_bytes(t.be) : (double)peak_rss_bytes();
        /* The step's line and checkpoint before its evaluation (as the
         * coordinator does): a validation sample that fails must not take
         * the finished step with it; the line gets the recall after. */
        off_t line_at = -1;
        if ((err = mmp_metrics_same_file(t.metrics, out_dir)) != MMP_OK) {
            goto exit;
        }
        if (fseeko(t.metrics, 0, SEEK_END) != 0 || (line_at = ftello(t.metrics)) < 0 ||
            (err = mmp_metrics_write(t.metrics, &rec)) != MMP_OK) {
            err = line_at < 0 ? mmp_errorf(MMP_ERR_IO, "metrics.jsonl: %s", strerror(errno)) : err;
            err = mmp_error_prefix(err, "%s", out_dir); /* RUN: metrics.jsonl: why */
            goto exit;
        }
        int stop = mmp_interrupt_signal() && done != plan->job.steps;
        if ((plan->train.ckpt_every > 0 && done % plan->train.ckpt_every == 0) ||
            done == plan->job.steps || stop) {
            if ((err = write_checkpoint(&t, done)) != MMP_OK) {
                goto exit;
            }
        }
        if (mmp_plan_eval_due(plan, done)) {
            double i2t = 0, t2i = 0;
            if ((err = evaluate(&t, &i2t, &t2i)) != MMP_OK) {
                goto exit;
            }
            mmp_progress_end(&progress);
            MMP_INFO("step %d: val recall@1 image->text %.3f, text->image %.3f", done, i2t, t2i);
            if ((err = mmp_metrics_same_file(t.metrics, out_dir)) != MMP_OK) {
                goto exit;
            }
            if ((err = mmp_metrics_add_eval(t.metrics, line_at, i2t, t2i)) != MMP_OK) {
                err = mmp_error_prefix(err, "%s", out_dir);
                goto exit;
            }
        }
        if (stop) {
            mmp_progress_end(&progress);
            char dir[1200];
            mmp_ckpt_step_dir(dir, sizeof dir, out_dir, done);
            MMP_INFO("stopped by %s after step %d of %d; checkpoint %s",
                     strsignal(mmp_interrupt_signal()), done, plan->job.steps, dir);
            MMP_INFO("resume with: mmpipe launch %s/plan.json --single-process --resume %s",
                     out_dir, out_dir);
            goto exit;
        }
        char text[256];
        /* two decimals below 10 samples/s: a seed-scale step on CPU is not "0 samples/s" */
        snprintf(text, sizeof text, "loss %.4f  %.*f samples/s", (double)parts.loss,
                 sps < 10 ? 2 : 0, sps);
        mmp_progress_update(&progress, done, text);
    }
    mmp_progress_end(&progress);
    /* the last step wrote it; a launch with no step left writes it here */
    if (first_step >= plan->job.steps && (err = write_checkpoint(&t, plan->job.steps)) != MMP_OK) {
        goto exit;
    }
    char summary[256];
    mmp_metrics_summary(out_dir, summary, sizeof summary);
    MMP_INFO("done: %d steps in %.1f s%s%s; checkpoint %s/ckpt/latest", plan->job.steps,
             mmp_now() - run_t0, summary[0] ? "; " : "", summary, out_dir);
exit:
    trainer_fini(&t);
    return err;
}
