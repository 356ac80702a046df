/* The training data as the trainer and the branch stages see it.
 *
 * A dataset is a JSONL manifest of {"image": path, "text": caption} lines
 * (paths relative to the manifest's folder, or absolute), a BERT vocab.txt,
 * and the plan's preprocessing (image_size, mean/std, max_text_len). Opening
 * it validates every manifest line (a malformed line is an error naming
 * manifest:line) and keeps only a compact index, not the captions' decoded
 * form. Sample order is a pure function of (seed, position): both branches
 * and every process compute the same order without talking. */
#ifndef MMP_DATA_DATASET_H
#define MMP_DATA_DATASET_H

#include <stdint.h>

#include "common/config.h"
#include "common/err.h"

typedef struct mmp_dataset mmp_dataset;

/* Opens manifest with vocab and plan->data's preprocessing settings. */
mmp_err mmp_dataset_open(mmp_dataset **out, const char *manifest, const char *vocab,
                         const mmp_plan *plan);
void mmp_dataset_close(mmp_dataset *d);

int64_t mmp_dataset_size(const mmp_dataset *d);
int mmp_dataset_vocab_size(const mmp_dataset *d);

/* The sample index at global position k of a run (k = step*batch + i):
 * epoch e = k / size is a permutation of [0,size) seeded by (seed, e) when
 * shuffle, else the identity. Pure function of its arguments. */
int64_t mmp_dataset_sample_at(const mmp_dataset *d, uint64_t seed, int64_t k, int shuffle);

/* Loads samples[0..n) into images (n,3,S,S) normalised NCHW float, ids (n,T)
 * int32 ([CLS] ... [SEP] [PAD]...), mask (n,T) 1/0. Errors name the manifest
 * line and the reason (missing file, bad image, empty caption). images NULL
 * skips decoding (the text branch); ids NULL skips tokenizing and mask (the
 * image branch). Thread-safe
 * for concurrent calls on distinct outputs. */
mmp_err mmp_dataset_load(mmp_dataset *d, const int64_t *samples, int n, float *images,
                         int32_t *ids, float *mask);

#endif
