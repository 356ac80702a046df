/* Restarts of a pipeline run: the record of each one, and rewinding the run
 * directory to the checkpoint a restart relaunches from.
 *
 * When a stage dies or stalls and train.max_restarts allows, the coordinator
 * (coordinator/run.c) stops every stage and relaunches them all from
 * ckpt/latest. This module decides nothing about processes; it keeps the
 * books: which checkpoint to go on from, metrics.jsonl cut back to it (the
 * steps after it are trained again, and no step may appear twice), and each
 * restart carried as a "restarts" field on the next step line that stays in
 * metrics.jsonl (a line dropped by a later rewind hands its restarts on to
 * the next one written). The caller marks the trace. */
#ifndef MMP_COORDINATOR_RESTART_H
#define MMP_COORDINATOR_RESTART_H

#include <stddef.h>
#include <stdio.h>

#include "common/err.h"

#define MMP_RESTART_MAX 1000 /* train.max_restarts' upper bound */

typedef struct mmp_restart {
    int n;          /* 1, 2, ... */
    int after_step; /* steps done when the fault stopped the stages */
    int from_step;  /* the checkpoint relaunched from (0: the start) */
    int line_step;  /* the metrics line that carries it; 0 = none (yet, or any more) */
    char cause[480];
} mmp_restart;

typedef struct mmp_restarts {
    int n; /* restarts so far */
    mmp_restart log[MMP_RESTART_MAX];
} mmp_restarts;

/* Records restart r->n + 1 of a run in run_dir whose stages stopped after
 * steps_done steps for `cause`, and rewinds: *from_step and resume_dir (n
 * bytes; "" when there is no checkpoint yet: from the start) get
 * ckpt/latest, and *metrics (open, as mmp_metrics_continue gave it) is closed
 * and reopened keeping the lines up to *from_step. On failure (latest
 * unreadable, metrics not rewritable) returns the error; *metrics may then
 * be NULL. Needs r->n < MMP_RESTART_MAX. */
mmp_err mmp_restart_rewind(mmp_restarts *r, const char *run_dir, int steps_done, const char *cause,
                           int *from_step, char *resume_dir, size_t n, FILE **metrics);

/* The "restarts" field's value, [{n, after_step, from_step, cause}...], for
 * the restarts no kept line carries yet, in buf (n bytes; at most
 * MMP_RESTART_FIELD_MAX needed); they are then carried by step step_no
 * (1-based). NULL when there are none (or buf is too small). */
#define MMP_RESTART_FIELD_MAX (64 * 1024)
const char *mmp_restart_field(mmp_restarts *r, int step_no, char *buf, size_t n);

/* The same written as ,"restarts":[...] into f (inside the JSON object of
 * step step_no), or nothing when there are none. */
void mmp_restart_write_field(mmp_restarts *r, FILE *f, int step_no);

#endif
