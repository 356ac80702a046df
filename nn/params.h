/* A network's parameters: named tensors in one flat arena.
 *
 * Values, gradients and the AdamW moments each live in one contiguous fp32
 * block, so a replica all-reduce is one buffer and a checkpoint is a walk
 * over names. Initialisation of each parameter is seeded by (seed, its name),
 * never by declaration order, so a layer initialises to the same values
 * whether it lives in the single-process model or in any pipeline sub-stage.
 *
 * Buffers (batch-norm running statistics) are entries with trainable == 0:
 * checkpointed, never given a gradient or an optimizer step.
 *
 * Every arena (values, gradients, AdamW moments, the double accumulator) is
 * memory of the arena's backend (kernels/backend.h): device memory on a GPU
 * backend, so mmp_param's w/g/m/v and mmp_params' arrays are backend pointers
 * that only the backend's ops and copies may touch. On the CPU backend (the
 * default) they are host memory, as before. Initial values are computed on
 * the host and copied over; checkpoints are written from and read into host
 * copies. */
#ifndef MMP_NN_PARAMS_H
#define MMP_NN_PARAMS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "nn/lowp.h"

#define MMP_NAME_MAX 96

typedef enum mmp_init {
    MMP_INIT_ZERO = 0,
    MMP_INIT_ONE,
    MMP_INIT_NORMAL,      /* N(0, scale^2) */
    MMP_INIT_KAIMING,     /* N(0, 2 / fan_in), scale ignored */
    MMP_INIT_UNIFORM_FAN, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (PyTorch's linear/conv default) */
    MMP_INIT_CONST,       /* every value = scale */
} mmp_init;

typedef struct mmp_param {
    char name[MMP_NAME_MAX]; /* "image.layer1.0.conv1.weight" */
    int ndim;
    int64_t shape[4];
    size_t n;      /* elements */
    size_t offset; /* into the arena */
    int trainable; /* 0 for buffers */
    int decay;     /* AdamW weight decay applies (weights of linear/conv, not biases/norms) */
    mmp_init init;
    float init_scale;
    int64_t fan_in;
    /* set by mmp_params_alloc(): */
    float *w, *g, *m, *v; /* g, m, v are NULL for buffers */
} mmp_param;

typedef struct mmp_params {
    mmp_backend *be; /* where the arenas live and what computes on them */
    mmp_param *items;
    int count, cap;
    size_t total;  /* elements in the arena */
    float *values; /* total */
    float *grads;  /* total (zero for buffers) */
    float *adam_m, *adam_v;
    double *grad_acc; /* total: gradients summed over a step's micro-batches */
    float *marks;     /* the buffers as of mmp_params_buffers_mark (lazily made) */
} mmp_params;

/* An empty table on the CPU backend; _on: on backend be (not owned). */
void mmp_params_init(mmp_params *p);
void mmp_params_init_on(mmp_params *p, mmp_backend *be);
/* Declares a parameter; its pointers are set by mmp_params_alloc(). Returns its index. */
mmp_err mmp_params_add(mmp_params *p, const char *name, int ndim, const int64_t *shape,
                       int trainable, int decay, mmp_init init, float init_scale, int *index);
/* Allocates the arenas and initialises every value from seed. */
mmp_err mmp_params_alloc(mmp_params *p, uint64_t seed);
void mmp_params_fini(mmp_params *p);

/* What every network of nn/ owns besides its own pieces: a parameter arena on
 * its backend and its products' precision (nn/lowp.h). Init cannot fail; fini
 * is NULL-safe and idempotent, as mmp_params_fini and mmp_lowp_fini are. */
void mmp_params_net_init(mmp_params *p, mmp_lowp *lp, mmp_backend *be, mmp_precision prec);
void mmp_params_net_fini(mmp_params *p, mmp_lowp *lp);

mmp_param *mmp_params_find(mmp_params *p, const char *name);
/* Zeroes the gradients and their step accumulator. */
void mmp_params_zero_grad(mmp_params *p);

/* Gradient accumulation over micro-batches. Each micro-batch's backward
 * writes its gradients into zeroed float buffers (mb_begin); mb_end adds them
 * to a double accumulator; grad_finish rounds the sum back into the float
 * gradients the norm and the optimizer read. A sum of a few floats is exact
 * in double (unless their magnitudes are 2^28 apart, where rounding to float
 * hides the difference), so the step's gradients do not depend on how the
 * micro-batches were grouped -- one process, or replicas each summing theirs
 * before the replicas' sum (transport/reduce.h, mmp_reduce_sum_f64): the same
 * bits. The kernels' own "+=" into a non-zero buffer would make the grouping
 * show in the last bits, which Adam turns into visible differences for
 * parameters whose true gradient is near zero. */
void mmp_params_mb_begin(mmp_params *p);
void mmp_params_mb_end(mmp_params *p);
/* mb_end for the n gradients at g (inside p->grads) only: a deferred weight
 * pass adds its ranges with it (nn/wgrad.h). */
void mmp_params_acc_range(mmp_params *p, const float *g, size_t n);
void mmp_params_grad_finish(mmp_params *p);
/* Divides the gradients by loss_scale (fp16 loss scaling, common/loss_scale.h;
 * a power of two, so exact) after grad_finish; nothing when it is 1. */
void mmp_params_grad_unscale(mmp_params *p, float loss_scale);
/* Sum of squares of all trainable gradients (double; waits for the backend). */
double mmp_params_grad_sumsq(const mmp_params *p);
/* Bytes of p's arenas on its backend once allocated: values, gradients, the
 * two AdamW moments (floats) and the step accumulator (doubles). */
size_t mmp_params_bytes(const mmp_params *p);

/* Buffers (batch-norm running statistics) move in a training forward, before
 * the optimizer step: a step cut short (a bad sample met under
 * data.on_bad_sample: fail, a peer gone) leaves them ahead of the weights.
 * mmp_params_buffers_mark copies every buffer aside (backend memory made at
 * the first mark; one queued copy per run of adjacent buffers), and
 * mmp_params_buffers_rewind copies them back: the state is again exactly
 * that of the last mark (the end of the last finished step). Nothing when
 * p has no buffers; rewind without a mark does nothing. */
mmp_err mmp_params_buffers_mark(mmp_params *p);
void mmp_params_buffers_rewind(mmp_params *p);

/* Writes every entry (values; for trainable ones also "<name>.adam_m" and
 * "<name>.adam_v") to a checkpoint file at path (common/ckpt.h format). */
mmp_err mmp_params_save(const mmp_params *p, const char *path);
/* A host copy of a network's checkpointed state (values and AdamW moments)
 * at one instant, so a checkpoint can be written while training goes on
 * (stages/ckpt_writer.h). mmp_params_snapshot copies the arenas to host
 * memory it keeps for the next snapshot (3 x total floats: the price of an
 * asynchronous checkpoint), together with the parameter table, so the
 * snapshot is writable without p (which may be changed or freed meanwhile).
 * mmp_params_snap_save writes exactly the file mmp_params_save writes from
 * the same state. */
typedef struct mmp_params_snap {
    mmp_param *items; /* copied table: w/m/v point into host */
    int count;
    float *host; /* values | adam_m | adam_v, total floats each */
    size_t total;
    size_t bytes;      /* of the tensors the file will hold */
    atomic_int cancel; /* mmp_params_snap_cancel */
} mmp_params_snap;

mmp_err mmp_params_snapshot(const mmp_params *p, mmp_params_snap *s);
mmp_err mmp_params_snap_save(const mmp_params_snap *s, const char *path);
/* Stops a save in progress at its next tensor (from another thread; the
 * save then fails, leaving no file). */
void mmp_params_snap_cancel(mmp_params_snap *s);
void mmp_params_snap_fini(mmp_params_snap *s);

/* Loads every entry of p from c by name; a missing tensor or a shape that
 * differs is an error naming it. */
struct mmp_ckpt;
mmp_err mmp_params_load(mmp_params *p, const struct mmp_ckpt *c);

#endif
