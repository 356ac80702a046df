/* The fusion stage's alignment check: same samples in the same order pair;
 * anything else is refused with the step and micro-batch named. */
#include <string.h>

#include "stages/pairing.h"
#include "tests/harness.h"

static int64_t a[4] = {3, 17, 5, 9}, swapped[4] = {17, 3, 5, 9}, other[4] = {3, 17, 5, 10};

static void test_digest(void)
{
    uint64_t d = mmp_sample_digest(a, 4);
    CHECK(d == mmp_sample_digest(a, 4));
    CHECK(d != mmp_sample_digest(swapped, 4)); /* order matters */
    CHECK(d != mmp_sample_digest(other, 4));
    CHECK(d != mmp_sample_digest(a, 3));
}

static void test_pair_check(void)
{
    mmp_msg_header img = {.step = 6, .mb = 2, .digest = mmp_sample_digest(a, 4), .n = 4};
    mmp_msg_header txt = img;
    CHECK_OK(mmp_pair_check(&img, &txt, 6, 2));

    txt.digest = mmp_sample_digest(swapped, 4);
    CHECK(mmp_pair_check(&img, &txt, 6, 2) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "step 7 micro-batch 2") != NULL);
    CHECK(strstr(mmp_last_error(), "different samples") != NULL);

    txt = img;
    txt.n = 3;
    CHECK(mmp_pair_check(&img, &txt, 6, 2) == MMP_ERR_DATA);

    txt = img;
    txt.mb = 3;
    CHECK(mmp_pair_check(&img, &txt, 6, 2) == MMP_ERR_DATA);
    CHECK(strstr(mmp_last_error(), "refusing to pair") != NULL);
}

MMP_TEST_LIST("test_pairing", MMP_TEST_CASE(test_digest), MMP_TEST_CASE(test_pair_check))
