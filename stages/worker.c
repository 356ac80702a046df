/* Stage worker: interprets the coordinator's instruction list for one stage
 * process. Owns the stage's part of the model, its data channels and (for
 * the first sub-stage of a branch) its data set. Holds one `acts` per
 * micro-batch in flight, as many as its compiled list needs. Never touches
 * the coordinator's decisions: it only checks that what arrives is what the
 * list says should arrive. */
#include "stages/worker.h"

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
#include "common/progress.h"
#include "common/trace.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "kernels/cpu.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "stages/fuse.h"
#include "stages/pairing.h"
#include "stages/peer.h"
#include "transport/channel.h"
#include "transport/control.h"
#include "transport/reduce.h"

#define MAX_CHANNELS 256
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
    const float *payload;
} chan;

typedef struct flight {
    int mb; /* -1 when free */
    int n;
    uint64_t digest;
    void *acts;
    float *mask;  /* text: (mb_max, T) the micro-batch's mask, forwarded along */
    float *valid; /* (mb_max) 1 = good sample, 0 = skipped (data.on_bad_sample: skip) */
} flight;

typedef struct worker {
    char name[80];
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
    mmp_reduce *reduce; /* replicas > 1 */
    float *bn_rows;     /* image replicas: [microbatches][bn_row] batch-norm statistics */
    int64_t bn_row;
    mmp_plan plan;
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
    /* buffers */
    float *images, *mask, *out, *din, *dimg, *dtxt;
    int32_t *ids;
    int64_t *samples;
    mmp_loader *loader; /* training micro-batches (first sub-stage of a branch) */
    mmp_batch *batch;   /* the loaded micro-batch, until its forward */
    const float *in_images, *in_mask;
    const int32_t *in_ids;
    float *in_valid;
    uint8_t *eval_valid; /* evaluation's load: each validation sample good (1) or skipped */
    int loaded_mb, loaded_n;
    uint64_t loaded_digest;
    mmp_fuse fuse;
    int skipped;
    int out_mb, out_n;
    uint64_t out_digest;
    float *out_mask, *out_valid;
    /* per-step accounting */
    double busy_ms, data_ms;
    float *fwd_ms, *bwd_ms;
    int inflight, max_inflight;
    mmp_loss_parts loss;
    float clip_coef;
    mmp_trace trace;
    double last_beat;
} worker;

static int simulated(const worker *w);

static uint64_t flow_id(int edge, int step, int mb, int eval)
{
    return ((uint64_t)(unsigned)edge << 48) ^ ((uint64_t)(unsigned)step << 20) ^
           ((uint64_t)(unsigned)mb << 1) ^ (uint64_t)eval;
}

/* ---- control-plane helpers ---------------------------------------------------- */

static mmp_err send_env(worker *w, Mmpipe__Envelope *env)
{
    return mmp_ctl_send(w->ctl, NULL, env);
}

/* peer_lost: the error is the echo of a peer's end (a broken channel), not
 * this stage's own failure; the coordinator ranks it after a peer's exit. */
static void send_error(worker *w, const char *msg, int peer_lost)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Error e = MMPIPE__ERROR__INIT;
    char buf[2300];
    snprintf(buf, sizeof buf, "%s: %s", w->name, msg);
    e.message = buf;
    e.peer_lost = peer_lost;
    env.body_case = MMPIPE__ENVELOPE__BODY_ERROR;
    env.error = &e;
    send_env(w, &env);
}

static void heartbeat(worker *w, int step, int instr)
{
    double now = mmp_now();
    if (now - w->last_beat < 1.0) {
        return;
    }
    w->last_beat = now;
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Heartbeat hb = MMPIPE__HEARTBEAT__INIT;
    hb.step = step;
    hb.instr = instr;
    env.body_case = MMPIPE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    send_env(w, &env);
}

/* The next control message; wakes every second to check that the
 * coordinator is still there (PR_SET_PDEATHSIG covers its death too). */
static mmp_err next_message(worker *w, Mmpipe__Envelope **env)
{
    for (;;) {
        char from[MMP_CTL_ID_MAX];
        mmp_err e = mmp_ctl_recv(w->ctl, 1000, env, from, sizeof from);
        if (e != MMP_ERR_TIMEOUT) {
            return e;
        }
        if (getppid() == 1) {
            w->ended_by_coordinator = 1;
            return mmp_errorf(MMP_ERR_PEER, "the coordinator is gone");
        }
    }
}

/* Waits for a message of body `want`; Abort and Shutdown end the wait with
 * MMP_ERR_PEER (the caller exits). Other bodies are protocol errors. */
static mmp_err wait_for(worker *w, Mmpipe__Envelope__BodyCase want, Mmpipe__Envelope **out)
{
    for (;;) {
        Mmpipe__Envelope *env = NULL;
        MMP_TRY(next_message(w, &env));
        if (env->body_case == want) {
            *out = env;
            return MMP_OK;
        }
        Mmpipe__Envelope__BodyCase got = env->body_case;
        mmp_ctl_free(env);
        if (got == MMPIPE__ENVELOPE__BODY_ABORT || got == MMPIPE__ENVELOPE__BODY_SHUTDOWN) {
            w->ended_by_coordinator = 1;
            return mmp_errorf(MMP_ERR_PEER, "stopped by the coordinator");
        }
        return mmp_errorf(MMP_ERR_PROTO, "coordinator sent message %d while %d was expected",
                          (int)got, (int)want);
    }
}

/* ---- set-up ---------------------------------------------------------------------- */

static chan *find_chan(worker *w, int id)
{
    for (int i = 0; i < w->n_chans; i++) {
        if (w->chans[i].id == id) {
            return &w->chans[i];
        }
    }
    return NULL;
}

/* Payload bytes per sample of a channel, computed by each end on its own:
 * a mismatch between the two ends is caught by the transport's geometry
 * check (slots of mb_max rows), a forged row count by chan_recv. */
static size_t chan_row_bytes(const worker *w, const Mmpipe__Channel *c)
{
    int64_t per = 0;
    int from_text = w->kind == MMP_BRANCH_TEXT ||
                    (w->kind == MMP_BRANCH_FUSION && strncmp(c->peer, "text", 4) == 0);
    int64_t text_tokens = (int64_t)w->T * w->D;
    if (w->kind == MMP_BRANCH_FUSION) {
        int64_t image_tokens = (int64_t)mmp_image_net_tokens(&w->plan) * w->D;
        per = from_text ? text_tokens + (c->grad ? 0 : w->T) : image_tokens;
    } else if (from_text) {
        per = text_tokens + (c->grad ? 0 : w->T);
    } else {
        /* image: what leaves forward is this range's output; what arrives
         * forward is its input; gradients mirror them. */
        int outward = c->send != c->grad; /* act send or grad recv: our output side */
        per = outward ? w->out_floats : w->in_floats;
    }
    if (!c->grad) {
        per += 1; /* the valid flag of each sample travels with activations */
    }
    return (size_t)per * sizeof(float);
}

/* How long a channel or the replicas' reduce waits on a peer before it
 * reports the peer lost: longer than the coordinator's stall watchdog
 * (train.stall_timeout), which names the stage at fault first. */
static int peer_timeout_ms(const worker *w)
{
    int stall = w->plan.train.stall_timeout;
    return stall > 30 ? 2000 * stall : 60000;
}

static mmp_err open_channels(worker *w)
{
    const Mmpipe__Assignment *a = w->asg;
    if (a->n_channels > MAX_CHANNELS) {
        return mmp_errorf(MMP_ERR_PROTO, "%zu channels (at most %d)", a->n_channels, MAX_CHANNELS);
    }
    /* Creators (senders) first: setup never blocks, so no process waits for
     * a peer that is itself waiting. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < a->n_channels; i++) {
            const Mmpipe__Channel *c = a->channels[i];
            if ((pass == 0) != (c->creator != 0)) {
                continue;
            }
            chan *ch = &w->chans[w->n_chans++];
            memset(ch, 0, sizeof *ch);
            ch->id = c->id;
            ch->send = c->send;
            ch->grad = c->grad;
            ch->peer_text = strncmp(c->peer, "text", 4) == 0;
            size_t pl = strlen(c->peer);
            ch->peer_r0 = pl >= 2 && strcmp(c->peer + pl - 2, "/0") == 0;
            ch->row_bytes = chan_row_bytes(w, c);
            mmp_channel_cfg cfg = {.address = c->address,
                                   .slot_bytes = ch->row_bytes * (size_t)w->mb_max,
                                   .slots = c->slots,
                                   .send = c->send,
                                   .timeout_ms = peer_timeout_ms(w)};
            mmp_err e = mmp_channel_open(&ch->ch, c->transport, &cfg, c->creator);
            if (e != MMP_OK) {
                w->n_chans--;
                return mmp_error_prefix(e, "channel %d to %s", c->id, c->peer);
            }
        }
    }
    return MMP_OK;
}

static void *xcalloc(size_t n, size_t size, mmp_err *err)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p && *err == MMP_OK) {
        *err = mmp_errorf(MMP_ERR_NOMEM, "%zu x %zu bytes", n, size);
    }
    return p;
}

static int program_max_inflight(Mmpipe__Instr *const *prog, size_t n)
{
    int cur = 0, most = 1;
    for (size_t i = 0; i < n; i++) {
        if (prog[i]->op == MMPIPE__OP__FWD) {
            cur++;
        } else if (prog[i]->op == MMPIPE__OP__BWD) {
            cur--;
        }
        most = cur > most ? cur : most;
    }
    return most;
}

/* Makes prog this process's list: which micro-batches it handles (its
 * loader loads only those) and that it fits the activation slots. */
static mmp_err set_program(worker *w, Mmpipe__Instr **prog, size_t n)
{
    int m = w->asg->microbatches;
    MMP_TRY(mmp_peer_check_program(w->asg, prog, n));
    if (program_max_inflight(prog, n) > w->n_fl) {
        return mmp_errorf(MMP_ERR_PROTO, "list holds %d micro-batches, more than the %d slots",
                          program_max_inflight(prog, n), w->n_fl);
    }
    memset(w->owns, 0, (size_t)m);
    for (size_t i = 0; i < n; i++) {
        int mb = prog[i]->mb;
        if (prog[i]->op == MMPIPE__OP__FWD) {
            if (mb < 0 || mb >= m) {
                return mmp_errorf(MMP_ERR_PROTO, "instruction %zu: micro-batch %d of %d", i, mb, m);
            }
            w->owns[mb] = 1;
        }
    }
    w->prog = prog;
    w->n_prog = n;
    return MMP_OK;
}

static mmp_err build(worker *w)
{
    const Mmpipe__Assignment *a = w->asg;
    mmp_plan *p = &w->plan;
    MMP_TRY(mmp_peer_check_assignment(a));
    MMP_TRY(mmp_plan_load(p, a->plan_path, NULL, 0));
    mmp_cpu_set_threads(p->train.threads); /* train.threads holds in every process */
    if (a->microbatches != p->train.microbatches) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field microbatches = %d, but the plan has %d",
                          a->microbatches, p->train.microbatches);
    }
    int layers = a->kind == MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE  ? mmp_plan_image_layers(p)
                 : a->kind == MMPIPE__STAGE_KIND__STAGE_KIND_TEXT ? mmp_plan_text_layers(p)
                                                                  : 1;
    if (a->layer_last > layers) {
        return mmp_errorf(MMP_ERR_PROTO, "assignment: field layer_last = %d, over the %d layers",
                          a->layer_last, layers);
    }
    uint64_t seed = (uint64_t)p->job.seed;
    w->sub = a->sub;
    w->replicas = a->replicas > 0 ? a->replicas : 1;
    w->slot = a->slot;
    w->first = a->layer_first;
    w->last = a->layer_last;
    w->kind = (mmp_branch)a->kind; /* in range: checked on arrival (kind_of) */
    w->mb_max = mmp_plan_mb_size(p, 0);
    w->T = p->data.max_text_len;
    w->D = p->model.width;
    w->B = p->train.batch;
    /* Branch stages that load data open the training set; every stage opens
     * the validation set's index to know how many evaluation chunks come. */
    if (w->kind != MMP_BRANCH_FUSION && w->sub == 0) {
        MMP_TRY(mmp_dataset_open(&w->train, p->data.manifest, p->data.vocab, p));
    }
    int V;
    if (mmp_plan_evaluates(p)) { /* only then is there a validation set to read */
        MMP_TRY(mmp_dataset_open(&w->val, p->data.val_manifest, p->data.vocab, p));
        V = mmp_dataset_vocab_size(w->val);
    } else if (w->train) {
        V = mmp_dataset_vocab_size(w->train);
    } else {
        mmp_tokenizer *tok;
        MMP_TRY(mmp_tokenizer_load(&tok, p->data.vocab));
        V = mmp_tokenizer_vocab_size(tok);
        mmp_tokenizer_destroy(tok);
    }
    if (w->kind == MMP_BRANCH_IMAGE) {
        MMP_TRY(mmp_image_net_create_on(&w->img, mmp_backend_cpu(), p, w->first, w->last, seed));
        w->params = mmp_image_net_params(w->img);
        w->in_floats = mmp_image_net_in_floats(w->img);
        w->out_floats = mmp_image_net_out_floats(w->img);
    } else if (w->kind == MMP_BRANCH_TEXT) {
        MMP_TRY(mmp_text_net_create_on(&w->txt, mmp_backend_cpu(), p, V, w->first, w->last, seed));
        w->params = mmp_text_net_params(w->txt);
        w->in_floats = w->out_floats = mmp_text_net_out_floats(w->txt);
    } else {
        MMP_TRY(mmp_fusion_net_create_on(&w->fus, mmp_backend_cpu(), p, seed));
        w->params = mmp_fusion_net_params(w->fus);
    }
    if (a->resume_dir && a->resume_dir[0]) {
        /* By name from every file of the step: a re-placement may have cut
         * the branch elsewhere than the processes that wrote it. */
        mmp_ckpt c = {0};
        mmp_err e = mmp_ckpt_read_dir(&c, a->resume_dir);
        if (e == MMP_OK) {
            e = mmp_params_load(w->params, &c);
        }
        mmp_ckpt_fini(&c);
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "resume from %s", a->resume_dir);
        }
    }
    w->n_fl = program_max_inflight(a->program, a->n_program);
    if (a->inflight_bound > w->n_fl) {
        w->n_fl = a->inflight_bound; /* room for any routing the balancer sends */
    }
    if (w->n_fl > MAX_INFLIGHT) {
        return mmp_errorf(MMP_ERR_PROTO, "program holds %d micro-batches", w->n_fl);
    }
    mmp_err err = MMP_OK;
    w->fl = xcalloc((size_t)w->n_fl, sizeof *w->fl, &err);
    for (int i = 0; err == MMP_OK && i < w->n_fl; i++) {
        w->fl[i].mb = -1;
        if (w->kind == MMP_BRANCH_IMAGE) {
            err = mmp_image_acts_create((mmp_image_acts **)&w->fl[i].acts, w->img, w->mb_max);
        } else if (w->kind == MMP_BRANCH_TEXT) {
            err = mmp_text_acts_create((mmp_text_acts **)&w->fl[i].acts, w->txt, w->mb_max);
            w->fl[i].mask = xcalloc((size_t)w->mb_max * w->T, sizeof(float), &err);
        } else {
            err = mmp_fusion_acts_create((mmp_fusion_acts **)&w->fl[i].acts, w->fus, w->mb_max);
        }
        w->fl[i].valid = xcalloc((size_t)w->mb_max, sizeof(float), &err);
    }
    w->in_valid = xcalloc((size_t)w->mb_max, sizeof(float), &err);
    w->eval_valid = xcalloc((size_t)w->mb_max, 1, &err);
    size_t mbx = (size_t)w->mb_max;
    int S = p->data.image_size;
    if (w->kind == MMP_BRANCH_IMAGE && w->sub == 0) {
        w->images = xcalloc(mbx * 3 * (size_t)S * S, sizeof(float), &err);
    }
    w->ids = xcalloc(mbx * (size_t)w->T, sizeof(int32_t), &err);
    w->mask = xcalloc(mbx * (size_t)w->T, sizeof(float), &err);
    w->out = xcalloc(mbx * (size_t)(w->out_floats + w->T), sizeof(float), &err);
    w->din = xcalloc(mbx * (size_t)w->in_floats, sizeof(float), &err);
    if (w->kind == MMP_BRANCH_FUSION) {
        w->dimg = xcalloc(mbx * (size_t)mmp_image_net_tokens(p) * w->D, sizeof(float), &err);
        w->dtxt = xcalloc(mbx * (size_t)w->T * w->D, sizeof(float), &err);
    }
    w->samples = xcalloc(mbx, sizeof(int64_t), &err);
    if (w->kind == MMP_BRANCH_FUSION && err == MMP_OK) {
        err =
            mmp_fuse_init(&w->fuse, w->mb_max, (size_t)mmp_image_net_tokens(p) * w->D, w->T, w->D);
    }
    w->fwd_ms = xcalloc((size_t)a->microbatches, sizeof(float), &err);
    w->bwd_ms = xcalloc((size_t)a->microbatches, sizeof(float), &err);
    w->owns = xcalloc((size_t)a->microbatches, 1, &err);
    if (w->kind == MMP_BRANCH_IMAGE && w->replicas > 1 && !simulated(w)) {
        w->bn_row = mmp_image_net_bn_row_floats(w->img);
        w->bn_rows = xcalloc((size_t)a->microbatches * (size_t)(w->bn_row ? w->bn_row : 1),
                             sizeof(float), &err);
    }
    MMP_TRY(err);
    MMP_TRY(set_program(w, a->program, a->n_program));
    if (w->replicas > 1) {
        size_t cap = 2 * w->params->total; /* the gradients in double */
        if ((size_t)a->microbatches * (size_t)w->bn_row > cap) {
            cap = (size_t)a->microbatches * (size_t)w->bn_row;
        }
        mmp_reduce_cfg rc = {.name = a->reduce_address,
                             .replicas = w->replicas,
                             .rank = a->replica,
                             .capacity = cap,
                             .timeout_ms = peer_timeout_ms(w)};
        MMP_TRY(mmp_reduce_open(&w->reduce, &rc));
    }
    return open_channels(w);
}

static void teardown(worker *w)
{
    for (int i = 0; i < w->n_chans; i++) {
        mmp_channel_close(w->chans[i].ch);
        w->chans[i].ch = NULL;
    }
    for (int i = 0; w->fl && i < w->n_fl; i++) {
        if (w->kind == MMP_BRANCH_IMAGE) {
            mmp_image_acts_destroy(w->fl[i].acts);
        } else if (w->kind == MMP_BRANCH_TEXT) {
            mmp_text_acts_destroy(w->fl[i].acts);
        } else {
            mmp_fusion_acts_destroy(w->fl[i].acts);
        }
        free(w->fl[i].mask);
        free(w->fl[i].valid);
    }
    if (w->batch) {
        mmp_loader_release(w->loader, w->batch);
    }
    mmp_loader_destroy(w->loader);
    mmp_reduce_close(w->reduce);
    free(w->owns);
    free(w->bn_rows);
    if (w->prog_env) {
        mmp_ctl_free(w->prog_env);
    }
    mmp_fuse_fini(&w->fuse);
    free(w->in_valid);
    free(w->eval_valid);
    free(w->fl);
    mmp_image_net_destroy(w->img);
    mmp_text_net_destroy(w->txt);
    mmp_fusion_net_destroy(w->fus);
    mmp_dataset_close(w->train);
    mmp_dataset_close(w->val);
    free(w->images);
    free(w->ids);
    free(w->mask);
    free(w->out);
    free(w->din);
    free(w->dimg);
    free(w->dtxt);
    free(w->samples);
    free(w->fwd_ms);
    free(w->bwd_ms);
    mmp_trace_close(&w->trace);
    if (w->asg_env) {
        mmp_ctl_free(w->asg_env);
    }
    mmp_ctl_close(w->ctl);
}

/* ---- data plane -------------------------------------------------------------------- */

static mmp_err chan_recv(worker *w, chan *c, int step, int mb, int eval)
{
    if (!c) {
        return mmp_errorf(MMP_ERR_PROTO, "step %d micro-batch %d: no channel to receive on",
                          step + 1, mb);
    }
    if (c->held) {
        return mmp_errorf(MMP_ERR_INTERNAL, "channel %d: receive while a message is held", c->id);
    }
    const void *payload;
    MMP_TRY(mmp_channel_recv(c->ch, &c->hdr, &payload));
    double now = mmp_trace_now_us();
    c->payload = payload;
    c->held = 1;
    /* The peer's rows against our buffers (mb_max rows) and this channel's
     * row size, before anything reads the payload by hdr.n. */
    MMP_TRY(mmp_peer_check_rows(c->id, &c->hdr, w->mb_max, c->row_bytes));
    int is_eval = (c->hdr.flags & MMP_MSG_EVAL) != 0;
    if (c->hdr.step != step || c->hdr.mb != mb || is_eval != eval) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "channel %d: expected %s step %d micro-batch %d, got %s step %d "
                          "micro-batch %d",
                          c->id, eval ? "eval" : "train", step, mb, is_eval ? "eval" : "train",
                          c->hdr.step, c->hdr.mb);
    }
    mmp_trace_flow(&w->trace, 'f', flow_id(c->id, step, mb, eval), 0, now);
    if (c->grad) {
        w->in_grad = c;
    } else {
        w->in_act[w->kind == MMP_BRANCH_FUSION && c->peer_text] = c;
    }
    return MMP_OK;
}

static mmp_err chan_release(chan *c)
{
    if (!c->held) {
        return MMP_OK;
    }
    c->held = 0;
    return mmp_channel_release(c->ch);
}

/* Sends up to three consecutive segments (data, mask, valid flags) as one message. */
typedef struct seg {
    const float *p;
    size_t n;
} seg;

/* The size is checked against the slot before anything is copied
 * (mmp_channel_sendv), and the bytes go through the transport. */
static mmp_err chan_send(worker *w, chan *c, int step, int mb, int eval, int n, uint64_t digest,
                         const seg *segs, int n_segs)
{
    if (!c) {
        return mmp_errorf(MMP_ERR_PROTO, "step %d micro-batch %d: no channel to send on", step + 1,
                          mb);
    }
    mmp_channel_seg v[3];
    if (n_segs > 3) {
        return mmp_errorf(MMP_ERR_INTERNAL, "channel %d: %d segments", c->id, n_segs);
    }
    for (int i = 0; i < n_segs; i++) {
        v[i] = (mmp_channel_seg){segs[i].p, segs[i].n * sizeof(float)};
    }
    mmp_msg_header h = {
        .step = step, .mb = mb, .digest = digest, .n = n, .flags = eval ? MMP_MSG_EVAL : 0};
    char what[32];
    snprintf(what, sizeof what, "%d", c->id);
    mmp_trace_flow(&w->trace, 's', flow_id(c->id, step, mb, eval), 0, mmp_trace_now_us());
    return mmp_channel_sendv(c->ch, what, h, v, n_segs);
}

static flight *flight_take(worker *w, int mb)
{
    for (int i = 0; i < w->n_fl; i++) {
        if (w->fl[i].mb < 0) {
            w->fl[i].mb = mb;
            if (++w->inflight > w->max_inflight) {
                w->max_inflight = w->inflight;
            }
            return &w->fl[i];
        }
    }
    return NULL;
}

static flight *flight_find(worker *w, int mb)
{
    for (int i = 0; i < w->n_fl; i++) {
        if (w->fl[i].mb == mb) {
            return &w->fl[i];
        }
    }
    return NULL;
}

/* The channel of this stage with the given direction (and, for fusion, branch). */
static chan *chan_of(worker *w, int id)
{
    chan *c = find_chan(w, id);
    return c;
}

/* ---- one instruction ------------------------------------------------------------------ */

static int simulated(const worker *w)
{
    return w->plan.compute == MMP_COMPUTE_SIMULATED;
}

/* This stage's simulated forward (or backward) of n samples at step. */
static void sim_compute(const worker *w, int step, int n, int backward)
{
    mmp_sleep_ms(mmp_plan_sim_ms(&w->plan, (mmp_branch)w->kind, w->first, w->last, n, step,
                                 backward, w->slot));
}

/* Training: the next micro-batch from the prefetching loader (the wait is
 * the stage's data wait). Evaluation: the validation chunk, loaded here. */
static mmp_err do_load(worker *w, int step, int mb, int eval)
{
    const mmp_plan *p = &w->plan;
    double t0 = mmp_now();
    if (!eval) {
        if (w->batch) {
            return mmp_errorf(MMP_ERR_INTERNAL, "load of %d before the last one's forward", mb);
        }
        MMP_TRY(mmp_loader_get(w->loader, step, mb, &w->batch));
        w->data_ms += (mmp_now() - t0) * 1e3;
        mmp_batch *b = w->batch;
        w->in_images = b->images;
        w->in_ids = b->ids;
        w->in_mask = b->mask;
        for (int i = 0; i < b->n; i++) {
            w->in_valid[i] = b->valid[i] ? 1.0f : 0.0f;
        }
        w->loaded_mb = mb;
        w->loaded_n = b->n;
        w->loaded_digest = mmp_sample_digest(b->samples, b->n);
        return MMP_OK;
    }
    int64_t nv = mmp_dataset_size(w->val);
    nv = nv < p->data.val_samples ? nv : p->data.val_samples;
    int64_t base = (int64_t)mb * w->mb_max;
    int n = (int)(nv - base < w->mb_max ? nv - base : w->mb_max);
    for (int i = 0; i < n; i++) {
        w->samples[i] = base + i;
    }
    /* Under data.on_bad_sample: skip a bad pair travels flagged, and fusion
     * leaves it out of the retrieval (run_eval). */
    MMP_TRY(mmp_dataset_load_valid(
        w->val, w->samples, n, w->kind == MMP_BRANCH_IMAGE ? w->images : NULL,
        w->kind == MMP_BRANCH_TEXT ? w->ids : NULL, w->kind == MMP_BRANCH_TEXT ? w->mask : NULL,
        w->eval_valid, NULL));
    for (int i = 0; i < n; i++) {
        w->in_valid[i] = w->eval_valid[i] ? 1.0f : 0.0f;
    }
    w->in_images = w->images;
    w->in_ids = w->ids;
    w->in_mask = w->mask;
    w->loaded_mb = mb;
    w->loaded_n = n;
    w->loaded_digest = mmp_sample_digest(w->samples, n);
    return MMP_OK;
}

/* Evaluation's input channel: activations from replica 0 of the stage
 * before (fusion: of the image or the text branch). Evaluation runs on the
 * replicas 0 only. */
static chan *act_in(worker *w, int want_text)
{
    for (int i = 0; i < w->n_chans; i++) {
        chan *c = &w->chans[i];
        if (!c->send && !c->grad && c->peer_r0 &&
            (w->kind != MMP_BRANCH_FUSION || c->peer_text == want_text)) {
            return c;
        }
    }
    return NULL;
}

/* Where a received activation's parts lie: data (n rows), then for text the
 * mask (n, T), then the n valid flags. */
static const float *payload_mask(const chan *c, size_t data_row)
{
    return c->payload + (size_t)c->hdr.n * data_row;
}

static const float *payload_valid(const worker *w, const chan *c, size_t data_row, int text)
{
    return c->payload + (size_t)c->hdr.n * (data_row + (text ? (size_t)w->T : 0));
}

static mmp_err do_fwd(worker *w, int step, int mb, int eval)
{
    flight *f = eval ? &w->fl[0] : flight_take(w, mb);
    if (!f) {
        return mmp_errorf(MMP_ERR_INTERNAL, "no free activation slot for micro-batch %d", mb);
    }
    double t0 = mmp_now();
    int train = !eval;
    if (w->kind == MMP_BRANCH_FUSION) {
        chan *ci = w->in_act[0], *ct = w->in_act[1];
        if (!ci || !ct || !ci->held || !ct->held) {
            return mmp_errorf(MMP_ERR_INTERNAL, "fusion forward %d without both inputs", mb);
        }
        MMP_TRY(mmp_pair_check(&ci->hdr, &ct->hdr, step, mb));
        int n = ci->hdr.n;
        f->n = n;
        if (eval) {
            /* The embeddings go to the caller's arrays: see run_eval. */
            return MMP_OK;
        }
        size_t img_row = w->fuse.img_row, txt_row = w->fuse.txt_row;
        int skipped = 0;
        if (simulated(w)) {
            sim_compute(w, step, n, 0); /* the loss stays 0 */
        } else {
            mmp_params_mb_begin(w->params); /* its backward follows at once */
            mmp_fuse_forward(&w->fuse, w->fus, f->acts, ci->payload, ct->payload,
                             payload_mask(ct, txt_row), payload_valid(w, ci, img_row, 0),
                             payload_valid(w, ct, txt_row, 1), n, w->B, &w->loss, &skipped);
        }
        w->skipped += skipped;
        MMP_TRY(chan_release(ci));
        MMP_TRY(chan_release(ct));
    } else {
        const float *in = NULL, *mask = NULL, *valid = NULL;
        const int32_t *ids = NULL;
        int n;
        uint64_t digest;
        chan *ci = NULL;
        if (w->sub == 0) {
            if (w->loaded_mb != mb) {
                return mmp_errorf(MMP_ERR_INTERNAL, "forward %d before its load", mb);
            }
            n = w->loaded_n;
            digest = w->loaded_digest;
            in = w->in_images;
            ids = w->in_ids;
            mask = w->in_mask;
            valid = w->in_valid;
        } else {
            ci = w->in_act[0];
            if (!ci || !ci->held) {
                return mmp_errorf(MMP_ERR_INTERNAL, "forward %d without its input", mb);
            }
            n = ci->hdr.n;
            digest = ci->hdr.digest;
            in = ci->payload;
            mask = payload_mask(ci, (size_t)w->in_floats);
            valid = payload_valid(w, ci, (size_t)w->in_floats, w->kind == MMP_BRANCH_TEXT);
        }
        f->n = n;
        f->digest = digest;
        /* From a received slot the bytes come through its transport. */
        if (ci) {
            MMP_TRY(mmp_channel_read(ci->ch, f->valid, valid, (size_t)n * sizeof(float)));
        } else {
            memcpy(f->valid, valid, (size_t)n * sizeof(float));
        }
        if (w->kind == MMP_BRANCH_TEXT) {
            size_t mb_bytes = (size_t)n * w->T * sizeof(float);
            if (ci) {
                MMP_TRY(mmp_channel_read(ci->ch, f->mask, mask, mb_bytes));
            } else {
                memcpy(f->mask, mask, mb_bytes);
            }
        }
        if (simulated(w)) {
            /* w->out keeps its zeros; evaluation is not timed, so it does not wait */
            if (train) {
                sim_compute(w, step, n, 0);
            }
        } else if (w->kind == MMP_BRANCH_IMAGE) {
            if (train && w->bn_rows) {
                /* Replicas: this micro-batch's batch-norm statistics go to
                 * its row, replayed in order after the reduce (do_grad_norm). */
                mmp_image_net_bn_log(w->img, w->bn_rows + (size_t)mb * (size_t)w->bn_row);
            }
            mmp_image_net_forward(w->img, f->acts, in, n, train, w->out);
            mmp_image_net_bn_log(w->img, NULL);
        } else {
            mmp_text_net_forward(w->txt, f->acts, w->sub == 0 ? ids : NULL, w->sub == 0 ? NULL : in,
                                 f->mask, n, w->out);
        }
        if (ci) {
            MMP_TRY(chan_release(ci));
        }
        if (w->batch) {
            mmp_loader_release(w->loader, w->batch);
            w->batch = NULL;
        }
        w->out_mb = mb;
        w->out_n = n;
        w->out_digest = digest;
        w->out_mask = f->mask;
        w->out_valid = f->valid;
    }
    double ms = (mmp_now() - t0) * 1e3;
    if (!eval) {
        w->busy_ms += ms;
        w->fwd_ms[mb] += (float)ms;
        mmp_trace_span(&w->trace, "F", "compute", 0, t0 * 1e6, ms * 1e3, step + 1, mb);
    }
    return MMP_OK;
}

static mmp_err do_send_act(worker *w, int step, int mb, chan *c, int eval)
{
    if (w->out_mb != mb) {
        return mmp_errorf(MMP_ERR_INTERNAL, "send of micro-batch %d before its forward", mb);
    }
    size_t n = (size_t)w->out_n;
    seg segs[3] = {{w->out, n * (size_t)w->out_floats},
                   {w->out_mask, w->kind == MMP_BRANCH_TEXT ? n * (size_t)w->T : 0},
                   {w->out_valid, n}};
    return chan_send(w, c, step, mb, eval, w->out_n, w->out_digest, segs, 3);
}

static mmp_err do_bwd(worker *w, int step, int mb)
{
    flight *f = flight_find(w, mb);
    if (!f) {
        return mmp_errorf(MMP_ERR_INTERNAL, "backward %d without its forward", mb);
    }
    double t0 = mmp_now();
    int n = f->n;
    if (w->kind == MMP_BRANCH_FUSION) {
        if (simulated(w)) {
            sim_compute(w, step, n, 1); /* dimg and dtxt keep their zeros */
        } else {
            mmp_fuse_backward(&w->fuse, w->fus, f->acts, w->B, w->dimg, w->dtxt);
            mmp_params_mb_end(w->params);
        }
    } else {
        chan *cg = w->in_grad;
        if (!cg || !cg->held) {
            return mmp_errorf(MMP_ERR_INTERNAL, "backward %d without its gradient", mb);
        }
        if (cg->hdr.n != n) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "channel %d: step %d micro-batch %d: header field n = %d, but the "
                              "forward had %d samples",
                              cg->id, step + 1, mb, cg->hdr.n, n);
        }
        float *din = NULL;
        if (w->sub > 0) {
            din = w->din;
            memset(din, 0, (size_t)n * w->in_floats * sizeof(float));
        }
        if (simulated(w)) {
            sim_compute(w, step, n, 1); /* din keeps its zeros */
        } else {
            /* each micro-batch's gradients apart, summed in double: nn/params.h */
            mmp_params_mb_begin(w->params);
            if (w->kind == MMP_BRANCH_IMAGE) {
                mmp_image_net_backward(w->img, f->acts, cg->payload, n, din);
            } else {
                mmp_text_net_backward(w->txt, f->acts, cg->payload, n, din);
            }
            mmp_params_mb_end(w->params);
        }
        MMP_TRY(chan_release(cg));
    }
    w->out_n = n;
    w->out_digest = f->digest;
    f->mb = -1;
    w->inflight--;
    double ms = (mmp_now() - t0) * 1e3;
    w->busy_ms += ms;
    w->bwd_ms[mb] += (float)ms;
    mmp_trace_span(&w->trace, "B", "compute", 0, t0 * 1e6, ms * 1e3, step + 1, mb);
    return MMP_OK;
}

static mmp_err do_send_grad(worker *w, int step, int mb, chan *c)
{
    int n = w->out_n;
    if (w->kind == MMP_BRANCH_FUSION) {
        size_t row = c->peer_text ? w->fuse.txt_row : w->fuse.img_row;
        seg g = {c->peer_text ? w->dtxt : w->dimg, (size_t)n * row};
        return chan_send(w, c, step, mb, 0, n, 0, &g, 1);
    }
    seg g = {w->din, (size_t)n * (size_t)w->in_floats};
    return chan_send(w, c, step, mb, 0, n, w->out_digest, &g, 1);
}

/* Replicas: every replica ends with the sum of all replicas' gradients
 * (transport/reduce.h: the plain sum is the sample-weighted one, since each
 * micro-batch's loss is already divided by the global batch) and with every
 * micro-batch's batch-norm statistics, replayed in micro-batch order. */
static mmp_err reduce_replicas(worker *w, int step)
{
    double t0 = mmp_now();
    MMP_TRY(mmp_reduce_sum_f64(w->reduce, w->params->grad_acc, w->params->total));
    if (w->bn_rows && w->bn_row > 0) {
        int m = w->asg->microbatches;
        MMP_TRY(mmp_reduce_sum(w->reduce, w->bn_rows, (size_t)m * (size_t)w->bn_row));
        mmp_image_net_bn_replay(w->img, w->bn_rows, m);
    }
    /* Communication, like a channel's wait: traced, not counted as busy
     * (most of it is waiting at the barrier for the slowest replica). */
    double ms = (mmp_now() - t0) * 1e3;
    mmp_trace_span(&w->trace, "REDUCE", "comm", 0, t0 * 1e6, ms * 1e3, step + 1, -1);
    return MMP_OK;
}

static mmp_err do_grad_norm(worker *w, int step)
{
    if (w->reduce) {
        MMP_TRY(reduce_replicas(w, step));
    }
    mmp_params_grad_finish(w->params);
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__GradNorm g = MMPIPE__GRAD_NORM__INIT;
    g.step = step;
    g.sumsq = mmp_params_grad_sumsq(w->params);
    env.body_case = MMPIPE__ENVELOPE__BODY_GRAD_NORM;
    env.grad_norm = &g;
    MMP_TRY(send_env(w, &env));
    Mmpipe__Envelope *reply;
    MMP_TRY(wait_for(w, MMPIPE__ENVELOPE__BODY_CLIP, &reply));
    int ok = reply->clip->step == step;
    w->clip_coef = reply->clip->coef;
    mmp_ctl_free(reply);
    if (!ok) {
        return mmp_errorf(MMP_ERR_PROTO, "clip coefficient for another step");
    }
    return MMP_OK;
}

static long peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

static mmp_err run_step(worker *w, int step)
{
    const Mmpipe__Assignment *a = w->asg;
    double t0 = mmp_now();
    mmp_params_zero_grad(w->params);
    if (w->bn_rows) {
        memset(w->bn_rows, 0, (size_t)a->microbatches * (size_t)w->bn_row * sizeof(float));
    }
    w->busy_ms = w->data_ms = 0;
    w->skipped = 0;
    w->max_inflight = 0;
    memset(&w->loss, 0, sizeof w->loss);
    memset(w->fwd_ms, 0, (size_t)a->microbatches * sizeof(float));
    memset(w->bwd_ms, 0, (size_t)a->microbatches * sizeof(float));
    for (size_t i = 0; i < w->n_prog; i++) {
        const Mmpipe__Instr *in = w->prog[i];
        chan *c = in->edge >= 0 ? chan_of(w, in->edge) : NULL;
        int mb = in->mb;
        if (in->edge >= 0 && !c) {
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu names unknown channel %d", i,
                              in->edge);
        }
        mmp_err e = MMP_OK;
        switch (in->op) {
        case MMPIPE__OP__LOAD: {
            double l0 = mmp_now();
            e = do_load(w, step, mb, 0);
            double ms = (mmp_now() - l0) * 1e3;
            w->busy_ms += ms;
            mmp_trace_span(&w->trace, "L", "data", 0, l0 * 1e6, ms * 1e3, step + 1, mb);
            break;
        }
        case MMPIPE__OP__RECV_ACT:
        case MMPIPE__OP__RECV_GRAD:
            e = chan_recv(w, c, step, mb, 0);
            break;
        case MMPIPE__OP__FWD:
            e = do_fwd(w, step, mb, 0);
            break;
        case MMPIPE__OP__SEND_ACT:
            e = do_send_act(w, step, mb, c, 0);
            break;
        case MMPIPE__OP__BWD:
            e = do_bwd(w, step, mb);
            break;
        case MMPIPE__OP__SEND_GRAD:
            e = do_send_grad(w, step, mb, c);
            break;
        case MMPIPE__OP__GRAD_NORM:
            e = do_grad_norm(w, step);
            break;
        case MMPIPE__OP__OPT_STEP: {
            double o0 = mmp_now();
            mmp_optim_step(w->params, &w->plan, step, mmp_lr_at(&w->plan, step), w->clip_coef);
            double ms = (mmp_now() - o0) * 1e3;
            w->busy_ms += ms;
            mmp_trace_span(&w->trace, "OPT", "compute", 0, o0 * 1e6, ms * 1e3, step + 1, -1);
            break;
        }
        default:
            e = mmp_errorf(MMP_ERR_PROTO, "unknown instruction %d", (int)in->op);
        }
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "step %d instruction %zu", step + 1, i);
        }
        heartbeat(w, step, (int)i);
    }
    double wall = (mmp_now() - t0) * 1e3;
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__StepDone d = MMPIPE__STEP_DONE__INIT;
    Mmpipe__MbTiming *tp[MAX_INFLIGHT], tm[MAX_INFLIGHT];
    /* The micro-batches this process handled (its routing). */
    int m = 0;
    for (int i = 0; i < a->microbatches && m < MAX_INFLIGHT; i++) {
        if (!w->owns[i]) {
            continue;
        }
        mmpipe__mb_timing__init(&tm[m]);
        tm[m].mb = i;
        tm[m].fwd_ms = w->fwd_ms[i];
        tm[m].bwd_ms = w->bwd_ms[i];
        tp[m] = &tm[m];
        m++;
    }
    d.step = step;
    d.busy_ms = (float)w->busy_ms;
    d.wall_ms = (float)wall;
    d.idle_ms = (float)(wall - w->busy_ms);
    d.data_ms = (float)w->data_ms;
    d.peak_mem_bytes = (uint64_t)peak_rss();
    d.n_mbs = (size_t)m;
    d.mbs = tp;
    d.loss = w->loss.loss;
    d.itc = w->loss.itc;
    d.itm = w->loss.itm;
    d.max_inflight = w->max_inflight;
    d.skipped = w->skipped;
    env.body_case = MMPIPE__ENVELOPE__BODY_STEP_DONE;
    env.step_done = &d;
    return send_env(w, &env);
}

/* ---- evaluation and checkpoints --------------------------------------------------------- */

static mmp_err run_eval(worker *w, int step)
{
    if (w->asg->replica > 0) {
        return MMP_OK; /* evaluation runs on the replicas 0 */
    }
    if (!w->val) {
        return mmp_errorf(MMP_ERR_PROTO, "evaluation requested, but the plan turns it off");
    }
    int64_t nv = mmp_dataset_size(w->val);
    nv = nv < w->plan.data.val_samples ? nv : w->plan.data.val_samples;
    int64_t kept = 0; /* fusion: pairs good in both branches, compacted to the front */
    int chunks = (int)((nv + w->mb_max - 1) / w->mb_max);
    float *ie = NULL, *te = NULL;
    int E = 0;
    mmp_err err = MMP_OK;
    if (w->kind == MMP_BRANCH_FUSION) {
        E = mmp_fusion_embed_dim(w->fus);
        ie = xcalloc((size_t)nv * E, sizeof(float), &err);
        te = xcalloc((size_t)nv * E, sizeof(float), &err);
        if (err != MMP_OK) {
            goto exit;
        }
    }
    for (int c = 0; c < chunks; c++) {
        if (w->kind == MMP_BRANCH_FUSION) {
            chan *ci = act_in(w, 0), *ct = act_in(w, 1);
            if ((err = chan_recv(w, ci, step, c, 1)) != MMP_OK ||
                (err = chan_recv(w, ct, step, c, 1)) != MMP_OK ||
                (err = do_fwd(w, step, c, 1)) != MMP_OK) {
                goto exit;
            }
            int n = ci->hdr.n;
            const float *txt = ct->payload, *mask = ct->payload + (size_t)n * w->T * w->D;
            if (!simulated(w)) {
                mmp_fusion_net_embed(w->fus, w->fl[0].acts, ci->payload, txt, mask, n,
                                     ie + (size_t)kept * E, te + (size_t)kept * E);
                const float *iv = payload_valid(w, ci, w->fuse.img_row, 0);
                const float *tv = payload_valid(w, ct, w->fuse.txt_row, 1);
                int64_t base = kept;
                for (int i = 0; i < n; i++) { /* keep the good pairs, in order */
                    if (iv[i] != 0 && tv[i] != 0) {
                        memmove(ie + kept * E, ie + (base + i) * E, (size_t)E * sizeof(float));
                        memmove(te + kept * E, te + (base + i) * E, (size_t)E * sizeof(float));
                        kept++;
                    }
                }
            }
            if ((err = chan_release(ci)) != MMP_OK || (err = chan_release(ct)) != MMP_OK) {
                goto exit;
            }
            continue;
        }
        if (w->sub == 0) {
            err = do_load(w, step, c, 1);
        } else {
            err = chan_recv(w, act_in(w, w->kind == MMP_BRANCH_TEXT), step, c, 1);
        }
        if (err == MMP_OK) {
            err = do_fwd(w, step, c, 1);
        }
        chan *out = NULL;
        for (int i = 0; i < w->n_chans; i++) {
            if (w->chans[i].send && !w->chans[i].grad && w->chans[i].peer_r0) {
                out = &w->chans[i];
            }
        }
        if (err == MMP_OK) {
            err = do_send_act(w, step, c, out, 1);
        }
        if (err != MMP_OK) {
            goto exit;
        }
    }
    if (w->kind == MMP_BRANCH_FUSION) {
        double i2t = 0, t2i = 0; /* simulated: no embeddings, recall 0 */
        if (!simulated(w) && kept < nv) {
            MMP_WARN("evaluation: %lld of %lld validation pairs skipped (bad data, "
                     "data.on_bad_sample: skip)",
                     (long long)(nv - kept), (long long)nv);
        }
        if (!simulated(w) && kept > 0 &&
            (err = mmp_retrieval_r1(ie, te, (int)kept, E, &i2t, &t2i)) != MMP_OK) {
            goto exit;
        }
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__EvalDone d = MMPIPE__EVAL_DONE__INIT;
        d.step = step;
        d.i2t_r1 = (float)i2t;
        d.t2i_r1 = (float)t2i;
        env.body_case = MMPIPE__ENVELOPE__BODY_EVAL_DONE;
        env.eval_done = &d;
        err = send_env(w, &env);
    }
exit:
    free(ie);
    free(te);
    return err;
}

static mmp_err run_checkpoint(worker *w, const Mmpipe__CheckpointRequest *r)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", r->dir, w->asg->ckpt_file);
    mmp_err e = MMP_OK;
    if (w->asg->replica == 0) { /* replicas hold identical state: one file */
        e = mmp_mkdirs(r->dir);
        if (e == MMP_OK) {
            e = mmp_params_save(w->params, path);
        }
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__CheckpointAck ack = MMPIPE__CHECKPOINT_ACK__INIT;
    ack.step = r->step;
    ack.ok = e == MMP_OK;
    ack.error = e == MMP_OK ? "" : (char *)mmp_last_error();
    env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK;
    env.checkpoint_ack = &ack;
    return send_env(w, &env);
}

/* ---- main loop ------------------------------------------------------------------------------ */

static mmp_err serve(worker *w)
{
    for (;;) {
        Mmpipe__Envelope *env = NULL;
        MMP_TRY(next_message(w, &env));
        mmp_err e = MMP_OK;
        switch (env->body_case) {
        case MMPIPE__ENVELOPE__BODY_START:
            if (env->start->first_step < 0 || env->start->steps < 0 ||
                env->start->first_step > w->plan.job.steps - env->start->steps) {
                e = mmp_errorf(MMP_ERR_PROTO,
                               "start: fields first_step = %d, steps = %d, outside the plan's %d "
                               "steps",
                               env->start->first_step, env->start->steps, w->plan.job.steps);
                break;
            }
            if (w->train && !w->loader) {
                /* Prefetching starts with the first step this process runs. */
                mmp_loader_cfg lc = {.ds = w->train,
                                     .plan = &w->plan,
                                     .images = w->kind == MMP_BRANCH_IMAGE,
                                     .text = w->kind == MMP_BRANCH_TEXT,
                                     .first_step = env->start->first_step,
                                     .last_step = w->plan.job.steps,
                                     .owns = w->owns,
                                     .depth = w->plan.train.microbatches + 1};
                e = mmp_loader_create(&w->loader, &lc);
            }
            for (int s = env->start->first_step;
                 e == MMP_OK && s < env->start->first_step + env->start->steps; s++) {
                e = run_step(w, s);
            }
            break;
        case MMPIPE__ENVELOPE__BODY_PROGRAM:
            /* A new routing: a new list, and a loader for its micro-batches
             * (made again at the next Start). */
            e = set_program(w, env->program->program, env->program->n_program);
            if (e == MMP_OK) {
                mmp_ctl_free(w->prog_env);
                w->prog_env = env;
                env = NULL;
                mmp_loader_destroy(w->loader);
                w->loader = NULL;
            }
            break;
        case MMPIPE__ENVELOPE__BODY_EVAL_REQUEST:
            e = run_eval(w, env->eval_request->step);
            break;
        case MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST:
            e = run_checkpoint(w, env->checkpoint_request);
            break;
        case MMPIPE__ENVELOPE__BODY_SHUTDOWN:
            mmp_ctl_free(env);
            return MMP_OK;
        case MMPIPE__ENVELOPE__BODY_ABORT:
            w->ended_by_coordinator = 1;
            e = mmp_errorf(MMP_ERR_PEER, "aborted by the coordinator: %s", env->abort->reason);
            mmp_ctl_free(env);
            return e;
        default:
            MMP_WARN("ignoring control message %d between steps", (int)env->body_case);
        }
        mmp_ctl_free(env);
        MMP_TRY(e);
    }
}

int mmp_worker_main(const mmp_worker_args *args)
{
    /* Die with the coordinator: a SIGKILLed coordinator must not leave us. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) {
        return 1;
    }
    static worker w;
    memset(&w, 0, sizeof w);
    w.loaded_mb = w.out_mb = -1;
    snprintf(w.name, sizeof w.name, "%s/%d", args->stage, args->replica);
    mmp_log_set_name(w.name);
    mmp_err e = mmp_ctl_connect(&w.ctl, args->endpoint, w.name, args->token);
    if (e != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        return 1;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    hello.name = w.name;
    hello.pid = getpid();
    env.body_case = MMPIPE__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    e = send_env(&w, &env);
    if (e == MMP_OK) {
        e = wait_for(&w, MMPIPE__ENVELOPE__BODY_ASSIGNMENT, &w.asg_env);
    }
    if (e == MMP_OK) {
        w.asg = w.asg_env->assignment;
        e = mmp_peer_check_assignment(w.asg); /* before its fields name anything */
    }
    if (e == MMP_OK) {
        /* One part file per process (a re-placement starts new ones); one
         * trace row per stage replica. */
        char tag[96];
        snprintf(tag, sizeof tag, "%s.%d.p%d", args->stage, args->replica, (int)getpid());
        int row = 1 + 1000 * (int)w.asg->kind + 100 * w.asg->sub + args->replica;
        e = mmp_trace_open(&w.trace, w.asg->run_dir, tag, row, w.name);
    }
    if (e == MMP_OK) {
        e = build(&w);
    }
    if (e == MMP_OK) {
        Mmpipe__Envelope r = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Ready ready = MMPIPE__READY__INIT;
        r.body_case = MMPIPE__ENVELOPE__BODY_READY;
        r.ready = &ready;
        e = send_env(&w, &r);
    }
    if (e == MMP_OK) {
        e = serve(&w);
    }
    int rc = 0;
    if (e != MMP_OK) {
        rc = 1;
        if (!w.ended_by_coordinator) {
            MMP_ERROR("%s", mmp_last_error());
            send_error(&w, mmp_last_error(), e == MMP_ERR_PEER);
        }
    }
    teardown(&w);
    return rc;
}
