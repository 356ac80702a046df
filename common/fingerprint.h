/* The plan keys a checkpoint is bound to, kept beside it as key=value lines.
 *
 * Weights are trained under one model and one data order. Resuming them
 * under a plan that changes either would silently train something else
 * (same tensor shapes do not mean the same model: model.text.heads changes
 * the attention, not a shape). So every checkpoint step directory holds
 * fingerprint.txt, one `key=value` line per fingerprinted key (values as
 * plan.json writes them), and `launch --resume` compares it with the new
 * plan before anything is started or written, naming the first key that
 * differs.
 *
 * Fingerprinted: every model.* key; data.manifest, data.vocab,
 * data.image_size, data.max_text_len, data.mean, data.std, data.augment
 * (what a sample is and which samples come in which order); job.seed and
 * train.batch (the order: sample k of the run is a function of seed and
 * step * batch + i).
 *
 * Not fingerprinted, so a resume may change them: job.name, job.steps,
 * every other train.* key (optimizer, schedule, micro-batches, evaluation
 * and checkpoint cadence, threads), data.workers, data.val_manifest,
 * data.val_samples, data.on_bad_sample (a run that got past open under
 * `fail` had no malformed line, so `skip` indexes the same samples: switching
 * to skip to get past a bad image is a legitimate resume), balance.*,
 * compute, sim.*, launcher, launcher_command, control.*, hosts and stages.* (the balancer itself
 * re-places by checkpoint + resume with other splits and replica counts). */
#ifndef MMP_COMMON_FINGERPRINT_H
#define MMP_COMMON_FINGERPRINT_H

#include <stddef.h>

#include "common/config.h"
#include "common/err.h"

#define MMP_FINGERPRINT_FILE "fingerprint.txt"

/* Whether the dotted schema key is fingerprinted. */
int mmp_fingerprint_has(const char *key);

/* p's fingerprint, "key=value\n" per key in schema order, into buf.
 * MMP_ERR_INVALID when it does not fit. */
mmp_err mmp_fingerprint_text(const mmp_plan *p, char *buf, size_t n);

/* Writes <step_dir>/fingerprint.txt (temporary name, fsync, rename: the old
 * file or the new one, never half). */
mmp_err mmp_fingerprint_write(const char *step_dir, const mmp_plan *p);

/* Reads <step_dir>/fingerprint.txt and compares it with p's. MMP_OK when
 * every key the file holds has p's value (*checked = 1), or when the file
 * is absent (*checked = 0: a checkpoint from before fingerprints; the caller
 * warns). MMP_ERR_CONFIG when a key differs: "KEY: the checkpoint in DIR was
 * trained with KEY=A; this plan has KEY=B ...". MMP_ERR_DATA when the file
 * holds none of the fingerprinted keys (damaged). MMP_ERR_IO when it exists
 * but cannot be read. Reads only. */
mmp_err mmp_fingerprint_check(const char *step_dir, const mmp_plan *p, int *checked);

#endif
