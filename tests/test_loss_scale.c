/* common/loss_scale (fp16 dynamic loss scaling, GradScaler's semantics):
 * 2^16 at the start, halved and a skip on an inf/nan sum of squares, doubled
 * after train.loss_scale_window clean steps; AdamW's step index counts the
 * steps taken; bf16/fp32 never scale nor skip; the debug hook makes one
 * step's loss gradient inf; the state survives a checkpoint's train.ckpt. */
#include <math.h>
#include <stdio.h>

#include "common/ckpt.h"
#include "common/loss_scale.h"
#include "tests/harness.h"

static mmp_plan plan_of(mmp_precision prec, int window)
{
    mmp_plan p;
    mmp_plan_defaults(&p);
    p.train.precision = prec;
    p.train.loss_scale_window = window;
    return p;
}

static void test_gradscaler_sequence(void)
{
    mmp_plan p = plan_of(MMP_PREC_FP16, 3);
    mmp_loss_scale ls;
    mmp_loss_scale_init(&ls, &p);
    CHECK(ls.scale == 65536.0f && ls.good_steps == 0 && ls.skipped == 0);
    CHECK(mmp_loss_scale_update(&ls, &p, 1.0) == 0 && ls.scale == 65536.0f);
    CHECK(mmp_loss_scale_update(&ls, &p, 2.0) == 0 && ls.good_steps == 2);
    CHECK(mmp_loss_scale_update(&ls, &p, INFINITY) == 1); /* step 3 */
    CHECK(ls.scale == 32768.0f && ls.good_steps == 0 && ls.skipped == 1);
    CHECK(mmp_loss_scale_opt_step(&ls, 3) == 2); /* step 4 is AdamW's third */
    CHECK(mmp_loss_scale_update(&ls, &p, NAN) == 1 && ls.scale == 16384.0f && ls.skipped == 2);
    for (int i = 0; i < 2; i++) {
        CHECK(mmp_loss_scale_update(&ls, &p, 0.5) == 0 && ls.scale == 16384.0f);
    }
    CHECK(mmp_loss_scale_update(&ls, &p, 0.5) == 0); /* the window's third clean step */
    CHECK(ls.scale == 32768.0f && ls.good_steps == 0);
}

static void test_no_scaling_outside_fp16(void)
{
    mmp_precision precs[] = {MMP_PREC_FP32, MMP_PREC_BF16};
    for (int i = 0; i < 2; i++) {
        mmp_plan p = plan_of(precs[i], 1);
        mmp_loss_scale ls;
        mmp_loss_scale_init(&ls, &p);
        CHECK(ls.scale == 1.0f && !mmp_loss_scale_active(&p));
        CHECK(mmp_loss_scale_update(&ls, &p, INFINITY) == 0); /* the caller's error */
        CHECK(mmp_loss_scale_update(&ls, &p, 1.0) == 0 && ls.scale == 1.0f && ls.skipped == 0);
        CHECK(mmp_loss_scale_opt_step(&ls, 7) == 7);
    }
}

static void test_debug_overflow_hook(void)
{
    mmp_plan p = plan_of(MMP_PREC_FP16, 2000);
    CHECK(mmp_loss_scale_grad_mult(4.0f, &p, 2) == 4.0f); /* off by default */
    p.train.debug_overflow_step = 3;
    CHECK(isinf(mmp_loss_scale_grad_mult(4.0f, &p, 2))); /* step 3 is index 2 */
    CHECK(mmp_loss_scale_grad_mult(4.0f, &p, 3) == 4.0f);
}

static const char *tmp;

static void test_ckpt_round_trip(void)
{
    mmp_plan p = plan_of(MMP_PREC_FP16, 2000);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/step", tmp);
    CHECK_OK(mmp_mkdirs(dir));
    mmp_loss_scale ls = {.scale = 0.25f, .good_steps = 17, .skipped = 5}, back;
    CHECK_OK(mmp_ckpt_write_meta_scaled(dir, 40, &p, &ls));
    mmp_loss_scale_init(&back, &p);
    CHECK_OK(mmp_ckpt_read_loss_scale(dir, &p, &back));
    CHECK(back.scale == 0.25f && back.good_steps == 17 && back.skipped == 5);
    /* resumed in bf16 or fp32: no scale (it was carried, 2^20 in bf16, seen
     * in an audit), the optimizer's skipped steps still counted */
    mmp_plan bf = plan_of(MMP_PREC_BF16, 2000);
    mmp_loss_scale_init(&back, &bf);
    CHECK_OK(mmp_ckpt_read_loss_scale(dir, &bf, &back));
    CHECK(back.scale == 1.0f && back.good_steps == 0 && back.skipped == 5);
    /* a bf16 run's checkpoint resumed in fp16: the scale starts at 2^16, as
     * a new GradScaler's (it was carried as 1) */
    mmp_loss_scale unscaled = {.scale = 1.0f, .good_steps = 0, .skipped = 0};
    CHECK_OK(mmp_ckpt_write_meta_scaled(dir, 40, &bf, &unscaled));
    mmp_loss_scale_init(&back, &p);
    CHECK_OK(mmp_ckpt_read_loss_scale(dir, &p, &back));
    CHECK(back.scale == 65536.0f && back.good_steps == 0 && back.skipped == 0);
    /* a checkpoint without the state (import, older runs) leaves the caller's */
    CHECK_OK(mmp_ckpt_write_meta(dir, 40, &p));
    mmp_loss_scale_init(&back, &p);
    CHECK_OK(mmp_ckpt_read_loss_scale(dir, &p, &back));
    CHECK(back.scale == 65536.0f && back.good_steps == 0 && back.skipped == 0);
}

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_gradscaler_sequence),
    MMP_TEST_CASE(test_no_scaling_outside_fp16),
    MMP_TEST_CASE(test_debug_overflow_hook),
    MMP_TEST_CASE(test_ckpt_round_trip),
};

int main(int argc, char **argv)
{
    tmp = mmp_test_tmpdir("test_loss_scale");
    return MMP_TEST_MAIN("test_loss_scale", cases, argc, argv);
}
