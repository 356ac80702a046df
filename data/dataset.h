/* The training data as the trainer and the branch stages see it.
 *
 * A dataset is a JSONL manifest of {"image": path, "text": caption} lines
 * (paths relative to the manifest's folder, or absolute), a BERT vocab.txt,
 * and the plan's preprocessing (image_size, mean/std, max_text_len). Opening
 * it validates every manifest line and keeps only a compact index (8 bytes
 * per sample, see data/manifest.h), never the captions. Sample order is a
 * pure function of (seed, position): both branches and every process
 * compute the same order without talking.
 *
 * Bad samples follow plan->data.on_bad_sample. Under fail, open refuses the
 * first bad line (malformed JSON, missing or non-string field, invalid
 * UTF-8, empty caption, line too long) and the first missing or zero-size
 * image, naming manifest:line and the reason; load refuses the first sample
 * whose image does not decode or whose caption has no tokens. Under skip,
 * open leaves bad lines out of the index (counted by mmp_dataset_dropped;
 * the index depends on the manifest's bytes alone, so it is the same in
 * every process) and does not look at image files; mmp_dataset_load_valid
 * flags samples whose image (image branch) or caption (text branch) turns
 * out bad, and the consumer ANDs the two branches' flags. */
#ifndef MMP_DATA_DATASET_H
#define MMP_DATA_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "common/err.h"
#include "data/manifest.h"

typedef struct mmp_dataset mmp_dataset;

/* Opens manifest with vocab and plan->data's preprocessing settings. */
mmp_err mmp_dataset_open(mmp_dataset **out, const char *manifest, const char *vocab,
                         const mmp_plan *plan);
/* The same, reporting the manifest's progress (data/manifest.h; may be NULL). */
mmp_err mmp_dataset_open_progress(mmp_dataset **out, const char *manifest, const char *vocab,
                                  const mmp_plan *plan, mmp_manifest_progress progress, void *ctx);
void mmp_dataset_close(mmp_dataset *d);

int64_t mmp_dataset_size(const mmp_dataset *d);
int mmp_dataset_vocab_size(const mmp_dataset *d);
/* Bad manifest lines open left out under skip (0 under fail). */
int64_t mmp_dataset_dropped(const mmp_dataset *d);
/* Heap bytes the open dataset's sample index holds (excluding the vocab). */
size_t mmp_dataset_index_bytes(const mmp_dataset *d);

/* The sample index at global position k of a run (k = step*batch + i):
 * epoch e = k / size is a permutation of [0,size) seeded by (seed, e) when
 * shuffle, else the identity. Pure function of its arguments. */
int64_t mmp_dataset_sample_at(const mmp_dataset *d, uint64_t seed, int64_t k, int shuffle);

/* Loads samples[0..n) into images (n,3,S,S) normalised NCHW float, ids (n,T)
 * int32 ([CLS] ... [SEP] [PAD]...), mask (n,T) 1/0. Errors name the manifest
 * line and the reason (missing file, bad image, empty caption). images NULL
 * skips decoding (the text branch); ids NULL skips tokenizing and mask (the
 * image branch). Thread-safe for concurrent calls on distinct outputs. A bad
 * sample is an error whatever the plan's on_bad_sample (the strict path). */
mmp_err mmp_dataset_load(mmp_dataset *d, const int64_t *samples, int n, float *images, int32_t *ids,
                         float *mask);

/* mmp_dataset_load under the plan's on_bad_sample; valid (n) and skipped (may
 * be NULL) are written. Under fail it is mmp_dataset_load with valid[i] = 1.
 * Under skip a sample whose own data is bad (missing, unreadable, zero-size,
 * truncated or undecodable image when images is not NULL; a caption with no
 * tokens when ids is not NULL) is not an error: valid[i] = 0, its image is
 * zeros and its caption [CLS] [SEP] (mask 1 1 0 ...), *skipped counts it and
 * the first few are logged with manifest:line and reason; good samples load
 * bit-identically to mmp_dataset_load. Errors that are not a sample's (index
 * out of range, no memory, the manifest unreadable or changed since open)
 * are returned under either policy. */
mmp_err mmp_dataset_load_valid(mmp_dataset *d, const int64_t *samples, int n, float *images,
                               int32_t *ids, float *mask, uint8_t *valid, int *skipped);

/* mmp_dataset_load_valid for training: positions (n) are the samples' run
 * positions (step * batch + offset); with data.augment the random resized
 * crop and flip of each are drawn from (job.seed, position). */
mmp_err mmp_dataset_load_at(mmp_dataset *d, const int64_t *samples, const int64_t *positions, int n,
                            float *images, int32_t *ids, float *mask, uint8_t *valid, int *skipped);

/* Whether the image file at path can be a sample: MMP_ERR_DATA "missing image
 * PATH (reason)", "... not a regular file" or "... is empty (0 bytes)" with
 * *kind set, else MMP_OK. Looks at the file's metadata only. */
mmp_err mmp_dataset_check_file(const char *path, mmp_sample_problem *kind);

#endif
