/* The background checkpoint writer (stages/ckpt_writer.h). */
#include "stages/ckpt_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/trace.h"
#include "common/test_hooks.h"

void mmp_ckpt_bg_init(mmp_ckpt_bg *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    b->delay_ms = mmp_test_hook_value(MMP_HOOK_CKPT_WRITE_DELAY_MS);
    b->fail_step = (int)mmp_test_hook_value(MMP_HOOK_CKPT_FAIL_STEP);
}

static void *write_main(void *arg)
{
    mmp_ckpt_bg *b = arg;
    b->t_start_us = mmp_trace_now_us();
    /* a slow disk, for tests: before the file exists, in slices a cancel ends */
    for (double left = b->delay_ms; left > 0 && !atomic_load(&b->snap.cancel); left -= 20) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    mmp_err e =
        b->fail_step > 0 && b->step == b->fail_step
            ? mmp_errorf(MMP_ERR_IO, "%s: not written (test hook MMP_TEST_CKPT_FAIL_STEP)", b->path)
            : mmp_params_snap_save(&b->snap, b->path);
    double end = mmp_trace_now_us();
    pthread_mutex_lock(&b->lock);
    b->t_end_us = end;
    b->result = e;
    /* mmp_last_error is per thread: the message is copied for the stage's */
    snprintf(b->error, sizeof b->error, "%s", e == MMP_OK ? "" : mmp_last_error());
    b->finished = 1;
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

mmp_err mmp_ckpt_bg_start(mmp_ckpt_bg *b, int step, const char *path)
{
    if (b->busy) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "checkpoint of step %d: the write of step %d is "
                          "still in flight",
                          step, b->step);
    }
    if (snprintf(b->path, sizeof b->path, "%s", path) >= (int)sizeof b->path) {
        return mmp_errorf(MMP_ERR_INVALID, "checkpoint path too long: %s", path);
    }
    b->step = step;
    b->finished = 0;
    b->result = MMP_OK;
    b->error[0] = 0;
    int rc = pthread_create(&b->thread, NULL, write_main, b);
    if (rc != 0) {
        return mmp_errorf(MMP_ERR_IO, "checkpoint writer thread: %s", strerror(rc));
    }
    b->busy = 1;
    return MMP_OK;
}

static int take(mmp_ckpt_bg *b, int *step, mmp_err *result, const char **error)
{
    pthread_join(b->thread, NULL);
    b->busy = 0;
    *step = b->step;
    *result = b->result;
    *error = b->error;
    return 1;
}

int mmp_ckpt_bg_poll(mmp_ckpt_bg *b, int *step, mmp_err *result, const char **error)
{
    if (!b->busy) {
        return 0;
    }
    pthread_mutex_lock(&b->lock);
    int done = b->finished;
    pthread_mutex_unlock(&b->lock);
    return done ? take(b, step, result, error) : 0;
}

int mmp_ckpt_bg_wait(mmp_ckpt_bg *b, int *step, mmp_err *result, const char **error)
{
    return b->busy ? take(b, step, result, error) : 0;
}

void mmp_ckpt_bg_fini(mmp_ckpt_bg *b)
{
    if (!b) {
        return;
    }
    if (b->busy) {
        mmp_params_snap_cancel(&b->snap);
        pthread_join(b->thread, NULL);
        b->busy = 0;
    }
    mmp_params_snap_fini(&b->snap);
    pthread_mutex_destroy(&b->lock);
}
