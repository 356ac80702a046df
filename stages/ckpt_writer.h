/* A stage's background checkpoint writer: the file of one checkpoint is
 * written by a thread of its own while the stage trains on.
 *
 * The stage takes a snapshot of its state between steps (nn/params.h:
 * mmp_params_snapshot, a host copy), hands it here and goes on; this thread
 * writes the snapshot's file (temporary name, fsync, rename: common/ckpt.h).
 * One write at a time: the next checkpoint first waits for the one before.
 * The control plane stays on the stage's own thread: the stage polls (or
 * waits) for the result and sends the coordinator the second acknowledgement
 * that lets it publish the step (coordinator/steps.c). */
#ifndef MMP_STAGES_CKPT_WRITER_H
#define MMP_STAGES_CKPT_WRITER_H

#include <pthread.h>

#include "common/err.h"
#include "nn/params.h"

typedef struct mmp_ckpt_bg {
    mmp_params_snap snap; /* the state being written (reused by the next snapshot) */
    pthread_t thread;
    pthread_mutex_t lock;
    int busy;     /* a write was started and its result not yet taken */
    int finished; /* under lock: the thread is done; result and error set */
    int step;     /* of the write in flight */
    char path[1200];
    mmp_err result;
    char error[512];
    double t_start_us, t_end_us; /* of the write (common/trace.h clock) */
    double delay_ms;             /* test hook: MMP_TEST_CKPT_WRITE_DELAY_MS, a slow disk */
    int fail_step; /* test hook: MMP_TEST_CKPT_FAIL_STEP, a write that fails (0: none) */
} mmp_ckpt_bg;

void mmp_ckpt_bg_init(mmp_ckpt_bg *b);
/* Starts writing b->snap (filled by the caller) to path, for step. b must
 * not be busy (take the previous result first). */
mmp_err mmp_ckpt_bg_start(mmp_ckpt_bg *b, int step, const char *path);
/* When a write was started and has finished: 1, with its step, its result
 * and (on failure) its message in *error (valid until the next start); the
 * writer is then free. 0 while it runs or when none was started. */
int mmp_ckpt_bg_poll(mmp_ckpt_bg *b, int *step, mmp_err *result, const char **error);
/* The same, waiting for a write in flight; 0 only when none was started. */
int mmp_ckpt_bg_wait(mmp_ckpt_bg *b, int *step, mmp_err *result, const char **error);
/* Stops a write in flight (its file is not published), waits for the thread
 * and frees the snapshot. NULL-safe. */
void mmp_ckpt_bg_fini(mmp_ckpt_bg *b);

#endif
