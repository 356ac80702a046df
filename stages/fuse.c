#include "stages/fuse.h"

#include <stdlib.h>
#include <string.h>

#include "stages/pairing.h"

mmp_err mmp_fuse_init(mmp_fuse *f, int mb_max, size_t img_row, int T, int D)
{
    memset(f, 0, sizeof *f);
    f->mb_max = mb_max;
    f->T = T;
    f->img_row = img_row;
    f->txt_row = (size_t)T * D;
    size_t m = (size_t)mb_max;
    f->img = calloc(m * img_row, sizeof(float));
    f->dimg = calloc(m * img_row, sizeof(float));
    f->txt = calloc(m * f->txt_row, sizeof(float));
    f->dtxt = calloc(m * f->txt_row, sizeof(float));
    f->mask = calloc(m * (size_t)T, sizeof(float));
    f->rows = calloc(m, sizeof(int));
    if (!f->img || !f->dimg || !f->txt || !f->dtxt || !f->mask || !f->rows) {
        mmp_fuse_fini(f);
        return mmp_errorf(MMP_ERR_NOMEM, "fusion staging for %d samples", mb_max);
    }
    return MMP_OK;
}

void mmp_fuse_fini(mmp_fuse *f)
{
    if (!f) {
        return;
    }
    free(f->img);
    free(f->dimg);
    free(f->txt);
    free(f->dtxt);
    free(f->mask);
    free(f->rows);
    memset(f, 0, sizeof *f);
}

static int all_rows(const mmp_fuse *f)
{
    return f->k == f->n;
}

void mmp_fuse_forward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, const float *img,
                      const float *txt, const float *mask, const float *img_valid,
                      const float *txt_valid, int n, int batch, mmp_loss_parts *acc, int *skipped)
{
    f->n = n;
    if (img_valid && txt_valid) {
        f->k = mmp_pair_rows(img_valid, txt_valid, n, f->rows);
    } else {
        f->k = n;
    }
    *skipped = n - f->k;
    if (f->k == 0) {
        return;
    }
    mmp_loss_parts parts;
    if (all_rows(f)) {
        mmp_fusion_net_forward(net, acts, img, txt, mask, n, &parts);
    } else {
        mmp_gather_rows(f->img, img, f->rows, f->k, f->img_row);
        mmp_gather_rows(f->txt, txt, f->rows, f->k, f->txt_row);
        mmp_gather_rows(f->mask, mask, f->rows, f->k, (size_t)f->T);
        mmp_fusion_net_forward(net, acts, f->img, f->txt, f->mask, f->k, &parts);
    }
    float weight = (float)f->k / (float)batch;
    acc->loss += weight * parts.loss;
    acc->itc += weight * parts.itc;
    acc->itm += weight * parts.itm;
}

void mmp_fuse_backward(mmp_fuse *f, mmp_fusion_net *net, mmp_fusion_acts *acts, int batch,
                       float *dimg, float *dtxt)
{
    memset(dimg, 0, (size_t)f->n * f->img_row * sizeof(float));
    memset(dtxt, 0, (size_t)f->n * f->txt_row * sizeof(float));
    if (f->k == 0) {
        return;
    }
    float weight = (float)f->k / (float)batch;
    if (all_rows(f)) {
        mmp_fusion_net_backward(net, acts, weight, dimg, dtxt);
        return;
    }
    memset(f->dimg, 0, (size_t)f->k * f->img_row * sizeof(float));
    memset(f->dtxt, 0, (size_t)f->k * f->txt_row * sizeof(float));
    mmp_fusion_net_backward(net, acts, weight, f->dimg, f->dtxt);
    mmp_scatter_add_rows(dimg, f->dimg, f->rows, f->k, f->img_row);
    mmp_scatter_add_rows(dtxt, f->dtxt, f->rows, f->k, f->txt_row);
}
