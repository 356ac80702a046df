/* The image branch: a ResNet of BasicBlocks for small images, cut into
 * numbered layers so a pipeline can place any range [first, last) of it.
 *
 *   layer 0        stem: conv3x3/1 (3 -> channels[0]) + BN + ReLU [+ maxpool 3x3/2]
 *   layers 1..K    one BasicBlock each; stage s holds blocks[s] of them with
 *                  channels[s], the first block of stage s > 0 has stride 2:
 *                  relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the
 *                  shortcut a 1x1 conv + BN when the stride or width changes
 *   layer K+1      projection: the final map (B,C,h,w) read as Ni = h*w tokens
 *                  (B,Ni,C), linear C -> D with bias, plus a learned position
 *                  embedding (Ni,D)
 *
 * Memory: the net owns the parameters plus one workspace (im2col scratch,
 * gradient temporaries) shared by all its acts, sized by the largest
 * max_batch any acts was created with; an acts owns the activations one
 * micro-batch's backward needs. Neither forward nor backward allocates, so a
 * net and all its acts must be used by one thread at a time.
 *
 * Batch-norm running statistics update in place in a training forward, unless
 * a statistics row is set (mmp_image_net_bn_log): replicas of a sub-stage log
 * each micro-batch's statistics there and replay them all in order later.
 *
 * Everything computes on the params' backend (kernels/backend.h): the net's
 * workspace, every acts, and forward's in/out and backward's dout/din are that
 * backend's memory. The batch-norm statistics row (mmp_image_net_bn_log) and
 * the replayed rows are HOST memory: a training forward copies the row it
 * wrote on the backend to the host, and a replay updates a host copy of the
 * running statistics and copies it back.
 *
 * Must never: allocate or fail in forward/backward, read the caller's input
 * after forward returns (it is copied: a pipeline's receive slot is reused
 * before the backward runs), or depend on which layers are in range for any
 * value it computes (a cut must be bitwise the whole net). */
#include "nn/model.h"
#include "nn/lowp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/image_layers.h"

/* ---- geometry --------------------------------------------------------------- */

static mmp_err check_plan(const mmp_plan *plan)
{
    int n_stages = plan->model.image.n_stages;
    if (n_stages < 1 || n_stages > MMP_MAX_IMAGE_STAGES) {
        return mmp_errorf(MMP_ERR_INVALID, "image branch: %d stages (must be 1..%d)", n_stages,
                          MMP_MAX_IMAGE_STAGES);
    }
    for (int s = 0; s < n_stages; s++) {
        int blocks = plan->model.image.blocks[s], channels = plan->model.image.channels[s];
        if (blocks < 1 || channels < 1) {
            return mmp_errorf(MMP_ERR_INVALID, "image branch stage %d: %d blocks of %d channels",
                              s + 1, blocks, channels);
        }
    }
    if (plan->data.image_size < 1 || plan->model.width < 1) {
        return mmp_errorf(MMP_ERR_INVALID, "image branch: image size %d, width %d",
                          plan->data.image_size, plan->model.width);
    }
    return MMP_OK;
}

/* Output size of a k x k window with stride and padding k / 2. */
static int conv_out(int n, int k, int stride)
{
    return (n + 2 * (k / 2) - k) / stride + 1;
}

static int count_layers(const mmp_plan *plan)
{
    int n = 2;
    for (int s = 0; s < plan->model.image.n_stages; s++) {
        n += plan->model.image.blocks[s];
    }
    return n;
}

/* Fills the geometry of all count_layers(plan) layers (parameter indices come later,
 * from add_layer_params, for the layers in range only). */
static void describe_layers(const mmp_plan *plan, image_layer *layers)
{
    const int *blocks = plan->model.image.blocks, *channels = plan->model.image.channels;
    int S = plan->data.image_size;
    int n = 0;
    image_layer *l = &layers[n++];
    memset(l, 0, sizeof *l);
    l->kind = LAYER_STEM;
    snprintf(l->name, sizeof l->name, "image.stem");
    l->in_c = STEM_IN_CHANNELS, l->in_h = S, l->in_w = S;
    l->c = channels[0], l->h = S, l->w = S;
    l->stride = 1;
    l->pool = plan->model.image.stem_pool != 0;
    l->out_c = l->c;
    l->out_h = l->pool ? conv_out(l->h, 3, 2) : l->h;
    l->out_w = l->pool ? conv_out(l->w, 3, 2) : l->w;
    for (int s = 0; s < plan->model.image.n_stages; s++) {
        for (int b = 0; b < blocks[s]; b++) {
            const image_layer *prev = &layers[n - 1];
            l = &layers[n++];
            memset(l, 0, sizeof *l);
            l->kind = LAYER_BLOCK;
            snprintf(l->name, sizeof l->name, "image.layer%d.%d", s + 1, b);
            l->in_c = prev->out_c, l->in_h = prev->out_h, l->in_w = prev->out_w;
            l->stride = s > 0 && b == 0 ? 2 : 1;
            l->c = channels[s];
            l->h = conv_out(l->in_h, 3, l->stride);
            l->w = conv_out(l->in_w, 3, l->stride);
            l->out_c = l->c, l->out_h = l->h, l->out_w = l->w;
            l->down = l->stride != 1 || l->in_c != l->c;
        }
    }
    const image_layer *prev = &layers[n - 1];
    l = &layers[n++];
    memset(l, 0, sizeof *l);
    l->kind = LAYER_PROJ;
    snprintf(l->name, sizeof l->name, "image.proj");
    l->in_c = prev->out_c, l->in_h = prev->out_h, l->in_w = prev->out_w;
    l->c = l->in_c, l->h = l->in_h, l->w = l->in_w;
    l->out_c = plan->model.width, l->out_h = l->in_h * l->in_w, l->out_w = 1;
}

int mmp_image_net_layers(const mmp_plan *plan)
{
    return check_plan(plan) == MMP_OK ? count_layers(plan) : 0;
}

int mmp_image_net_tokens(const mmp_plan *plan)
{
    if (check_plan(plan) != MMP_OK) {
        return 0;
    }
    /* The stem keeps the size, its pool and each stage after the first halve it. */
    int h = plan->data.image_size;
    if (plan->model.image.stem_pool) {
        h = conv_out(h, 3, 2);
    }
    for (int s = 1; s < plan->model.image.n_stages; s++) {
        h = conv_out(h, 3, 2);
    }
    return h * h;
}

/* ---- parameters ------------------------------------------------------------- */

static mmp_err add_param(mmp_params *p, int *index, const image_layer *l, const char *what,
                         int ndim, const int64_t *shape, int trainable, int decay, mmp_init init,
                         float scale)
{
    char name[MMP_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", l->name, what);
    return mmp_params_add(p, name, ndim, shape, trainable, decay, init, scale, index);
}

static mmp_err add_conv(mmp_params *p, int *index, const image_layer *l, const char *what, int OC,
                        int C, int k)
{
    int64_t shape[4] = {OC, C, k, k};
    return add_param(p, index, l, what, 4, shape, 1, 1, MMP_INIT_KAIMING, 0.0f);
}

/* prefix "bn1" declares bn1.weight, bn1.bias and the running-statistics
 * buffers; *row counts statistics-row floats, so rows follow parameter order. */
static mmp_err add_bn(mmp_params *p, bn_ref *bn, const image_layer *l, const char *prefix, int C,
                      int64_t *row)
{
    char what[32]; /* "down.bn.running_mean" at most */
    int64_t shape[1] = {C};
    bn->C = C;
    bn->row = *row;
    *row += 2 * (int64_t)C;
    snprintf(what, sizeof what, "%s.weight", prefix);
    MMP_TRY(add_param(p, &bn->gamma, l, what, 1, shape, 1, 0, MMP_INIT_ONE, 0.0f));
    snprintf(what, sizeof what, "%s.bias", prefix);
    MMP_TRY(add_param(p, &bn->beta, l, what, 1, shape, 1, 0, MMP_INIT_ZERO, 0.0f));
    snprintf(what, sizeof what, "%s.running_mean", prefix);
    MMP_TRY(add_param(p, &bn->mean, l, what, 1, shape, 0, 0, MMP_INIT_ZERO, 0.0f));
    snprintf(what, sizeof what, "%s.running_var", prefix);
    MMP_TRY(add_param(p, &bn->var, l, what, 1, shape, 0, 0, MMP_INIT_ONE, 0.0f));
    return MMP_OK;
}

static mmp_err add_layer_params(mmp_params *p, image_layer *l, int64_t *row)
{
    switch (l->kind) {
    case LAYER_STEM:
        MMP_TRY(add_conv(p, &l->conv1, l, "conv.weight", l->c, l->in_c, 3));
        MMP_TRY(add_bn(p, &l->bn1, l, "bn", l->c, row));
        break;
    case LAYER_BLOCK:
        MMP_TRY(add_conv(p, &l->conv1, l, "conv1.weight", l->c, l->in_c, 3));
        MMP_TRY(add_bn(p, &l->bn1, l, "bn1", l->c, row));
        MMP_TRY(add_conv(p, &l->conv2, l, "conv2.weight", l->c, l->c, 3));
        MMP_TRY(add_bn(p, &l->bn2, l, "bn2", l->c, row));
        if (l->down) {
            MMP_TRY(add_conv(p, &l->conv_down, l, "down.conv.weight", l->c, l->in_c, 1));
            MMP_TRY(add_bn(p, &l->bn_down, l, "down.bn", l->c, row));
        }
        break;
    case LAYER_PROJ: {
        int64_t w_shape[2] = {l->out_c, l->in_c};
        int64_t b_shape[1] = {l->out_c};
        int64_t pos_shape[2] = {l->out_h, l->out_c};
        MMP_TRY(
            add_param(p, &l->proj_w, l, "weight", 2, w_shape, 1, 1, MMP_INIT_UNIFORM_FAN, 0.0f));
        MMP_TRY(add_param(p, &l->proj_b, l, "bias", 1, b_shape, 1, 0, MMP_INIT_ZERO, 0.0f));
        MMP_TRY(add_param(p, &l->proj_pos, l, "pos", 2, pos_shape, 1, 0, MMP_INIT_NORMAL, 0.02f));
        break;
    }
    }
    return MMP_OK;
}

static void *be_alloc(mmp_backend *be, size_t bytes, mmp_err *err)
{
    void *p = NULL;
    *err = be->ops->alloc(be, &p, bytes);
    return p;
}

/* ---- net -------------------------------------------------------------------- */

mmp_err mmp_image_net_create(mmp_image_net **out, const mmp_plan *plan, int first, int last,
                             uint64_t seed)
{
    return mmp_image_net_create_on(out, mmp_backend_cpu(), plan, first, last, seed);
}

mmp_err mmp_image_net_create_on(mmp_image_net **out, mmp_backend *be, const mmp_plan *plan,
                                int first, int last, uint64_t seed)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    MMP_TRY(check_plan(plan));
    int n_all = count_layers(plan);
    if (first < 0 || first >= last || last > n_all) {
        return mmp_errorf(MMP_ERR_INVALID, "image branch: layer range [%d, %d) not within [0, %d)",
                          first, last, n_all);
    }
    mmp_image_net *net = calloc(1, sizeof *net);
    if (!net) {
        return mmp_errorf(MMP_ERR_NOMEM, "image branch: net");
    }
    net->be = be;
    mmp_params_net_init(&net->params, &net->lp, be, plan->train.precision);
    net->layers = calloc((size_t)n_all, sizeof *net->layers);
    if (!net->layers) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "image branch: %d layers", n_all);
        goto fail;
    }
    net->n_all = n_all;
    net->first = first;
    net->last = last;
    describe_layers(plan, net->layers);
    for (int i = first; i < last; i++) {
        MMP_TRY_GOTO(add_layer_params(&net->params, &net->layers[i], &net->bn_row_floats), ret,
                     fail);
    }
    MMP_TRY_GOTO(mmp_params_alloc(&net->params, seed), ret, fail);
    if (net->bn_row_floats > 0) {
        net->bn_dev = be_alloc(be, (size_t)net->bn_row_floats * sizeof(float), &ret);
        net->bn_host = calloc((size_t)net->bn_row_floats, sizeof(float));
        if (ret != MMP_OK || !net->bn_host) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "batch-norm statistics row of %lld floats",
                             (long long)net->bn_row_floats);
            goto fail;
        }
    }
    *out = net;
exit:
    return ret;
fail:
    mmp_error_prefix(ret, "image branch layers [%d, %d)", first, last);
    mmp_image_net_destroy(net);
    goto exit;
}

void mmp_image_net_destroy(mmp_image_net *net)
{
    if (!net) {
        return;
    }
    mmp_params_net_fini(&net->params, &net->lp);
    free(net->layers);
    net->be->ops->free(net->be, net->ws);
    net->be->ops->free(net->be, net->bn_dev);
    free(net->bn_host);
    free(net);
}

mmp_params *mmp_image_net_params(mmp_image_net *net)
{
    return &net->params;
}

int64_t mmp_image_net_in_floats(const mmp_image_net *net)
{
    return in_floats(&net->layers[net->first]);
}

int64_t mmp_image_net_out_floats(const mmp_image_net *net)
{
    return out_floats(&net->layers[net->last - 1]);
}

/* Scratch floats of layer l's products at the training precision for batch
 * samples (the largest of its convolutions, or its projection). */
static size_t lp_floats(const image_layer *l, int batch)
{
    mmp_conv_shape s;
    if (l->kind == LAYER_PROJ) {
        return mmp_lowp_linear_floats(batch * l->out_h, l->in_c, l->out_c);
    }
    mmp_conv_shape_set(&s, batch, l->in_c, l->in_h, l->in_w, l->c, 3, 3, l->stride, 1);
    size_t f = mmp_lowp_conv2d_floats(&s);
    if (l->kind == LAYER_BLOCK) {
        mmp_conv_shape_set(&s, batch, l->c, l->h, l->w, l->c, 3, 3, 1, 1);
        size_t f2 = mmp_lowp_conv2d_floats(&s);
        f = f2 > f ? f2 : f;
    }
    return f; /* the 1x1 shortcut conv is smaller than conv1 */
}

/* Grows the shared workspace to hold batch samples (no-op when it already does). */
static mmp_err reserve_workspace(mmp_image_net *net, int batch)
{
    if (batch <= net->ws_batch) {
        return MMP_OK;
    }
    size_t per_sample = 0, scratch = 1, lp = 0;
    for (int i = net->first; i < net->last; i++) {
        const image_layer *l = &net->layers[i];
        lp = lp_floats(l, batch) > lp ? lp_floats(l, batch) : lp;
        int64_t m = in_floats(l);
        m = mid_floats(l) > m ? mid_floats(l) : m;
        m = out_floats(l) > m ? out_floats(l) : m;
        per_sample = (size_t)m > per_sample ? (size_t)m : per_sample;
        if (l->kind != LAYER_PROJ) {
            /* conv1 is the largest im2col of a layer: 3x3 over the most input channels */
            mmp_conv_shape s;
            mmp_conv_shape_set(&s, batch, l->in_c, l->in_h, l->in_w, l->c, 3, 3, l->stride, 1);
            size_t f = net->be->ops->conv2d_scratch_floats(&s);
            if (l->kind == LAYER_BLOCK) {
                mmp_conv_shape_set(&s, batch, l->c, l->h, l->w, l->c, 3, 3, 1, 1);
                size_t f2 = net->be->ops->conv2d_scratch_floats(&s);
                f = f2 > f ? f2 : f;
            }
            scratch = f > scratch ? f : scratch;
        }
    }
    size_t temp = (per_sample * (size_t)batch + 15) / 16 * 16;
    scratch = (scratch + 15) / 16 * 16;
    size_t total = scratch + (2 + GRAD_TEMPS) * temp;
    mmp_err err = mmp_lowp_reserve(&net->lp, lp);
    if (err != MMP_OK) {
        return mmp_error_prefix(err, "image branch");
    }
    float *ws = be_alloc(net->be, total * sizeof(float), &err);
    if (err != MMP_OK) {
        return mmp_error_prefix(err, "image branch: workspace of %zu bytes", total * sizeof(float));
    }
    net->be->ops->free(net->be, net->ws);
    net->ws = ws;
    net->ws_batch = batch;
    net->scratch = ws;
    for (int k = 0; k < 2; k++) {
        net->grad[k] = ws + scratch + (size_t)k * temp;
    }
    for (int k = 0; k < GRAD_TEMPS; k++) {
        net->tmp[k] = ws + scratch + (size_t)(2 + k) * temp;
    }
    return MMP_OK;
}

/* ---- acts ------------------------------------------------------------------- */

/* Hands out 64-byte aligned pieces of one block; with base NULL it only counts. */
typedef struct carver {
    char *base;
    size_t used;
} carver;

static void *carve(carver *c, size_t bytes)
{
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 63) / 64 * 64;
    return p;
}

static float *carve_f(carver *c, int64_t per_sample, int B)
{
    return carve(c, (size_t)per_sample * (size_t)B * sizeof(float));
}

/* Lays out the acts of net's range for B samples. */
static void layout_acts(mmp_image_acts *a, carver *c)
{
    const mmp_image_net *net = a->net;
    int B = a->max_batch;
    a->in = carve_f(c, mmp_image_net_in_floats(net), B);
    for (int i = net->first; i < net->last; i++) {
        const image_layer *l = &net->layers[i];
        layer_acts *la = &a->layers[i - net->first];
        int is_last = i == net->last - 1;
        memset(la, 0, sizeof *la);
        switch (l->kind) {
        case LAYER_STEM:
            la->c1 = carve_f(c, mid_floats(l), B);
            la->mean1 = carve_f(c, l->c, 1);
            la->rstd1 = carve_f(c, l->c, 1);
            if (l->pool) {
                la->a1 = carve_f(c, mid_floats(l), B);
                la->argmax = carve(c, (size_t)out_floats(l) * B * sizeof(int32_t));
                la->out = is_last ? NULL : carve_f(c, out_floats(l), B);
            } else {
                /* the ReLU output is both what backward reads and the layer's output */
                la->out = carve_f(c, out_floats(l), B);
                la->a1 = la->out;
            }
            break;
        case LAYER_BLOCK:
            la->c1 = carve_f(c, mid_floats(l), B);
            la->a1 = carve_f(c, mid_floats(l), B);
            la->c2 = carve_f(c, mid_floats(l), B);
            la->mean1 = carve_f(c, l->c, 1);
            la->rstd1 = carve_f(c, l->c, 1);
            la->mean2 = carve_f(c, l->c, 1);
            la->rstd2 = carve_f(c, l->c, 1);
            if (l->down) {
                la->cd = carve_f(c, mid_floats(l), B);
                la->mean_d = carve_f(c, l->c, 1);
                la->rstd_d = carve_f(c, l->c, 1);
            }
            la->out = carve_f(c, out_floats(l), B); /* its ReLU's backward reads it */
            break;
        case LAYER_PROJ:
            la->tok = carve_f(c, in_floats(l), B);
            la->out = is_last ? NULL : carve_f(c, out_floats(l), B);
            break;
        }
    }
}

mmp_err mmp_image_acts_create(mmp_image_acts **out, mmp_image_net *net, int max_batch)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    if (max_batch < 1) {
        return mmp_errorf(MMP_ERR_INVALID, "image branch acts: max_batch %d", max_batch);
    }
    mmp_image_acts *a = calloc(1, sizeof *a);
    if (!a) {
        return mmp_errorf(MMP_ERR_NOMEM, "image branch acts");
    }
    a->net = net;
    a->max_batch = max_batch;
    a->layers = calloc((size_t)(net->last - net->first), sizeof *a->layers);
    if (!a->layers) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "image branch acts: layer table");
        goto fail;
    }
    carver c = {0};
    layout_acts(a, &c);
    a->mem = be_alloc(net->be, c.used, &ret);
    if (ret != MMP_OK) {
        mmp_error_prefix(ret,
                         "image branch activations: %zu bytes for a micro-batch of %d samples "
                         "(train.batch / train.microbatches: more micro-batches need less)",
                         c.used, max_batch);
        goto fail;
    }
    c = (carver){.base = a->mem, .used = 0};
    layout_acts(a, &c);
    MMP_TRY_GOTO(reserve_workspace(net, max_batch), ret, fail);
    *out = a;
exit:
    return ret;
fail:
    mmp_image_acts_destroy(a);
    goto exit;
}

void mmp_image_acts_destroy(mmp_image_acts *a)
{
    if (!a) {
        return;
    }
    if (a->mem) {
        a->net->be->ops->free(a->net->be, a->mem);
    }
    free(a->layers);
    free(a);
}

/* ---- batch-norm statistics log and replay ------------------------------------- */

int64_t mmp_image_net_bn_row_floats(const mmp_image_net *net)
{
    return net->bn_row_floats;
}

void mmp_image_net_bn_log(mmp_image_net *net, float *row)
{
    net->bn_row = row;
}

/* r (C) = (1 - momentum) r + momentum x (C): the kernel's expression and
 * operand types, so a replayed row lands on the in-place update's bits. */
static void replay_one(float *r, const float *x, int C)
{
    const float momentum = BN_MOMENTUM;
    for (int c = 0; c < C; c++) {
        r[c] = (1.0f - momentum) * r[c] + momentum * x[c];
    }
}

/* Copies one batch norm's running statistics between the backend and the
 * host mirror (bn_host, in row layout): to_host 1 fetches, 0 stores. */
static void mirror_bn(mmp_image_net *net, const bn_ref *bn, int to_host)
{
    mmp_backend *be = net->be;
    float *h = net->bn_host + bn->row;
    size_t bytes = (size_t)bn->C * sizeof(float);
    if (to_host) {
        be->ops->to_host(be, h, pw(net, bn->mean), bytes);
        be->ops->to_host(be, h + bn->C, pw(net, bn->var), bytes);
    } else {
        be->ops->to_device(be, pw(net, bn->mean), h, bytes);
        be->ops->to_device(be, pw(net, bn->var), h + bn->C, bytes);
    }
}

static void replay_bn(mmp_image_net *net, const bn_ref *bn, const float *row)
{
    replay_one(net->bn_host + bn->row, row + bn->row, bn->C);
    replay_one(net->bn_host + bn->row + bn->C, row + bn->row + bn->C, bn->C);
}

/* Applies fn to every batch norm in range. */
static void each_bn(mmp_image_net *net, void (*fn)(mmp_image_net *, const bn_ref *, const void *),
                    const void *arg)
{
    for (int i = net->first; i < net->last; i++) {
        const image_layer *l = &net->layers[i];
        switch (l->kind) {
        case LAYER_STEM:
            fn(net, &l->bn1, arg);
            break;
        case LAYER_BLOCK:
            fn(net, &l->bn1, arg);
            fn(net, &l->bn2, arg);
            if (l->down) {
                fn(net, &l->bn_down, arg);
            }
            break;
        case LAYER_PROJ:
            break;
        }
    }
}

static void fetch_fn(mmp_image_net *net, const bn_ref *bn, const void *arg)
{
    (void)arg;
    mirror_bn(net, bn, 1);
}

static void store_fn(mmp_image_net *net, const bn_ref *bn, const void *arg)
{
    (void)arg;
    mirror_bn(net, bn, 0);
}

static void replay_fn(mmp_image_net *net, const bn_ref *bn, const void *row)
{
    replay_bn(net, bn, row);
}

void mmp_image_net_bn_replay(mmp_image_net *net, const float *rows, int n)
{
    if (net->bn_row_floats == 0) {
        return;
    }
    each_bn(net, fetch_fn, NULL);
    for (int k = 0; k < n; k++) {
        each_bn(net, replay_fn, rows + (size_t)k * (size_t)net->bn_row_floats);
    }
    each_bn(net, store_fn, NULL);
}
