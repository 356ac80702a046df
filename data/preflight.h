/* Preflight: the plan's data files, checked before a run starts anything.
 *
 * launch calls this before it creates the run directory or starts a
 * process, so a missing or unreadable manifest, vocab or validation set is
 * one error naming its plan key, with nothing left on disk (not one error
 * per stage process after the run directory exists). It checks that
 * data.manifest and data.val_manifest are readable regular files and that
 * data.vocab loads as a vocab; data.val_manifest only when the plan
 * evaluates (mmp_plan_evaluates: train.eval_every > 0 or train.final_eval).
 * Sample-level problems (a bad line, a missing image) stay the dataset's to
 * find under data.on_bad_sample. Reads only; never writes. */
#ifndef MMP_DATA_PREFLIGHT_H
#define MMP_DATA_PREFLIGHT_H

#include "common/config.h"
#include "common/err.h"

/* MMP_OK, or MMP_ERR_DATA with "KEY: PATH: reason" in mmp_last_error(). */
mmp_err mmp_data_preflight(const mmp_plan *p);

#endif
