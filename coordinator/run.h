/* The coordinator: places the stages of a plan as processes, drives them
 * step by step over the control plane, and writes the run directory.
 *
 * It compiles the schedule, spawns one `mmpipe stage` process per stage
 * (posix_spawn), hands each its Assignment, then per step: Start, the global
 * gradient norm (each stage's sum of squares, summed in stage order, the clip
 * coefficient sent back), StepDone (aggregated into metrics.jsonl and the
 * progress line), evaluation and checkpoints when due. It never touches
 * tensor data. A dead or silent stage, a stage's error, or SIGINT/SIGTERM
 * stops every stage, removes the run's shared-memory segments and ends the
 * run with an error naming the cause. */
#ifndef MMP_COORDINATOR_RUN_H
#define MMP_COORDINATOR_RUN_H

#include "common/config.h"

/* Runs plan into out_dir (which exists). resume: continue from
 * out_dir/ckpt/latest. Returns the process exit status (0, 1, or 130 when
 * interrupted). */
int mmp_coord_run(const mmp_plan *plan, const char *out_dir, int resume);

#endif
