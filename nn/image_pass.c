/* The image branch's forward and backward passes (nn/image.c builds the net
 * and its acts; the layout is nn/image_layers.h's). One function pair per
 * layer kind, dispatched through one table; forward and backward never
 * allocate and never fail. */
#include <stddef.h>
#include <stdint.h>

#include "nn/image_layers.h"
#include "nn/wgrad.h"

/* ---- forward ---------------------------------------------------------------- */

static void conv_fwd(mmp_image_net *net, int weight, float *out, const float *inp, int B, int C,
                     int H, int W, int OC, int k, int stride)
{
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, B, C, H, W, OC, k, k, stride, k / 2);
    mmp_lowp_conv2d_fwd(&net->lp, out, inp, pw(net, weight), NULL, &s, net->scratch);
}

static void bn_fwd(mmp_image_net *net, const bn_ref *bn, float *out, float *mean, float *rstd,
                   const float *inp, int B, int C, int HW, int train)
{
    if (train) {
        float *rm = pw(net, bn->mean), *rv = pw(net, bn->var);
        float momentum = BN_MOMENTUM;
        if (net->bn_row) {
            /* The kernel's own update with momentum 1 into zeros writes the
             * batch mean and unbiased variance exactly ((1 - 1) 0 + 1 x == x),
             * so a replay starts from the very floats an in-place update uses.
             * The row is written on the backend; forward copies it out. */
            rm = net->bn_dev + bn->row;
            rv = rm + C;
            net->be->ops->zero(net->be, rm, 2 * (size_t)C * sizeof(float));
            momentum = 1.0f;
        }
        net->be->ops->batchnorm_fwd_train(net->be, out, mean, rstd, rm, rv, inp, pw(net, bn->gamma),
                                          pw(net, bn->beta), B, C, HW, BN_EPS, momentum);
    } else {
        net->be->ops->batchnorm_fwd_infer(net->be, out, inp, pw(net, bn->gamma), pw(net, bn->beta),
                                          pw(net, bn->mean), pw(net, bn->var), B, C, HW, BN_EPS);
    }
}

// x (B, 3, S, S) -> y (B, C, h, w)
static void stem_fwd(mmp_image_net *net, const image_layer *l, layer_acts *a, const float *x,
                     float *y, int B, int train)
{
    size_t n = (size_t)B * mid_floats(l);
    conv_fwd(net, l->conv1, a->c1, x, B, l->in_c, l->in_h, l->in_w, l->c, 3, 1);
    float *act = l->pool ? a->a1 : y;
    bn_fwd(net, &l->bn1, act, a->mean1, a->rstd1, a->c1, B, l->c, l->h * l->w, train);
    mmp_backend *be = net->be;
    be->ops->relu_fwd(be, act, act, n);
    if (l->pool) {
        be->ops->maxpool2d_fwd(be, y, a->argmax, act, B, l->c, l->h, l->w, 3, 2, 1, l->out_h,
                               l->out_w);
    }
}

// x (B, in_c, in_h, in_w) -> y (B, c, h, w)
static void block_fwd(mmp_image_net *net, const image_layer *l, layer_acts *a, const float *x,
                      float *y, int B, int train)
{
    size_t n = (size_t)B * mid_floats(l);
    int HW = l->h * l->w;
    mmp_backend *be = net->be;
    conv_fwd(net, l->conv1, a->c1, x, B, l->in_c, l->in_h, l->in_w, l->c, 3, l->stride);
    bn_fwd(net, &l->bn1, a->a1, a->mean1, a->rstd1, a->c1, B, l->c, HW, train);
    be->ops->relu_fwd(be, a->a1, a->a1, n);
    conv_fwd(net, l->conv2, a->c2, a->a1, B, l->c, l->h, l->w, l->c, 3, 1);
    bn_fwd(net, &l->bn2, y, a->mean2, a->rstd2, a->c2, B, l->c, HW, train);
    const float *shortcut = x;
    if (l->down) {
        /* a gradient temporary holds the shortcut: nothing else uses it in forward */
        float *sc = net->tmp[0];
        conv_fwd(net, l->conv_down, a->cd, x, B, l->in_c, l->in_h, l->in_w, l->c, 1, l->stride);
        bn_fwd(net, &l->bn_down, sc, a->mean_d, a->rstd_d, a->cd, B, l->c, HW, train);
        shortcut = sc;
    }
    be->ops->add(be, y, y, shortcut, n);
    be->ops->relu_fwd(be, y, y, n);
}

// x (B, C, h, w) -> tokens (B, Ni, C) -> y (B, Ni, D)
static void proj_fwd(mmp_image_net *net, const image_layer *l, layer_acts *a, const float *x,
                     float *y, int B, int train)
{
    (void)train; /* no batch norm here */
    int C = l->in_c, N = l->out_h, D = l->out_c;
    mmp_backend *be = net->be;
    be->ops->transpose(be, a->tok, x, B, C, N, 0); /* (B,C,N) -> (B,N,C) */
    mmp_lowp_linear_fwd(&net->lp, y, a->tok, pw(net, l->proj_w), pw(net, l->proj_b), B * N, C, D);
    const float *pos = pw(net, l->proj_pos);
    for (int b = 0; b < B; b++) {
        float *yb = y + (size_t)b * N * D;
        be->ops->add(be, yb, yb, pos, (size_t)N * D);
    }
}

/* ---- backward --------------------------------------------------------------- */

static float *zeroed(mmp_image_net *net, float *buf, size_t n)
{
    net->be->ops->zero(net->be, buf, n * sizeof(float));
    return buf;
}

static void conv_bwd(mmp_image_net *net, int weight, float *dinp, const float *dout,
                     const float *inp, int B, int C, int H, int W, int OC, int k, int stride)
{
    mmp_conv_shape s;
    mmp_conv_shape_set(&s, B, C, H, W, OC, k, k, stride, k / 2);
    mmp_lowp_conv2d_bwd(&net->lp, dinp, pg(net, weight), NULL, dout, inp, pw(net, weight), &s,
                        net->scratch);
}

/* dinp written (batch norm's and ReLU's input gradients land in temporaries
 * that nothing else adds to: the _set ops give a zeroed buffer's bits) */
static void bn_bwd(mmp_image_net *net, const bn_ref *bn, float *dinp, const float *dout,
                   const float *inp, const float *mean, const float *rstd, int B, int C, int HW)
{
    net->be->ops->batchnorm_bwd_set(net->be, dinp, pg(net, bn->gamma), pg(net, bn->beta), dout, inp,
                                    mean, rstd, pw(net, bn->gamma), B, C, HW);
}

// dy (B, C, out_h, out_w) -> dx (B, 3, S, S) += (dx NULL: weight gradients only)
static void stem_bwd(mmp_image_net *net, const image_layer *l, const layer_acts *a, const float *x,
                     const float *dy, float *dx, int B)
{
    size_t n = (size_t)B * mid_floats(l);
    mmp_backend *be = net->be;
    const float *d_act = dy;
    if (l->pool) {
        float *d = zeroed(net, net->tmp[0], n);
        be->ops->maxpool2d_bwd(be, d, dy, a->argmax, B, l->c, l->h, l->w, 3, 2, 1, l->out_h,
                               l->out_w);
        d_act = d;
    }
    float *d_bn = net->tmp[1];
    be->ops->relu_bwd_set(be, d_bn, d_act, a->a1, n);
    float *d_conv = net->tmp[2];
    bn_bwd(net, &l->bn1, d_conv, d_bn, a->c1, a->mean1, a->rstd1, B, l->c, l->h * l->w);
    conv_bwd(net, l->conv1, dx, d_conv, x, B, l->in_c, l->in_h, l->in_w, l->c, 3, 1);
}

// dy (B, c, h, w) -> dx (B, in_c, in_h, in_w) += (dx NULL: weight gradients only)
static void block_bwd(mmp_image_net *net, const image_layer *l, const layer_acts *a, const float *x,
                      const float *dy, float *dx, int B)
{
    size_t n = (size_t)B * mid_floats(l);
    int HW = l->h * l->w;
    mmp_backend *be = net->be;
    /* d_sum: gradient of the residual sum, shared by both branches until the end */
    float *d_sum = net->tmp[0];
    be->ops->relu_bwd_set(be, d_sum, dy, a->out, n);
    float *d_c2 = net->tmp[1];
    bn_bwd(net, &l->bn2, d_c2, d_sum, a->c2, a->mean2, a->rstd2, B, l->c, HW);
    float *d_a1 = zeroed(net, net->tmp[2], n);
    conv_bwd(net, l->conv2, d_a1, d_c2, a->a1, B, l->c, l->h, l->w, l->c, 3, 1);
    float *d_bn1 = net->tmp[1];
    be->ops->relu_bwd_set(be, d_bn1, d_a1, a->a1, n);
    float *d_c1 = net->tmp[2];
    bn_bwd(net, &l->bn1, d_c1, d_bn1, a->c1, a->mean1, a->rstd1, B, l->c, HW);
    conv_bwd(net, l->conv1, dx, d_c1, x, B, l->in_c, l->in_h, l->in_w, l->c, 3, l->stride);
    if (l->down) {
        float *d_cd = net->tmp[1];
        bn_bwd(net, &l->bn_down, d_cd, d_sum, a->cd, a->mean_d, a->rstd_d, B, l->c, HW);
        conv_bwd(net, l->conv_down, dx, d_cd, x, B, l->in_c, l->in_h, l->in_w, l->c, 1, l->stride);
    } else if (dx) {
        be->ops->add(be, dx, dx, d_sum, n);
    }
}

// dy (B, Ni, D) -> dx (B, C, h, w) += (dx NULL: weight gradients only)
static void proj_bwd(mmp_image_net *net, const image_layer *l, const layer_acts *a, const float *x,
                     const float *dy, float *dx, int B)
{
    (void)x; /* the saved tokens are its input */
    int C = l->in_c, N = l->out_h, D = l->out_c;
    mmp_backend *be = net->be;
    float *d_tok = dx ? zeroed(net, net->tmp[0], (size_t)B * N * C) : NULL;
    mmp_lowp_linear_bwd(&net->lp, d_tok, pg(net, l->proj_w), pg(net, l->proj_b), dy, a->tok,
                        pw(net, l->proj_w), B * N, C, D);
    float *d_pos = pg(net, l->proj_pos);
    for (int b = 0; b < B; b++) {
        be->ops->add(be, d_pos, d_pos, dy + (size_t)b * N * D, (size_t)N * D);
    }
    if (!dx) {
        return;
    }
    be->ops->transpose(be, dx, d_tok, B, N, C, 1); /* (B,N,C) -> (B,C,N), += */
}

/* ---- the passes: one forward and one backward per layer kind --------------- */
static const struct {
    void (*fwd)(mmp_image_net *net, const image_layer *l, layer_acts *a, const float *x, float *y,
                int B, int train);
    void (*bwd)(mmp_image_net *net, const image_layer *l, const layer_acts *a, const float *x,
                const float *dy, float *dx, int B);
} passes[] = {
    [LAYER_STEM] = {stem_fwd, stem_bwd},
    [LAYER_BLOCK] = {block_fwd, block_bwd},
    [LAYER_PROJ] = {proj_fwd, proj_bwd},
};

void mmp_image_net_forward(mmp_image_net *net, mmp_image_acts *acts, const float *in, int B,
                           int train, float *out)
{
    // in (B, in_floats), out (B, out_floats)
    MMP_ASSERT(acts->net == net && B >= 1 && B <= acts->max_batch);
    acts->batch = B;
    acts->trained = train != 0;
    mmp_backend *be = net->be;
    be->ops->copy(be, acts->in, in, sizeof(float) * (size_t)B * mmp_image_net_in_floats(net));
    const float *x = acts->in;
    for (int i = net->first; i < net->last; i++) {
        const image_layer *l = &net->layers[i];
        layer_acts *a = &acts->layers[i - net->first];
        float *y = a->out ? a->out : out;
        passes[l->kind].fwd(net, l, a, x, y, B, train);
        x = y;
    }
    if (x != out) {
        be->ops->copy(be, out, x, sizeof(float) * (size_t)B * mmp_image_net_out_floats(net));
    }
    if (train && net->bn_row && net->bn_row_floats > 0) {
        be->ops->to_host(be, net->bn_row, net->bn_dev, (size_t)net->bn_row_floats * sizeof(float));
    }
}

void mmp_image_net_backward(mmp_image_net *net, mmp_image_acts *acts, const float *dout, int B,
                            float *din)
{
    // dout (B, out_floats), din (B, in_floats) += or NULL
    MMP_ASSERT(acts->net == net && B == acts->batch && acts->trained);
    const float *dy = dout;
    for (int i = net->last - 1; i >= net->first; i--) {
        const image_layer *l = &net->layers[i];
        const layer_acts *a = &acts->layers[i - net->first];
        const float *x = i == net->first ? acts->in : acts->layers[i - 1 - net->first].out;
        /* between layers the gradient ping-pongs through the workspace; the
         * range's first layer accumulates straight into the caller's din */
        float *dx = din;
        if (i > net->first) {
            dx = zeroed(net, net->grad[i & 1], (size_t)B * in_floats(l));
        }
        passes[l->kind].bwd(net, l, a, x, dy, dx, B);
        dy = dx;
    }
}

void mmp_image_net_backward_input(mmp_image_net *net, mmp_image_acts *acts, const float *dout,
                                  int B, float *din, mmp_wgrad *wg)
{
    net->lp.defer = wg;
    mmp_image_net_backward(net, acts, dout, B, din);
    net->lp.defer = NULL;
}

mmp_err mmp_image_net_backward_weights(mmp_image_net *net, mmp_wgrad *wg)
{
    return mmp_wgrad_run(wg, &net->lp, &net->params);
}
