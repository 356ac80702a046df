/* "Shapes": a synthetic image-caption set that a small model learns fast.
 *
 * Each image is image_size x image_size, a dark noisy background with 1 to 3
 * non-overlapping objects; each object has a colour, a shape and a size and
 * sits in one cell of a 3x3 grid (with jitter). The caption names every
 * object and either its place (one object) or a spatial relation (two or
 * three), e.g. "a small red circle left of a large blue square". Everything
 * is drawn from mmp_rng streams keyed by (seed, sample index): the same seed
 * always gives the same bytes. */
#ifndef MMP_DATA_SYNTH_H
#define MMP_DATA_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MMP_SYNTH_MIN_IMAGE 16
#define MMP_SYNTH_MAX_IMAGE 1024
#define MMP_SYNTH_CAPTION_MAX 256 /* bytes, including the NUL; every caption fits */

/* Number of validation samples written beside `samples` training samples:
 * max(1, min(256, samples / 8)). */
int mmp_synth_val_count(int samples);

/* Draws sample `index` of the set seeded by seed: rgb (image_size,
 * image_size, 3) and its caption (NUL-terminated, < MMP_SYNTH_CAPTION_MAX
 * bytes). *n_objects (may be NULL) receives the object count. Pure function
 * of its arguments. */
mmp_err mmp_synth_sample(uint64_t seed, int64_t index, int image_size, uint8_t *rgb,
                         char caption[MMP_SYNTH_CAPTION_MAX], int *n_objects);

/* Writes the set to out_dir (created if missing, files overwritten):
 *   images/NNNNNN.png  samples + val images (training first, then validation)
 *   train.jsonl        `samples` lines {"image": "images/NNNNNN.png", "text": "..."}
 *   val.jsonl          mmp_synth_val_count(samples) lines, disjoint from train
 *   vocab.txt          BERT vocab: [PAD] [UNK] [CLS] [SEP] [MASK], every caption
 *                      word, then ASCII punctuation
 * samples in [1, 10^7], image_size in [MMP_SYNTH_MIN_IMAGE, MMP_SYNTH_MAX_IMAGE].
 * Blocks until done. On failure (or when killed) images and vocab.txt may
 * have been written, but no train.jsonl or val.jsonl (an older set's are
 * removed at the start): the manifests are written under .tmp names and
 * renamed once every image is in place. */
mmp_err mmp_synth_write(const char *out_dir, int samples, uint64_t seed, int image_size);

#endif
