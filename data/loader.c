/* The prefetching loader of data/loader.h.
 *
 * The run's owned micro-batches are numbered in order, seq = (step -
 * first_step) * n_owned + rank[mb], where rank[mb] counts the owned
 * micro-batches before mb (unowned ones get no seq at all, so neither the
 * workers nor the consumer ever see them), and seq lives in ring slot
 * seq % depth. A worker claims
 * the lowest unclaimed seq whose slot is free, fills it outside the lock and
 * publishes it; the consumer waits for exactly the seq it asks for. What a
 * batch holds is a function of its seq alone (samples from the dataset's
 * order, loaded one by one), so any number of workers, in any interleaving,
 * gives the bytes workers = 0 gives. Every buffer is allocated at create;
 * the mutex guards only the slots' states and the counters, never data.
 * Workers check a stop flag between samples, so destroy waits for at most
 * one sample per worker. This file never decides what a bad sample is (the
 * dataset does) and never computes the pairing digest (stages/ does: data/
 * must not depend on stages/). */
#include "data/loader.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/progress.h"

typedef enum slot_state { SLOT_FREE = 0, SLOT_LOADING, SLOT_READY, SLOT_HELD } slot_state;

typedef struct slot {
    mmp_batch b;
    int64_t seq;      /* the micro-batch it holds or is being filled with */
    slot_state state; /* guarded by the loader's mutex */
    mmp_err err;      /* of the fill */
    char why[1024];   /* mmp_last_error() of a failed fill (another thread's) */
} slot;

struct mmp_loader {
    mmp_dataset *ds;
    mmp_plan plan; /* a copy: the caller's may go before the workers do */
    void *(*host_alloc)(void *ctx, size_t bytes); /* the cfg's; NULL: calloc */
    void (*host_free)(void *ctx, void *p);
    void *alloc_ctx;
    int microbatches, mb_max;
    int n_owned;   /* owned micro-batches per step */
    int *owned_mb; /* [n_owned]: the owned mbs, ascending */
    int *rank;     /* [microbatches]: index into owned_mb, -1 when not owned */
    int images, text, first_step;
    int64_t total; /* micro-batches in the run */
    int depth;
    slot *ring;

    pthread_mutex_t mu;
    pthread_cond_t work; /* a slot was freed, or stop */
    pthread_cond_t done; /* a slot became ready */
    int64_t next_claim;  /* the next seq a worker fills */
    int64_t next_get;    /* the next seq the consumer asks for */
    atomic_int stop;
    int sync_ok; /* mu, work and done were initialised */

    pthread_t *threads;
    int n_threads;
};

/* Fills s with micro-batch seq. Runs without the lock: the slot is this
 * caller's until it publishes the result. */
static void fill(mmp_loader *l, slot *s, int64_t seq)
{
    mmp_batch *b = &s->b;
    const double t0 = mmp_now();
    const mmp_plan *p = &l->plan;
    const size_t S = (size_t)p->data.image_size, T = (size_t)p->data.max_text_len;
    b->step = l->first_step + (int)(seq / l->n_owned);
    b->mb = l->owned_mb[seq % l->n_owned];
    b->n = mmp_plan_mb_size(p, b->mb);
    b->digest = 0; /* the stage's: see the top of the file */
    b->skipped = 0;
    const int64_t base = (int64_t)b->step * p->train.batch + mmp_plan_mb_offset(p, b->mb);
    for (int i = 0; i < b->n; i++) {
        b->samples[i] = mmp_dataset_sample_at(l->ds, (uint64_t)p->job.seed, base + i, 1);
    }
    s->err = MMP_OK;
    for (int i = 0; i < b->n && s->err == MMP_OK; i++) {
        if (atomic_load(&l->stop)) {
            s->err = mmp_errorf(MMP_ERR_INTERNAL, "loader stopped");
            break;
        }
        int skipped = 0;
        const int64_t position = base + i;
        s->err =
            mmp_dataset_load_at(l->ds, &b->samples[i], &position, 1,
                                b->images ? b->images + (size_t)i * 3 * S * S : NULL,
                                b->ids ? b->ids + (size_t)i * T : NULL,
                                b->mask ? b->mask + (size_t)i * T : NULL, &b->valid[i], &skipped);
        b->skipped += skipped;
    }
    if (s->err != MMP_OK) {
        snprintf(s->why, sizeof s->why, "%s", mmp_last_error());
    }
    b->load_ms = (mmp_now() - t0) * 1e3;
}

/* Whether a worker can claim the next seq now (under the lock). */
static int claimable(const mmp_loader *l)
{
    return l->next_claim < l->total && l->ring[l->next_claim % l->depth].state == SLOT_FREE;
}

static void *worker_main(void *arg)
{
    mmp_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!atomic_load(&l->stop) && !claimable(l)) {
            pthread_cond_wait(&l->work, &l->mu);
        }
        if (atomic_load(&l->stop)) {
            break;
        }
        const int64_t seq = l->next_claim++;
        slot *s = &l->ring[seq % l->depth];
        s->state = SLOT_LOADING;
        s->seq = seq;
        pthread_mutex_unlock(&l->mu);
        fill(l, s, seq);
        pthread_mutex_lock(&l->mu);
        s->state = SLOT_READY;
        pthread_cond_broadcast(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* A micro-batch's tensor memory: the caller's allocator, else calloc. */
static void *tensor_alloc(mmp_loader *l, size_t bytes)
{
    return l->host_alloc ? l->host_alloc(l->alloc_ctx, bytes) : calloc(1, bytes ? bytes : 1);
}

static void tensor_free(mmp_loader *l, void *p)
{
    if (l->host_free) {
        if (p) {
            l->host_free(l->alloc_ctx, p);
        }
    } else {
        free(p);
    }
}

static mmp_err alloc_slot(mmp_loader *l, slot *s)
{
    const size_t n = (size_t)l->mb_max, S = (size_t)l->plan.data.image_size,
                 T = (size_t)l->plan.data.max_text_len;
    mmp_batch *b = &s->b;
    b->samples = calloc(n, sizeof *b->samples);
    b->valid = calloc(n, sizeof *b->valid);
    if (l->images) {
        b->images = tensor_alloc(l, n * 3 * S * S * sizeof *b->images);
    }
    if (l->text) {
        b->ids = tensor_alloc(l, n * T * sizeof *b->ids);
        b->mask = tensor_alloc(l, n * T * sizeof *b->mask);
    }
    if (!b->samples || !b->valid || (l->images && !b->images) ||
        (l->text && (!b->ids || !b->mask))) {
        return mmp_errorf(
            MMP_ERR_NOMEM, "loader: %zu bytes for a micro-batch of %zu samples",
            n * (sizeof(int64_t) + 1 + (l->images ? 12 * S * S : 0) + (l->text ? 8 * T : 0)), n);
    }
    return MMP_OK;
}

static void free_slot(mmp_loader *l, slot *s)
{
    free(s->b.samples);
    free(s->b.valid);
    tensor_free(l, s->b.images);
    tensor_free(l, s->b.ids);
    tensor_free(l, s->b.mask);
}

mmp_err mmp_loader_create(mmp_loader **out, const mmp_loader_cfg *cfg)
{
    mmp_err ret = MMP_OK;
    *out = NULL;
    const mmp_plan *p = cfg->plan;
    if (!cfg->ds || !p) {
        return mmp_errorf(MMP_ERR_INVALID, "loader: no dataset or plan");
    }
    if (cfg->depth < 1) {
        return mmp_errorf(MMP_ERR_INVALID, "loader: depth %d < 1", cfg->depth);
    }
    if (cfg->first_step < 0 || cfg->last_step < cfg->first_step) {
        return mmp_errorf(MMP_ERR_INVALID, "loader: steps [%d, %d) are not a range",
                          cfg->first_step, cfg->last_step);
    }
    if (p->train.microbatches < 1 || p->train.microbatches > p->train.batch) {
        return mmp_errorf(MMP_ERR_INVALID, "loader: %d micro-batches for a batch of %d",
                          p->train.microbatches, p->train.batch);
    }
    if (p->data.workers < 0) {
        return mmp_errorf(MMP_ERR_INVALID, "loader: data.workers %d < 0", p->data.workers);
    }
    mmp_loader *l = calloc(1, sizeof *l);
    if (!l) {
        return mmp_errorf(MMP_ERR_NOMEM, "loader");
    }
    l->ds = cfg->ds;
    l->plan = *p;
    l->host_alloc = cfg->host_alloc;
    l->host_free = cfg->host_free;
    l->alloc_ctx = cfg->alloc_ctx;
    l->microbatches = p->train.microbatches;
    l->mb_max = mmp_plan_mb_size(p, 0);
    l->images = cfg->images != 0;
    l->text = cfg->text != 0;
    l->first_step = cfg->first_step;
    l->owned_mb = calloc((size_t)l->microbatches, sizeof *l->owned_mb);
    l->rank = calloc((size_t)l->microbatches, sizeof *l->rank);
    if (!l->owned_mb || !l->rank) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "loader: tables of %d micro-batches", l->microbatches);
        goto fail;
    }
    for (int mb = 0; mb < l->microbatches; mb++) {
        l->rank[mb] = -1;
        if (!cfg->owns || cfg->owns[mb]) {
            l->rank[mb] = l->n_owned;
            l->owned_mb[l->n_owned++] = mb;
        }
    }
    if (l->n_owned == 0) {
        ret = mmp_errorf(MMP_ERR_INVALID, "loader: owns none of the %d micro-batches",
                         l->microbatches);
        goto fail;
    }
    l->total = (int64_t)(cfg->last_step - cfg->first_step) * l->n_owned;
    l->depth = cfg->depth;
    atomic_init(&l->stop, 0);
    l->ring = calloc((size_t)l->depth, sizeof *l->ring);
    if (!l->ring) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "loader: ring of %d", l->depth);
        goto fail;
    }
    for (int i = 0; i < l->depth; i++) {
        MMP_TRY_GOTO(alloc_slot(l, &l->ring[i]), ret, fail);
    }
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        ret = mmp_errorf(MMP_ERR_INTERNAL, "loader: pthread_mutex_init failed");
        goto fail;
    }
    if (pthread_cond_init(&l->work, NULL) != 0) {
        pthread_mutex_destroy(&l->mu);
        ret = mmp_errorf(MMP_ERR_INTERNAL, "loader: pthread_cond_init failed");
        goto fail;
    }
    if (pthread_cond_init(&l->done, NULL) != 0) {
        pthread_cond_destroy(&l->work);
        pthread_mutex_destroy(&l->mu);
        ret = mmp_errorf(MMP_ERR_INTERNAL, "loader: pthread_cond_init failed");
        goto fail;
    }
    l->sync_ok = 1;
    if (p->data.workers > 0) {
        l->threads = calloc((size_t)p->data.workers, sizeof *l->threads);
        if (!l->threads) {
            ret = mmp_errorf(MMP_ERR_NOMEM, "loader: %d threads", p->data.workers);
            goto fail;
        }
    }
    for (int i = 0; i < p->data.workers; i++) {
        int rc = pthread_create(&l->threads[i], NULL, worker_main, l);
        if (rc != 0) {
            ret = mmp_errorf(MMP_ERR_INTERNAL, "loader: starting worker %d of %d: %s", i + 1,
                             p->data.workers, strerror(rc));
            goto fail;
        }
        l->n_threads++;
    }
    *out = l;
    return MMP_OK;
fail:
    mmp_loader_destroy(l);
    return ret;
}

mmp_err mmp_loader_get(mmp_loader *l, int step, int mb, mmp_batch **b)
{
    *b = NULL;
    if (mb >= 0 && mb < l->microbatches && l->rank[mb] < 0) {
        return mmp_errorf(MMP_ERR_INVALID,
                          "loader: step %d micro-batch %d asked for, but this loader does not "
                          "own micro-batch %d",
                          step, mb, mb);
    }
    const int64_t seq = mb >= 0 && mb < l->microbatches
                            ? (int64_t)(step - l->first_step) * l->n_owned + l->rank[mb]
                            : -1;
    if (seq < 0 || step < l->first_step || seq != l->next_get || seq >= l->total) {
        const int64_t want = l->next_get;
        if (want >= l->total) {
            return mmp_errorf(MMP_ERR_INVALID,
                              "loader: step %d micro-batch %d asked for after the last one", step,
                              mb);
        }
        return mmp_errorf(MMP_ERR_INVALID,
                          "loader: step %d micro-batch %d asked for out of order (next is step %d "
                          "micro-batch %d)",
                          step, mb, l->first_step + (int)(want / l->n_owned),
                          l->owned_mb[want % l->n_owned]);
    }
    slot *s = &l->ring[seq % l->depth];
    pthread_mutex_lock(&l->mu);
    if (s->state == SLOT_HELD) {
        pthread_mutex_unlock(&l->mu);
        return mmp_errorf(MMP_ERR_INVALID,
                          "loader: step %d micro-batch %d asked for while all %d buffered "
                          "micro-batches are held (release one first)",
                          step, mb, l->depth);
    }
    if (l->n_threads == 0) { /* synchronous: fill it here */
        s->state = SLOT_LOADING;
        s->seq = seq;
        pthread_mutex_unlock(&l->mu);
        fill(l, s, seq);
        pthread_mutex_lock(&l->mu);
    } else {
        while (!(s->seq == seq && s->state == SLOT_READY)) {
            pthread_cond_wait(&l->done, &l->mu);
        }
    }
    l->next_get = seq + 1;
    mmp_err err = s->err;
    s->state = err == MMP_OK ? SLOT_HELD : SLOT_FREE;
    if (err != MMP_OK) {
        pthread_cond_broadcast(&l->work);
    }
    pthread_mutex_unlock(&l->mu);
    if (err != MMP_OK) {
        return mmp_errorf(err, "%s", s->why);
    }
    *b = &s->b;
    return MMP_OK;
}

void mmp_loader_release(mmp_loader *l, mmp_batch *b)
{
    if (!b) {
        return;
    }
    slot *s = (slot *)((char *)b - offsetof(slot, b));
    MMP_ASSERT(s >= l->ring && s < l->ring + l->depth);
    pthread_mutex_lock(&l->mu);
    MMP_ASSERT(s->state == SLOT_HELD);
    s->state = SLOT_FREE;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
}

void mmp_loader_destroy(mmp_loader *l)
{
    if (!l) {
        return;
    }
    if (l->sync_ok) {
        pthread_mutex_lock(&l->mu);
        atomic_store(&l->stop, 1);
        pthread_cond_broadcast(&l->work);
        pthread_mutex_unlock(&l->mu);
    }
    for (int i = 0; i < l->n_threads; i++) {
        pthread_join(l->threads[i], NULL);
    }
    if (l->sync_ok) {
        pthread_cond_destroy(&l->done);
        pthread_cond_destroy(&l->work);
        pthread_mutex_destroy(&l->mu);
    }
    for (int i = 0; l->ring && i < l->depth; i++) {
        free_slot(l, &l->ring[i]);
    }
    free(l->ring);
    free(l->threads);
    free(l->owned_mb);
    free(l->rank);
    free(l);
}
