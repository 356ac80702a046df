/* Preflight: the plan's data files, checked before a run starts anything.
 *
 * launch calls this before it creates the run directory or starts a
 * process, so a missing or unreadable manifest, vocab or validation set is
 * one error naming its plan key, with nothing left on disk (not one error
 * per stage process after the run directory exists). It checks that
 * data.manifest and data.val_manifest are readable regular files holding
 * more than white space (an empty manifest has no sample) and that
 * data.vocab loads as a vocab; data.val_manifest only when the plan
 * evaluates (mmp_plan_evaluates: train.eval_every > 0 or train.final_eval).
 * Sample-level problems (a bad line, a missing image) stay the dataset's to
 * find under data.on_bad_sample. Reads only; never writes. */
#ifndef MMP_DATA_PREFLIGHT_H
#define MMP_DATA_PREFLIGHT_H

#include "common/config.h"
#include "common/err.h"

#include <stdint.h>

/* MMP_OK, or MMP_ERR_DATA with "SITE: KEY: PATH: reason" in mmp_last_error(),
 * SITE where the plan gave the key (p->data.*_site: FILE:LINE:COL or the
 * --set; a default beside the manifest names the manifest's). */
mmp_err mmp_data_preflight(const mmp_plan *p);

/* How well data.vocab covers the captions: the first `lines` good lines of
 * data.manifest tokenised as training does (up to 512 tokens each), counting
 * word pieces (without [CLS] and [SEP]) and the [UNK] among them. A word the
 * vocab cannot spell becomes one [UNK], so unk / pieces is close to the share
 * of caption words lost. Bad lines are not counted (the dataset reports them). */
typedef struct mmp_vocab_coverage {
    int64_t captions, pieces, unk;
    int vocab_size;
} mmp_vocab_coverage;

/* Above this share of [UNK] pieces launch warns (the demo's 64-token vocab
 * on English captions is ~60%; bert-base-uncased on English, ~0). */
#define MMP_UNK_WARN_SHARE 0.05

/* Fills *cov; MMP_ERR_DATA when the manifest or vocab cannot be read. Reads
 * only. */
mmp_err mmp_data_vocab_coverage(const mmp_plan *p, int64_t lines, mmp_vocab_coverage *cov);

#endif
