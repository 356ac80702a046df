#include "stages/pairing.h"

#include "common/rng.h"

uint64_t mmp_sample_digest(const int64_t *ids, int n)
{
    /* The ids' bytes as this host stores them: both ends are on one host. */
    return mmp_fnv1a(MMP_FNV1A_INIT, ids, (size_t)n * sizeof *ids);
}

mmp_err mmp_pair_check(const mmp_msg_header *img, const mmp_msg_header *txt, int step, int mb)
{
    if (img->step != txt->step || img->mb != txt->mb) {
        return mmp_errorf(MMP_ERR_DATA,
                          "step %d micro-batch %d: image is step %d micro-batch %d but text is "
                          "step %d micro-batch %d; refusing to pair them",
                          step + 1, mb, img->step + 1, img->mb, txt->step + 1, txt->mb);
    }
    if (img->digest != txt->digest || img->n != txt->n) {
        return mmp_errorf(MMP_ERR_DATA,
                          "step %d micro-batch %d: the image and text micro-batches hold "
                          "different samples (digest %016llx, %d samples vs %016llx, %d "
                          "samples); refusing to pair them",
                          step + 1, mb, (unsigned long long)img->digest, img->n,
                          (unsigned long long)txt->digest, txt->n);
    }
    return MMP_OK;
}

int mmp_pair_rows(const float *img_valid, const float *txt_valid, int n, int *rows)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (img_valid[i] != 0.0f && txt_valid[i] != 0.0f) {
            rows[k++] = i;
        }
    }
    return k;
}
