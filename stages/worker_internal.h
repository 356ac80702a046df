/* The stage worker's internals, shared by its files (internal to stages/;
 * the contract is stages/worker.h):
 *   worker.c        the control plane (messages to and from the coordinator)
 *                   and the serve loop: Assignment, Start, Clip, Program,
 *                   EvalRequest, CheckpointRequest, Shutdown, Abort; a step
 *                   cut short by a bad sample or a peer's end (hold);
 *   worker_build.c  set-up from the assignment: plan, nets on the backend,
 *                   data set and loader, channels, reduce; teardown;
 *   worker_exec.c   one step: the instruction interpreter and the data plane
 *                   (LOAD, RECV/SEND, FWD, BWD, REDUCE, NORM, OPT);
 *   worker_eval.c   evaluation and checkpoints.
 * One worker per process, one thread; errors are mmp_err values. */
#ifndef MMP_STAGES_WORKER_INTERNAL_H
#define MMP_STAGES_WORKER_INTERNAL_H

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/ckpt.h"
#include "common/loss_scale.h"
#include "common/metrics.h"
#include "common/progress.h"
#include "common/trace.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/cpu.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "nn/wgrad.h"
#include "stages/ckpt_writer.h"
#include "stages/fuse.h"
#include "stages/pairing.h"
#include "stages/peer.h"
#include "transport/channel.h"
#include "transport/control.h"
#include "transport/reduce.h"
#include "transport/reduce_nccl.h"

/* A process's channels: two per replica of the stage before it and of the
 * stage after it (fusion: of both branches' last sub-stages), so at most
 * 2 (2 MMP_MAX_REPLICAS) (coordinator/schedule.h). The worker is static. */
#define MAX_CHANNELS (4 * MMP_MAX_REPLICAS)
#define MAX_INFLIGHT MMP_MAX_MICROBATCHES /* the plan and the assignment check allow no more */

typedef struct chan {
    int id;
    int send, grad;
    int peer_text;    /* the other end is on the text branch (fusion uses it) */
    int peer_r0;      /* the other end is replica 0 of its stage (evaluation's path) */
    mmp_channel *ch;  /* carries its transport's ops */
    size_t row_bytes; /* payload bytes per sample (a message of n samples carries n rows) */
    /* A received message not yet consumed (zero-copy: payload is in the slot). */
    int held;
    mmp_msg_header hdr;
    const float *payload; /* always the stage backend's memory (see below) */
    /* A GPU stage on a host-memory channel (shm, a CPU peer): received
     * payloads are copied into stage_dev (backend memory), sent ones are
     * gathered in stage_host (pinned) first. NULL otherwise: CPU stages use
     * the slot in place, cuda_ipc slots are device memory already. */
    void *stage_dev, *stage_host;
    /* An edge between a branch and fusion carries its data (activations or
     * their gradients) in the training precision (prec; FP32 on every other
     * edge and in fp32 training): data_row floats a sample, stored in
     * mmp_backend_lp_bytes(prec) bytes each. The fp32 parts (text mask, valid
     * flags) go first in the message, the packed data last, so both stay
     * aligned; the sender packs into packed, the receiver widens into wide
     * (data, mask, valid: the fp32 layout) and points payload there. Both
     * are backend memory; NULL when prec is FP32. */
    mmp_precision prec;
    size_t data_row;
    void *packed;
    float *wide;
    /* Sending: a slot acquired before the computation whose output it
     * receives in place (zero-copy posting, worker_exec.c); NULL: none. */
    float *zc;
} chan;

typedef struct flight {
    int mb; /* -1 when free */
    int n;
    uint64_t digest;
    void *acts;
    float *mask;  /* text: (mb_max, T) the micro-batch's mask, forwarded along (backend) */
    float *valid; /* (mb_max) 1 = good sample, 0 = skipped (data.on_bad_sample: skip; HOST) */
    /* GPU branch stages: the valid flags on the device (backend, mb_max),
     * copied from the received payload or uploaded with the batch and sent
     * on from there: the host never waits for them (NULL on the CPU, whose
     * host valid is read in place). */
    float *valid_dev;
    /* zb-h1: BWD_INPUT ran, its weight gradients wait in wg for BWD_WEIGHT;
     * the activations stay until then (W reads the layers' inputs). */
    int b_done;
    mmp_wgrad wg;
} flight;

typedef struct worker {
    char name[80];
    const char *token; /* the job token: also the secret of its tcp data connections */
    mmp_ctl *ctl;
    /* The coordinator ended this process (Abort, Shutdown while waiting) or
     * went away: the end is its doing, nothing to report back. */
    int ended_by_coordinator;
    Mmpipe__Envelope *asg_env;
    const Mmpipe__Assignment *asg;
    /* This step's list: the assignment's, or the last Program's (routing). */
    Mmpipe__Instr **prog;
    size_t n_prog;
    Mmpipe__Envelope *prog_env;
    unsigned char *owns; /* [microbatches] from the list's LOADs / FWDs */
    int replica, replicas, slot;
    int pin_index;       /* mmp_worker_args.pin_index */
    int nice;            /* mmp_worker_args.nice */
    mmp_reduce *reduce;  /* replicas > 1 */
    double *reduce_host; /* replicas of a GPU stage: the gradient sums staged on the host */
    /* GPU replicas across hosts (a "#nccl" reduce address): the gradient
     * sums over NCCL on the device; reduce then carries the small host
     * vectors (batch-norm rows, fusion's gather) and each sum's n check */
    mmp_reduce_nccl *reduce_dev;
    const mmp_reduce_nccl_ops *nccl; /* reduce_dev's calls (the CUDA module's) */
    float *bn_rows; /* image replicas: [microbatches][bn_row] batch-norm statistics */
    int64_t bn_row;
    mmp_plan plan;
    /* Where this stage computes: its slot's device (mmp_plan_slot_device),
     * gpu = the CUDA ordinal or -1 for the CPU. Nets, activations and every
     * buffer a net reads or writes are be's memory; valid flags, the loaded
     * batch and evaluation's embeddings are HOST memory. */
    mmp_backend *be;
    int gpu;
    mmp_branch kind; /* which stage: image, text or fusion (the wire's StageKind) */
    int sub, n_sub, first, last;
    mmp_image_net *img;
    mmp_text_net *txt;
    mmp_fusion_net *fus;
    mmp_params *params;
    mmp_dataset *train, *val;
    chan chans[MAX_CHANNELS];
    int n_chans;
    /* The channels of the last receives (with replicas, an input may come
     * from any replica of the stage before). */
    chan *in_act[2]; /* [0] image / own branch, [1] text (fusion) */
    chan *in_grad;
    flight *fl;
    int n_fl;
    int mb_max, T, D, B;
    int64_t in_floats, out_floats; /* per sample, of this stage's range */
    /* buffers: HOST images, ids, mask (evaluation's load); backend out, din,
     * dimg, dtxt and, on a GPU, d_images, d_ids (the loaded inputs uploaded) */
    float *images, *mask, *out, *din, *dimg, *dtxt, *d_images;
    int32_t *ids, *d_ids;
    float *valid_in[2]; /* fusion: a micro-batch's valid flags, image and text (HOST) */
    float *emb_dev[2];  /* fusion on a GPU: a chunk's embeddings, image and text */
    int64_t *samples;
    mmp_loader *loader;  /* training micro-batches (first sub-stage of a branch) */
    mmp_batch *batch;    /* the loaded micro-batch, until its forward */
    mmp_batch *uploaded; /* GPU: the last one, until its upload is done (next load) */
    const float *in_images, *in_mask;
    const int32_t *in_ids;
    float *in_valid;
    uint8_t *eval_valid; /* evaluation's load: each validation sample good (1) or skipped */
    int loaded_mb, loaded_n;
    uint64_t loaded_digest;
    mmp_fuse fuse; /* fusion: for mb_max rows, or train.batch under batch scope */
    /* fusion under model.fusion.itc_scope: batch (real compute): the step's
     * rows gathered from every FWD; the first BWD runs the loss over them
     * with fl[0].acts (made for train.batch rows; the other flights have
     * none) and every BWD sends its micro-batch's rows of the gradients.
     * zb-h1: the first BWD_INPUT records the weight part (fstep.wg), the
     * first BWD_WEIGHT runs it, reading fl[0].acts (untouched until then:
     * every FWD came before) */
    int batch_scope;
    mmp_fuse_step fstep;
    /* fusion replicas under batch scope: the step's rows, summed across the
     * replicas (an all-gather: each holds only its own rows) (HOST) */
    float *gather;
    size_t gather_floats;
    double gather_ms; /* the last gather's time, left out of the BWD's busy time */
    int skipped;
    int out_mb, out_n;
    uint64_t out_digest;
    float *out_mask, *out_valid;
    int out_valid_host; /* out_valid is HOST memory (else the backend's: flight.valid_dev) */
    int out_all_valid;  /* every one of them is 1: MMP_MSG_ALL_VALID on the send */
    /* per-step accounting */
    double busy_ms, data_ms;
    /* CPU time (mmp_metrics_cpu_ms) when the last StepDone left; 0 before
     * the first step: a step's cpu_ms counts from there, so what the process
     * does between steps (waiting for Start, its loader) is in it. */
    double cpu_mark;
    mmp_sim_clock sim_clock;         /* compute: simulated: the sleeps' carried lateness */
    float *fwd_ms, *bwd_ms, *wgt_ms; /* wgt_ms: zb-h1 W passes, also counted in bwd_ms */
    int inflight, max_inflight;
    size_t device_total; /* a GPU stage's device memory in all; 0 */
    mmp_loss_parts loss;
    float clip_coef;
    /* fp16 loss scaling (common/loss_scale.h), the coordinator's word: the
     * step's scale (Start), whether every stage skips its optimizer step
     * and AdamW's step index (Clip) */
    float loss_scale;
    int skip_opt, opt_step;
    mmp_trace trace;
    double last_beat;
    /* start-up (worker_startup): the phase being reported, and the test
     * hook's pause per progress report (MMP_TEST_SLOW_START_MS; 0: none) */
    char startup_phase[256];
    double test_slow_start_ms;
    mmp_ckpt_bg ckpt; /* a checkpoint written in the background (train.ckpt_async) */
    /* A step cut short (worker.c hold): the steps this process's state holds
     * (-1 before the first Start), whether the running step's optimizer
     * step ran (or was skipped: fp16), the instruction that failed, and
     * whether its Error went to the coordinator already. */
    int steps_done;
    int opt_ran;
    int fault_op;
    int error_sent;
} worker;

/* ---- worker.c (control plane, serve loop) ---- */
/* Progress for the coordinator's watchdog (rate-limited). */
void worker_heartbeat(worker *w, int step, int instr);
/* Start-up progress (before Ready) for the coordinator, which names a stage
 * silent for its start-up limit and shows long loads: phase is what the
 * stage does now ("manifest PATH"), done of total unit how far (total 0:
 * not known). A new phase is sent at once, progress within one at most once
 * a second. */
void worker_startup(worker *w, const char *phase, int64_t done, int64_t total, const char *unit);
/* A long load's progress (a manifest open, data/manifest.h; a checkpoint
 * read, common/ckpt.h) as worker_startup in the phase set before it; ctx:
 * the worker. */
void worker_load_progress(void *ctx, const char *unit, int64_t done, int64_t total);
mmp_err worker_send_env(worker *w, Mmpipe__Envelope *env);
/* Waits for a message of body want (*out: the caller frees it); Abort and
 * Shutdown end the wait with MMP_ERR_PEER (w->ended_by_coordinator set). */
mmp_err worker_wait_for(worker *w, Mmpipe__Envelope__BodyCase want, Mmpipe__Envelope **out);

/* ---- worker_build.c (set-up) ---- */
/* Everything the assignment (w->asg, checked first) asks for; on failure
 * worker_teardown undoes what was made. */
mmp_err worker_build(worker *w);
chan *worker_find_chan(worker *w, int id);
/* Backend memory of the stage (zeroed); records the first failure in *err. */
void *worker_balloc(worker *w, size_t bytes, mmp_err *err);
/* Checks and installs one step's instruction list (the Assignment's, or a
 * Program from a re-routing). */
mmp_err worker_set_program(worker *w, Mmpipe__Instr **prog, size_t n);
/* Closes the data plane (channels, reduces; after the backend's queued
 * work) and stops the loader: peers blocked on this process's channels get
 * MMP_ERR_PEER. What stays (nets, checkpoint writer) still serves. */
void worker_close_data_plane(worker *w);
/* Frees and closes all of it; NULL-safe parts, valid after a failed build. */
void worker_teardown(worker *w);
void *worker_xcalloc(size_t n, size_t size, mmp_err *err);

/* ---- worker_exec.c (one step) ---- */
chan *worker_act_in(worker *w, int want_text);
/* Hands the last uploaded batch back to the loader once its upload is done. */
void worker_release_uploaded(worker *w);
mmp_err worker_chan_recv(worker *w, chan *c, int step, int mb, int eval);
mmp_err worker_chan_release(chan *c);
mmp_err worker_do_fwd(worker *w, int step, int mb, int eval);
mmp_err worker_do_load(worker *w, int step, int mb, int eval);
mmp_err worker_do_send_act(worker *w, int step, int mb, chan *c, int eval);
const float *worker_payload_valid(const worker *w, const chan *c, size_t data_row, int text);
/* The n valid flags of c's held message into dst (HOST): 1s when the
 * sender marked them all valid (MMP_MSG_ALL_VALID: no copy, so a GPU stage
 * does not wait), else copied out of the payload (a GPU stage waits). */
void worker_valid_to_host(worker *w, float *dst, const chan *c, size_t data_row, int text);
/* Runs the step's instruction list, sends the grad norm, waits for the clip
 * coefficient, steps the optimizer and reports StepDone. */
mmp_err worker_run_step(worker *w, int step);
int worker_simulated(const worker *w);

/* ---- worker_eval.c (evaluation, checkpoints) ---- */
/* Writes this process's checkpoint file into r->dir and acknowledges. */
mmp_err worker_run_checkpoint(worker *w, const Mmpipe__CheckpointRequest *r);
/* A background checkpoint's file, once written (wait: waiting for it): its
 * acknowledgement to the coordinator. Nothing when none is in flight. */
mmp_err worker_ckpt_settle(worker *w, int wait);
int worker_ckpt_busy(const worker *w);
/* One evaluation pass over the validation pairs (fusion reports recall@1). */
mmp_err worker_run_eval(worker *w, int step);

#endif
