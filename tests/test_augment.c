/* Training augmentation through the loader (data.augment): random resized
 * crops and flips are a pure function of (seed, run position), so any worker
 * count gives the same micro-batches; they differ from the centre crop and
 * from another seed's; evaluation loads never augment. */
#include <string.h>

#include "common/config.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/synth.h"
#include "tests/harness.h"

#define S 32

static int load_step(const char *dir, int augment, int workers, long long seed, float *out)
{
    mmp_plan p;
    mmp_plan_defaults(&p);
    snprintf(p.data.manifest, sizeof p.data.manifest, "%s/train.jsonl", dir);
    snprintf(p.data.vocab, sizeof p.data.vocab, "%s/vocab.txt", dir);
    p.data.image_size = S;
    p.data.augment = augment;
    p.data.workers = workers;
    p.train.batch = 8;
    p.train.microbatches = 2;
    p.job.seed = seed;
    p.job.steps = 2;
    mmp_dataset *d = NULL;
    mmp_loader *l = NULL;
    int ok = mmp_dataset_open(&d, p.data.manifest, p.data.vocab, &p) == MMP_OK;
    mmp_loader_cfg lc = {
        .ds = d, .plan = &p, .images = 1, .first_step = 0, .last_step = 2, .depth = 3};
    ok = ok && mmp_loader_create(&l, &lc) == MMP_OK;
    for (int step = 0; ok && step < 2; step++) { /* requests come in order; keep step 1 */
        for (int mb = 0; ok && mb < 2; mb++) {
            mmp_batch *b;
            ok = mmp_loader_get(l, step, mb, &b) == MMP_OK;
            if (ok && step == 1) {
                memcpy(out + (size_t)mb * 4 * 3 * S * S, b->images,
                       (size_t)4 * 3 * S * S * sizeof(float));
            }
            if (ok) {
                mmp_loader_release(l, b);
            }
        }
    }
    mmp_loader_destroy(l);
    mmp_dataset_close(d);
    return ok;
}

/* The synthetic set every case loads from, written by the first case run. */
static const char *dataset(void)
{
    static char dir[900];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s", mmp_test_tmpdir("augment"));
        CHECK_OK(mmp_synth_write(dir, 64, 5, S));
    }
    return dir;
}

#define N (8 * 3 * S * S)

/* The same draws for any worker count. */
static void test_any_workers(void)
{
    static float a0[N], a2[N];
    CHECK(load_step(dataset(), 1, 0, 7, a0));
    CHECK(load_step(dataset(), 1, 2, 7, a2));
    CHECK(memcmp(a0, a2, sizeof a0) == 0);
}

/* Augmented crops differ from the centre crop and from another seed's. */
static void test_differs(void)
{
    static float a0[N], plain[N], other[N];
    CHECK(load_step(dataset(), 1, 0, 7, a0));
    CHECK(load_step(dataset(), 0, 0, 7, plain));
    CHECK(load_step(dataset(), 1, 0, 8, other));
    CHECK(memcmp(a0, plain, sizeof a0) != 0);
    CHECK(memcmp(a0, other, sizeof a0) != 0);
}

MMP_TEST_LIST("test_augment", MMP_TEST_CASE(test_any_workers), MMP_TEST_CASE(test_differs))
