/* The coordinator: places the stages of a plan as processes, drives them
 * step by step over the control plane, and writes the run directory.
 *
 * It compiles the schedule, spawns one `mmpipe stage` process per stage
 * (posix_spawn), hands each its Assignment, then per step: Start, the global
 * gradient norm (each stage's sum of squares, summed in stage order, the clip
 * coefficient sent back), StepDone (aggregated into metrics.jsonl and the
 * progress line), evaluation and checkpoints when due. It never touches
 * tensor data. A dead or stalled stage (coordinator/watchdog.h) or a stage's
 * error stops every stage, removes the run's shared-memory segments and ends
 * the run with an error naming the cause, unless train.max_restarts allows a
 * restart: a death or stall (not a stage's own error) then relaunches every
 * stage from ckpt/latest (coordinator/restart.h keeps the records). The
 * first SIGINT/SIGTERM finishes the step in flight, checkpoints it, stops the
 * stages and prints how to resume; a second stops at once. */
#ifndef MMP_COORDINATOR_RUN_H
#define MMP_COORDINATOR_RUN_H

#include "common/config.h"

/* Runs plan into out_dir (which exists). resume: continue from
 * out_dir/ckpt/latest (metrics.jsonl cut back to its step, trace.json
 * appended). Installs the SIGINT/SIGTERM handler (common/interrupt.h).
 * Returns the process exit status: 0, 1, or 128 + the signal (130 SIGINT,
 * 143 SIGTERM) when stopped by one. */
int mmp_coord_run(const mmp_plan *plan, const char *out_dir, int resume);

#endif
