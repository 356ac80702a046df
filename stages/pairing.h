/* Alignment check at the fusion stage: an image micro-batch and a text
 * micro-batch are paired only when they hold the same samples in the same
 * order (same step, micro-batch, sample count and sample-id digest).
 * Pairing anything else would train on garbage without any symptom. */
#ifndef MMP_STAGES_PAIRING_H
#define MMP_STAGES_PAIRING_H

#include <stdint.h>

#include "common/err.h"
#include "transport/channel.h"

/* Digest of a micro-batch's sample ids, in order (FNV-1a over their bytes). */
uint64_t mmp_sample_digest(const int64_t *ids, int n);

/* MMP_OK when img and txt may be paired as (step, mb); otherwise
 * MMP_ERR_DATA with a message naming the step (1-based) and micro-batch. */
mmp_err mmp_pair_check(const mmp_msg_header *img, const mmp_msg_header *txt, int step, int mb);

/* Samples a micro-batch carries flags for (1 = good, 0 = skipped under
 * data.on_bad_sample: skip). The fusion stage trains only on the rows good in
 * both branches: rows (n) receives their indices in order; returns how many.
 * img_valid / txt_valid are (n) floats, 1 or 0. */
int mmp_pair_rows(const float *img_valid, const float *txt_valid, int n, int *rows);

#endif
