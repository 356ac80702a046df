/* The prefetching loader: decodes and tokenises micro-batches ahead of the
 * step on `workers` threads into a bounded queue, so branch compute does not
 * wait on data when the workers keep up.
 *
 * A loader produces the micro-batches of one run in order: (step, mb) for
 * steps [first_step, last_step) and mb in [0, microbatches), each with the
 * samples the dataset's order gives (both branches compute the same ones).
 * Each micro-batch carries a per-sample valid flag: under
 * data.on_bad_sample = skip a bad sample (missing / unreadable / truncated /
 * empty image, a caption with no tokens) is flagged 0, its image zeroed and
 * its caption [CLS] [SEP], and counted; under fail the first bad sample is an
 * error naming the manifest line and reason, returned by mmp_loader_get for
 * that micro-batch. (Lines bad in themselves, such as malformed JSON or an
 * empty caption, never reach a batch: see data/dataset.h.)
 * workers = 0 loads synchronously inside mmp_loader_get (the reference
 * behaviour; results are identical for any worker count).
 * With cfg.owns the loader produces only the owned micro-batches of each
 * step (a replica's share), in the same order, and each with the same
 * contents as the unfiltered loader's (step, mb): the samples of a
 * micro-batch are a function of (step, mb) alone. */
#ifndef MMP_DATA_LOADER_H
#define MMP_DATA_LOADER_H

#include <stdint.h>

#include "common/config.h"
#include "data/dataset.h"

typedef struct mmp_batch {
    int step, mb, n;
    int64_t *samples; /* (n) dataset indices */
    uint64_t digest;  /* 0: data/ must not use stages/'s mmp_sample_digest */
    float *images;    /* (n,3,S,S) or NULL when the loader loads no images */
    int32_t *ids;     /* (n,T) or NULL when it loads no text */
    float *mask;      /* (n,T) or NULL */
    uint8_t *valid;   /* (n) 1 = good sample */
    int skipped;      /* samples flagged 0 in this micro-batch */
    double load_ms;   /* worker time spent producing it */
} mmp_batch;

typedef struct mmp_loader_cfg {
    mmp_dataset *ds;
    const mmp_plan *plan; /* batch, microbatches, seed, data.workers, on_bad_sample */
    int images, text;     /* which modalities to produce */
    int first_step, last_step;
    int depth; /* micro-batches buffered ahead (>= 1) */
    /* [plan->train.microbatches]: produce only micro-batches mb with
     * owns[mb] != 0 (every step); NULL: all. Copied at create. */
    const unsigned char *owns;
    /* Optional: where the images, ids and mask of each buffered micro-batch
     * live (zeroed memory; a GPU stage passes page-locked memory so its
     * uploads run asynchronously). NULL: calloc/free. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    void *alloc_ctx;
} mmp_loader_cfg;

typedef struct mmp_loader mmp_loader;

mmp_err mmp_loader_create(mmp_loader **out, const mmp_loader_cfg *cfg);
/* Blocks until (step, mb), the next in order, is ready. The batch stays valid
 * until mmp_loader_release. Requests must come in order of the owned
 * (step, mb); an unowned mb is an error naming it (nothing is consumed). */
mmp_err mmp_loader_get(mmp_loader *l, int step, int mb, mmp_batch **b);
void mmp_loader_release(mmp_loader *l, mmp_batch *b);
/* Stops the workers and frees everything; NULL-safe. */
void mmp_loader_destroy(mmp_loader *l);

#endif
