/* The single-process trainer: the whole model (image branch, text branch,
 * fusion) in one process, over the same micro-batches in the same order as
 * the pipeline. It is the numerical reference every pipeline run is compared
 * with (`ckpt diff`) and the baseline every pipeline speed is divided by. */
#ifndef MMP_STAGES_SINGLE_H
#define MMP_STAGES_SINGLE_H

#include "common/config.h"
#include "common/err.h"

/* Trains plan->job.steps steps, writing metrics.jsonl, plan.json and a final
 * checkpoint under out_dir (which must exist). resume: continue from
 * out_dir/ckpt/latest (metrics.jsonl keeps its lines up to that step and
 * goes on from there). Progress goes to stderr.
 * Installs the SIGINT/SIGTERM handler (common/interrupt.h): the first signal
 * finishes the step in flight, checkpoints it and returns MMP_OK early
 * (mmp_interrupt_status() is then the exit status to report); a second one
 * ends the process at once. */
mmp_err mmp_train_single(const mmp_plan *plan, const char *out_dir, int resume);

#endif
