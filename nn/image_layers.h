/* Private to nn/image.c and nn/image_pass.c: the image branch's layer
 * geometry, the net and acts layouts, and the one-line accessors both files
 * read them with. nn/image.c builds (geometry, parameters, workspace, acts,
 * batch-norm log and replay); nn/image_pass.c runs forward and backward.
 * Nothing else includes this; the contract is nn/model.h's. */
#ifndef MMP_NN_IMAGE_LAYERS_H
#define MMP_NN_IMAGE_LAYERS_H

#include <stdint.h>

#include "nn/lowp.h"
#include "nn/model.h"

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f
#define STEM_IN_CHANNELS 3
#define GRAD_TEMPS 3 /* per-layer backward temporaries, besides the two inter-layer ones */

typedef enum layer_kind { LAYER_STEM, LAYER_BLOCK, LAYER_PROJ } layer_kind;

/* Indices into the net's params of one batch norm's tensors, its channels,
 * and where its mean[C] then var[C] sit in a statistics row. */
typedef struct bn_ref {
    int gamma, beta, mean, var;
    int C;
    int64_t row;
} bn_ref;

typedef struct image_layer {
    layer_kind kind;
    char name[48];           /* "image.stem", "image.layer2.0", "image.proj" */
    int in_c, in_h, in_w;    /* input map (proj: the final feature map) */
    int c, h, w;             /* the convolutions' output map (stem: before the pool) */
    int out_c, out_h, out_w; /* output (proj: out_c = D, out_h = Ni, out_w = 1) */
    int stride;              /* block: of conv1 and the shortcut */
    int pool;                /* stem: a 3x3/2 max pool follows */
    int down;                /* block: the shortcut is a 1x1 conv + BN */
    /* parameter indices, set only for layers in range */
    int conv1, conv2, conv_down;
    bn_ref bn1, bn2, bn_down;
    int proj_w, proj_b, proj_pos;
} image_layer;

struct mmp_image_net {
    mmp_backend *be;
    int n_all;           /* layers of the whole branch */
    image_layer *layers; /* all n_all, geometry for every one */
    int first, last;     /* the range this net computes */
    mmp_params params;
    int64_t bn_row_floats; /* 2 x channels over the range's batch norms */
    float *bn_row;         /* HOST, non-NULL: training forwards log statistics here, not in place */
    float *bn_dev;         /* backend (bn_row_floats): where the kernels write the row */
    float *bn_host;        /* HOST (bn_row_floats): running statistics during a replay */
    /* workspace shared by this net's acts, sized for ws_batch samples */
    int ws_batch;
    float *ws;      /* scratch, then 2 inter-layer gradients, then GRAD_TEMPS temporaries */
    float *scratch; /* im2col of one image */
    float *grad[2];
    float *tmp[GRAD_TEMPS];
    mmp_lowp lp; /* train.precision of the convolutions and the projection */
};

/* Saved activations of one layer for one micro-batch (NULL where unused). */
typedef struct layer_acts {
    float *c1, *a1; /* conv1 output; relu(bn1(c1)) (stem: before the pool) */
    float *c2, *cd; /* block: conv2 output; shortcut conv output */
    float *mean1, *rstd1, *mean2, *rstd2, *mean_d, *rstd_d;
    int32_t *argmax; /* stem pool */
    float *tok;      /* proj: its input as tokens (B,Ni,C) */
    float *out;      /* output, NULL for a last layer whose backward does not read it */
} layer_acts;

struct mmp_image_acts {
    mmp_image_net *net;
    int max_batch;
    int batch;   /* the last forward's B */
    int trained; /* the last forward used batch statistics: backward may run */
    void *mem;
    float *in;          /* copy of the range's input */
    layer_acts *layers; /* last - first */
};

/* Floats per sample of layer l's input, convolution output and output. */
static inline int64_t in_floats(const image_layer *l)
{
    return (int64_t)l->in_c * l->in_h * l->in_w;
}

static inline int64_t mid_floats(const image_layer *l)
{
    return (int64_t)l->c * l->h * l->w;
}

static inline int64_t out_floats(const image_layer *l)
{
    return (int64_t)l->out_c * l->out_h * l->out_w;
}

static inline float *pw(mmp_image_net *net, int index)
{
    return net->params.items[index].w;
}

static inline float *pg(mmp_image_net *net, int index)
{
    return net->params.items[index].g;
}

#endif
