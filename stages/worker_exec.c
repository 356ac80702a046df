/* One training step of a stage: the instruction interpreter (LOAD,
 * RECV_ACT, FWD, SEND_ACT, RECV_GRAD, BWD, SEND_GRAD, REDUCE, NORM, OPT) and
 * the data plane under it. Every byte a peer sends is checked against this
 * stage's geometry before use (stages/peer.h). */
#include "stages/worker_internal.h"

static uint64_t flow_id(int edge, int step, int mb, int eval)
{
    return ((uint64_t)(unsigned)edge << 48) ^ ((uint64_t)(unsigned)step << 20) ^
           ((uint64_t)(unsigned)mb << 1) ^ (uint64_t)eval;
}

/* ---- data plane -------------------------------------------------------------------- */

void worker_release_uploaded(worker *w)
{
    if (w->uploaded) {
        mmp_backend_upload_wait(w->be);
        mmp_loader_release(w->loader, w->uploaded);
        w->uploaded = NULL;
    }
}

mmp_err worker_chan_recv(worker *w, chan *c, int step, int mb, int eval)
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
    if (c->stage_dev) {
        /* a GPU stage's host channel: the payload goes up once, here */
        w->be->ops->to_device(w->be, c->stage_dev, payload, c->hdr.bytes);
        c->payload = c->stage_dev;
    }
    if (c->prec != MMP_PREC_FP32) {
        /* fp32 parts first, the packed data last: widened into the fp32
         * layout (data, mask, valid) that everything after reads */
        size_t nd = (size_t)c->hdr.n * c->data_row;
        size_t extra = c->hdr.bytes - nd * mmp_backend_lp_bytes(c->prec);
        const char *src = (const char *)c->payload;
        w->be->ops->unpack_lp(w->be, c->wide, src + extra, nd, c->prec);
        w->be->ops->copy(w->be, c->wide + nd, src, extra);
        c->payload = c->wide;
    }
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

mmp_err worker_chan_release(chan *c)
{
    if (!c->held) {
        return MMP_OK;
    }
    c->held = 0;
    return mmp_channel_release(c->ch);
}

/* Sends up to three consecutive segments (data, mask, valid flags) as one
 * message; host: the segment is HOST memory (else the stage backend's). */
typedef struct seg {
    const void *p;
    size_t n; /* elements: fp32, or the channel's precision when lp */
    int host;
    int lp;
} seg;

/* Bytes of a received payload (backend memory) out to the host. */
static void payload_to_host(worker *w, void *dst, const void *src, size_t bytes)
{
    w->be->ops->to_host(w->be, dst, src, bytes);
}

/* ---- zero-copy posting -------------------------------------------------------------
 * When the instruction right after a FWD (BWD) is the SEND_ACT (SEND_GRAD)
 * of the same micro-batch, on a channel whose slots are host memory that can
 * take the output as it is (a CPU stage, fp32 data: shm and tcp slots, never
 * cuda_ipc's device slots nor a GPU stage's staging), the computation writes
 * its output straight into a slot acquired before it, and the send appends
 * the mask and valid flags and posts: one copy of the output less. Only when
 * a credit is free at once (mmp_channel_try_acquire): a full ring never
 * holds up the computation, which then writes the stage's own buffer and
 * the send copies it, as always. Nothing the backward needs lives in the
 * slot: it holds the output alone (the backward keeps its activations).
 * Low-precision data (bf16/fp16 edges) is packed straight into the slot
 * instead (send_packed_in_place). MMP_ZERO_COPY=0 in the environment turns
 * both off (for comparisons). */
static int zero_copy_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("MMP_ZERO_COPY");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

/* Acquires a slot of c for the computation's output when c can take it. */
static void zc_take(worker *w, chan *c)
{
    if (!c || !c->send || c->zc || c->prec != MMP_PREC_FP32 || c->stage_host || w->gpu >= 0 ||
        worker_simulated(w) || !mmp_channel_host_slots(c->ch) ||
        (size_t)w->mb_max * c->row_bytes > mmp_channel_slot_bytes(c->ch)) {
        return;
    }
    void *slot = NULL;
    if (mmp_channel_try_acquire(c->ch, &slot) == MMP_OK) {
        c->zc = slot;
    }
}

/* Before the computation of instruction i (FWD or BWD of mb): the slot of
 * each send (op) of mb that follows it at once, when every one of them is
 * told apart by zc_chan: one SEND_ACT; one SEND_GRAD, or a fusion's two (to
 * the image and the text branch). An output sent twice is sent by copies. */
static void zc_prepare(worker *w, size_t i, int op, int mb)
{
    if (!zero_copy_on()) {
        return;
    }
    chan *next[3];
    int k = 0;
    for (size_t j = i + 1; j < w->n_prog && k < 3; j++) {
        const Mmpipe__Instr *in = w->prog[j];
        if ((int)in->op != op || in->mb != mb || in->edge < 0) {
            break;
        }
        next[k++] = worker_find_chan(w, in->edge);
    }
    int fusion_pair = k == 2 && op == MMPIPE__OP__SEND_GRAD && w->kind == MMP_BRANCH_FUSION &&
                      next[0] && next[1] && next[0]->peer_text != next[1]->peer_text;
    if (k == 1 || fusion_pair) {
        for (int j = 0; j < k; j++) {
            zc_take(w, next[j]);
        }
    }
}

/* The sending channel (grad: of gradients; text: to the text branch, -1:
 * either) whose slot awaits the output, or NULL. */
static chan *zc_chan(worker *w, int grad, int text)
{
    for (int k = 0; k < w->n_chans; k++) {
        chan *c = &w->chans[k];
        if (c->zc && c->grad == grad && (text < 0 || c->peer_text == text)) {
            return c;
        }
    }
    return NULL;
}

/* Copies the fp32 segs into slot from *at on, each checked against the
 * slot's size first: host memory through the transport (mmp_channel_fill),
 * backend memory by to_host. *at ends past them. */
static mmp_err fill_slot(worker *w, chan *c, void *slot, size_t *at, const seg *segs, int n_segs)
{
    size_t cap = mmp_channel_slot_bytes(c->ch);
    for (int i = 0; i < n_segs; i++) {
        size_t bytes = segs[i].n * sizeof(float);
        if (bytes > cap - *at) {
            return mmp_errorf(MMP_ERR_INVALID, "channel %d: %zu payload bytes, slot holds %zu",
                              c->id, *at + bytes, cap);
        }
        if (bytes && segs[i].host) {
            MMP_TRY(mmp_channel_fill(c->ch, (char *)slot + *at, segs[i].p, bytes));
        } else if (bytes) {
            w->be->ops->to_host(w->be, (char *)slot + *at, segs[i].p, bytes);
        }
        *at += bytes;
    }
    return MMP_OK;
}

/* Posts c's acquired slot, bytes of payload in it. */
static mmp_err post_slot(worker *w, chan *c, int step, int mb, int32_t flags, int n,
                         uint64_t digest, size_t bytes)
{
    mmp_msg_header h = {
        .step = step, .mb = mb, .digest = digest, .bytes = bytes, .n = n, .flags = flags};
    mmp_trace_flow(&w->trace, 's', flow_id(c->id, step, mb, (flags & MMP_MSG_EVAL) != 0), 0,
                   mmp_trace_now_us());
    return mmp_channel_post(c->ch, &h);
}

/* Posts c's zero-copy slot: data_bytes of output already in it, then segs
 * (mask, valid flags) appended through the transport. */
static mmp_err zc_post(worker *w, chan *c, int step, int mb, int32_t flags, int n, uint64_t digest,
                       size_t data_bytes, const seg *segs, int n_segs)
{
    float *slot = c->zc;
    c->zc = NULL;
    size_t at = data_bytes;
    MMP_TRY(fill_slot(w, c, slot, &at, segs, n_segs));
    return post_slot(w, c, step, mb, flags, n, digest, at);
}

/* Low-precision data on a host-slot channel of a CPU stage: the fp32 parts
 * (mask, valid flags) go into the slot first and the data is packed straight
 * into it behind them, the layout chan_send gathers (no staging in packed). */
static mmp_err send_packed_in_place(worker *w, chan *c, int step, int mb, int32_t flags, int n,
                                    uint64_t digest, const seg *segs, int n_segs)
{
    size_t lp = mmp_backend_lp_bytes(c->prec), total = segs[0].n * lp,
           cap = mmp_channel_slot_bytes(c->ch);
    for (int i = 1; i < n_segs; i++) {
        total += segs[i].n * sizeof(float);
    }
    if (total > cap) {
        return mmp_errorf(MMP_ERR_INVALID, "channel %d: %zu payload bytes, slot holds %zu", c->id,
                          total, cap);
    }
    void *slot = NULL;
    MMP_TRY(mmp_channel_acquire(c->ch, &slot));
    size_t at = 0;
    MMP_TRY(fill_slot(w, c, slot, &at, segs + 1, n_segs - 1));
    w->be->ops->pack_lp(w->be, (char *)slot + at, segs[0].p, segs[0].n, c->prec);
    return post_slot(w, c, step, mb, flags, n, digest, total);
}

/* The size is checked against the slot before anything is copied
 * (mmp_channel_sendv), and the bytes go through the transport. flags: the
 * header's (MMP_MSG_*). */
static mmp_err chan_send(worker *w, chan *c, int step, int mb, int32_t flags, int n,
                         uint64_t digest, const seg *segs, int n_segs)
{
    if (!c) {
        return mmp_errorf(MMP_ERR_PROTO, "step %d micro-batch %d: no channel to send on", step + 1,
                          mb);
    }
    mmp_channel_seg v[3];
    if (n_segs > 3) {
        return mmp_errorf(MMP_ERR_INTERNAL, "channel %d: %d segments", c->id, n_segs);
    }
    seg order[3];
    if (c->prec != MMP_PREC_FP32) {
        /* the data (segs[0], backend memory) packed to the training
         * precision and sent last, after the fp32 parts (see chan) */
        if (segs[0].host || segs[0].n > (size_t)w->mb_max * c->data_row) {
            return mmp_errorf(MMP_ERR_INTERNAL, "channel %d: %zu data floats to pack", c->id,
                              segs[0].n);
        }
        if (zero_copy_on() && !c->stage_host && w->gpu < 0 && mmp_channel_host_slots(c->ch)) {
            return send_packed_in_place(w, c, step, mb, flags, n, digest, segs, n_segs);
        }
        w->be->ops->pack_lp(w->be, c->packed, segs[0].p, segs[0].n, c->prec);
        for (int i = 1; i < n_segs; i++) {
            order[i - 1] = segs[i];
        }
        order[n_segs - 1] = (seg){c->packed, segs[0].n, 0, 1};
        segs = order;
    }
    size_t at = 0, cap = mmp_channel_slot_bytes(c->ch);
    for (int i = 0; i < n_segs; i++) {
        size_t bytes = segs[i].n * (segs[i].lp ? mmp_backend_lp_bytes(c->prec) : sizeof(float));
        v[i] = (mmp_channel_seg){segs[i].p, bytes};
        if (c->stage_host && bytes) {
            /* a GPU stage's host channel: gathered on the host first */
            if (bytes > cap - at) {
                return mmp_errorf(MMP_ERR_INVALID, "channel %d: %zu payload bytes, slot holds %zu",
                                  c->id, at + bytes, cap);
            }
            char *dst = (char *)c->stage_host + at;
            if (segs[i].host) {
                memcpy(dst, segs[i].p, bytes);
            } else {
                w->be->ops->to_host(w->be, dst, segs[i].p, bytes);
            }
            at += bytes;
        }
    }
    if (c->stage_host) {
        v[0] = (mmp_channel_seg){c->stage_host, at};
        n_segs = 1;
    }
    mmp_msg_header h = {.step = step, .mb = mb, .digest = digest, .n = n, .flags = flags};
    char what[32];
    snprintf(what, sizeof what, "%d", c->id);
    mmp_trace_flow(&w->trace, 's', flow_id(c->id, step, mb, (flags & MMP_MSG_EVAL) != 0), 0,
                   mmp_trace_now_us());
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
    chan *c = worker_find_chan(w, id);
    return c;
}

/* ---- one instruction ------------------------------------------------------------------ */

int worker_simulated(const worker *w)
{
    return w->plan.compute == MMP_COMPUTE_SIMULATED;
}

/* This stage's simulated forward (or backward) of n samples at step. */
static void sim_compute(worker *w, int step, int n, int backward)
{
    mmp_sim_sleep(&w->sim_clock, mmp_plan_sim_ms(&w->plan, (mmp_branch)w->kind, w->first, w->last,
                                                 n, step, backward, w->slot));
}

/* Half of this stage's simulated backward: zb-h1's B or W (the simulator's
 * default split, coordinator/schedule.h). */
static void sim_half_bwd(worker *w, int step, int n)
{
    mmp_sim_sleep(&w->sim_clock, 0.5 * mmp_plan_sim_ms(&w->plan, (mmp_branch)w->kind, w->first,
                                                       w->last, n, step, 1, w->slot));
}

/* Training: the next micro-batch from the prefetching loader (the wait is
 * the stage's data wait). Evaluation: the validation chunk, loaded here. */
mmp_err worker_do_load(worker *w, int step, int mb, int eval)
{
    const mmp_plan *p = &w->plan;
    double t0 = mmp_now();
    if (!eval) {
        if (w->batch) {
            return mmp_errorf(MMP_ERR_INTERNAL, "load of %d before the last one's forward", mb);
        }
        worker_release_uploaded(w);
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
    /* w->in_valid is pinned and the last training forward's upload of it
     * may still be queued (rewritten only after upload_wait; a later sync
     * of the stream covers it today, but no such sync is promised) */
    mmp_backend_upload_wait(w->be);
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
chan *worker_act_in(worker *w, int want_text)
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

const float *worker_payload_valid(const worker *w, const chan *c, size_t data_row, int text)
{
    return c->payload + (size_t)c->hdr.n * (data_row + (text ? (size_t)w->T : 0));
}

void worker_valid_to_host(worker *w, float *dst, const chan *c, size_t data_row, int text)
{
    if (c->hdr.flags & MMP_MSG_ALL_VALID) {
        /* the sender says every flag is 1: nothing to copy (nor to wait for) */
        for (int i = 0; i < c->hdr.n; i++) {
            dst[i] = 1.0f;
        }
        return;
    }
    payload_to_host(w, dst, worker_payload_valid(w, c, data_row, text),
                    (size_t)c->hdr.n * sizeof(float));
}

mmp_err worker_do_fwd(worker *w, int step, int mb, int eval)
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
        if (worker_simulated(w)) {
            sim_compute(w, step, n, 0); /* the loss stays 0 */
        } else if (w->batch_scope) {
            /* gathered into the step's rows; the loss waits for the last */
            if (w->fstep.done) {
                return mmp_errorf(MMP_ERR_PROTO,
                                  "step %d: fusion forward of micro-batch %d after the step's "
                                  "batch-wide loss ran (model.fusion.itc_scope: batch)",
                                  step + 1, mb);
            }
            if (n != mmp_plan_mb_size(&w->plan, mb)) {
                return mmp_errorf(MMP_ERR_PROTO,
                                  "channel %d: step %d micro-batch %d: header field n = %d, but "
                                  "the plan's micro-batch has %d samples",
                                  ci->id, step + 1, mb, n, mmp_plan_mb_size(&w->plan, mb));
            }
            worker_valid_to_host(w, w->valid_in[0], ci, img_row, 0);
            worker_valid_to_host(w, w->valid_in[1], ct, txt_row, 1);
            mmp_fuse_step_put(&w->fstep, mmp_plan_mb_offset(&w->plan, mb), n, ci->payload,
                              ct->payload, payload_mask(ct, txt_row), w->valid_in[0],
                              w->valid_in[1]);
        } else {
            mmp_params_mb_begin(w->params); /* its backward follows at once */
            worker_valid_to_host(w, w->valid_in[0], ci, img_row, 0);
            worker_valid_to_host(w, w->valid_in[1], ct, txt_row, 1);
            mmp_fuse_forward(&w->fuse, w->fus, f->acts, ci->payload, ct->payload,
                             payload_mask(ct, txt_row), w->valid_in[0], w->valid_in[1], n, w->B,
                             &w->loss, &skipped);
        }
        w->skipped += skipped;
        MMP_TRY(worker_chan_release(ci));
        MMP_TRY(worker_chan_release(ct));
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
            valid = worker_payload_valid(w, ci, (size_t)w->in_floats, w->kind == MMP_BRANCH_TEXT);
        }
        f->n = n;
        f->digest = digest;
        mmp_backend *be = w->be;
        chan *zc = train ? zc_chan(w, 0, -1) : NULL;
        float *out = zc ? zc->zc : w->out; /* zero-copy: the slot of the SEND_ACT next */
        /* A training batch (pinned, the loader's) goes up asynchronously
         * and is handed back to the loader at the next load, after
         * upload_wait; evaluation's host buffers are reused at once, so
         * they go up with a wait. */
        void (*up)(mmp_backend *, void *, const void *, size_t) =
            w->batch ? mmp_backend_upload : be->ops->to_device;
        /* A received payload is backend memory; a loaded batch is the
         * host's, uploaded here on a GPU (the CPU reads it in place). The
         * valid flags: a branch computes nothing from them, it passes them
         * on. A GPU stage keeps them on the device (a queued copy out of
         * the slot, or the upload of w->in_valid, pinned and rewritten only
         * after the next load's upload_wait), so its host never waits for
         * them; the CPU copies them to its host array. */
        size_t vb = (size_t)n * sizeof(float);
        const float *host_valid = NULL; /* where this host can read them */
        if (f->valid_dev) {
            if (ci) {
                be->ops->copy(be, f->valid_dev, valid, vb);
            } else {
                up(be, f->valid_dev, valid, vb);
                host_valid = valid;
            }
        } else if (ci) {
            payload_to_host(w, f->valid, valid, vb);
            host_valid = f->valid;
        } else {
            memcpy(f->valid, valid, vb);
            host_valid = f->valid;
        }
        /* MMP_MSG_ALL_VALID on what this branch sends on: from the flags
         * where the host has them, else as received */
        int all_valid = 1;
        if (host_valid) {
            for (int i = 0; i < n; i++) {
                all_valid &= host_valid[i] == 1.0f;
            }
        } else {
            all_valid = (ci->hdr.flags & MMP_MSG_ALL_VALID) != 0;
        }
        if (w->kind == MMP_BRANCH_TEXT) {
            size_t mb_bytes = (size_t)n * w->T * sizeof(float);
            if (ci) {
                be->ops->copy(be, f->mask, mask, mb_bytes);
            } else {
                up(be, f->mask, mask, mb_bytes);
            }
        }
        if (!ci && w->d_images && in) {
            up(be, w->d_images, in, (size_t)n * w->in_floats * sizeof(float));
            in = w->d_images;
        }
        if (!ci && w->d_ids && ids) {
            up(be, w->d_ids, ids, (size_t)n * w->T * sizeof(int32_t));
            ids = w->d_ids;
        }
        if (worker_simulated(w)) {
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
            mmp_image_net_forward(w->img, f->acts, in, n, train, out);
            mmp_image_net_bn_log(w->img, NULL);
        } else {
            mmp_text_net_forward(w->txt, f->acts, w->sub == 0 ? ids : NULL, w->sub == 0 ? NULL : in,
                                 f->mask, n, out);
        }
        if (ci) {
            MMP_TRY(worker_chan_release(ci));
        }
        if (w->batch) {
            if (w->gpu >= 0) {
                w->uploaded = w->batch; /* its upload may be in flight */
            } else {
                mmp_loader_release(w->loader, w->batch);
            }
            w->batch = NULL;
        }
        w->out_mb = mb;
        w->out_n = n;
        w->out_digest = digest;
        w->out_mask = f->mask;
        w->out_valid = f->valid_dev ? f->valid_dev : f->valid;
        w->out_valid_host = !f->valid_dev;
        w->out_all_valid = all_valid;
    }
    double ms = (mmp_now() - t0) * 1e3;
    if (!eval) {
        w->busy_ms += ms;
        w->fwd_ms[mb] += (float)ms;
        mmp_trace_span(&w->trace, "F", "compute", 0, t0 * 1e6, ms * 1e3, step + 1, mb);
    }
    return MMP_OK;
}

mmp_err worker_do_send_act(worker *w, int step, int mb, chan *c, int eval)
{
    if (w->out_mb != mb) {
        return mmp_errorf(MMP_ERR_INTERNAL, "send of micro-batch %d before its forward", mb);
    }
    size_t n = (size_t)w->out_n;
    seg segs[3] = {{w->out, n * (size_t)w->out_floats, 0, 0},
                   {w->out_mask, w->kind == MMP_BRANCH_TEXT ? n * (size_t)w->T : 0, 0, 0},
                   {w->out_valid, n, w->out_valid_host, 0}};
    int32_t flags = (eval ? MMP_MSG_EVAL : 0) | (w->out_all_valid ? MMP_MSG_ALL_VALID : 0);
    if (c && c->zc) {
        /* the forward wrote the data into this slot */
        return zc_post(w, c, step, mb, flags, w->out_n, w->out_digest, segs[0].n * sizeof(float),
                       segs + 1, 2);
    }
    return chan_send(w, c, step, mb, flags, w->out_n, w->out_digest, segs, 3);
}

/* Replicated fusion under batch scope: each replica holds its own
 * micro-batches' rows and zeros elsewhere (mmp_fuse_step_begin clears), so
 * the replicas' rank-order sum is the all-gather, exactly (x + 0 = x). The
 * row counts travel along and must add up to the batch. */
static mmp_err gather_step(worker *w, int step)
{
    double t0 = mmp_now();
    mmp_fuse_step *fs = &w->fstep;
    mmp_backend *be = w->be;
    size_t B = (size_t)w->B;
    float *dev[3] = {fs->img, fs->txt, fs->mask};
    size_t len[3] = {B * fs->img_row, B * fs->txt_row, B * (size_t)fs->T};
    float *h = w->gather;
    size_t at = 0;
    for (int i = 0; i < 3; i++) {
        be->ops->to_host(be, h + at, dev[i], len[i] * sizeof(float));
        at += len[i];
    }
    memcpy(h + at, fs->valid[0], B * sizeof(float));
    memcpy(h + at + B, fs->valid[1], B * sizeof(float));
    h[at + 2 * B] = (float)fs->rows;
    MMP_TRY(mmp_reduce_sum(w->reduce, h, at + 2 * B + 1));
    if (h[at + 2 * B] != (float)w->B) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "step %d: the fusion replicas forwarded %g samples in all, not the "
                          "batch's %d",
                          step + 1, (double)h[at + 2 * B], w->B);
    }
    at = 0;
    for (int i = 0; i < 3; i++) {
        be->ops->to_device(be, dev[i], h + at, len[i] * sizeof(float));
        at += len[i];
    }
    memcpy(fs->valid[0], h + at, B * sizeof(float));
    memcpy(fs->valid[1], h + at + B, B * sizeof(float));
    fs->rows = w->B;
    /* communication, as the replicas' reduce: traced, not counted as busy */
    w->gather_ms = (mmp_now() - t0) * 1e3;
    mmp_trace_span(&w->trace, "GATHER", "comm", 0, t0 * 1e6, w->gather_ms * 1e3, step + 1, -1);
    return MMP_OK;
}

/* Where the fusion's backward writes the gradients to the image (text 0) or
 * text branch: the slot of the SEND_GRAD next (zero-copy), else its buffer. */
static float *fusion_grad_out(worker *w, int text)
{
    chan *c = zc_chan(w, 1, text);
    return c ? c->zc : text ? w->dtxt : w->dimg;
}

/* Fusion under batch scope: the first backward of the step runs the loss
 * over the whole batch (every micro-batch's forward must have arrived: the
 * schedule puts every FWD before the first BWD, on every fusion replica);
 * each backward then hands its micro-batch's rows of the input gradients to
 * SEND_GRAD. Replicas gather the rows first and each runs the whole batch;
 * replica 0 alone keeps the parameter gradients and reports the loss, so the
 * replicas' gradient sum is one process's. split (zb-h1's BWD_INPUT): the
 * batch's linear weight gradients are recorded, not computed; the step's
 * first BWD_WEIGHT runs them (do_wgt), the other W's have nothing left. */
static mmp_err batch_scope_bwd(worker *w, int step, int mb, int n, int split)
{
    mmp_fuse_step *fs = &w->fstep;
    if (!fs->done && w->reduce) {
        MMP_TRY(gather_step(w, step));
    }
    if (!fs->done) {
        if (fs->rows != w->B) {
            return mmp_errorf(MMP_ERR_INTERNAL,
                              "step %d: fusion backward of micro-batch %d with %d of the batch's "
                              "%d samples forwarded (model.fusion.itc_scope: batch needs the "
                              "step's last forward first)",
                              step + 1, mb, fs->rows, w->B);
        }
        int skipped = 0, keep = w->asg->replica == 0;
        mmp_loss_parts other = {0};
        float mult = mmp_loss_scale_grad_mult(w->loss_scale, &w->plan, step);
        mmp_params_mb_begin(w->params);
        (split ? mmp_fuse_step_run_input : mmp_fuse_step_run)(
            fs, &w->fuse, w->fus, w->fl[0].acts, mult, keep ? &w->loss : &other, &skipped);
        if (keep) {
            mmp_params_mb_end(w->params);
            w->skipped += skipped;
        }
    }
    size_t off = (size_t)mmp_plan_mb_offset(&w->plan, mb);
    mmp_backend *be = w->be;
    be->ops->copy(be, fusion_grad_out(w, 0), fs->dimg + off * fs->img_row,
                  (size_t)n * fs->img_row * sizeof(float));
    be->ops->copy(be, fusion_grad_out(w, 1), fs->dtxt + off * fs->txt_row,
                  (size_t)n * fs->txt_row * sizeof(float));
    return MMP_OK;
}

/* BWD, or with split zb-h1's BWD_INPUT: the weight gradients wait in the
 * flight's recorder for do_wgt, and the flight (its activations) with them. */
static mmp_err do_bwd(worker *w, int step, int mb, int split)
{
    flight *f = flight_find(w, mb);
    if (!f || f->b_done) {
        return mmp_errorf(MMP_ERR_INTERNAL, "backward %d without its forward", mb);
    }
    mmp_wgrad *wg = split && !worker_simulated(w) ? &f->wg : NULL;
    double t0 = mmp_now();
    int n = f->n;
    if (w->kind == MMP_BRANCH_FUSION) {
        if (worker_simulated(w)) {
            split ? sim_half_bwd(w, step, n) : sim_compute(w, step, n, 1); /* dimg, dtxt: 0 */
        } else if (w->batch_scope) {
            MMP_TRY(batch_scope_bwd(w, step, mb, n, split));
        } else {
            /* the loss's backward starts here: scaled by the step's loss scale */
            float mult = mmp_loss_scale_grad_mult(w->loss_scale, &w->plan, step);
            mmp_fusion_net_defer(w->fus, wg);
            mmp_fuse_backward(&w->fuse, w->fus, f->acts, w->B, mult, fusion_grad_out(w, 0),
                              fusion_grad_out(w, 1));
            mmp_fusion_net_defer(w->fus, NULL);
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
            chan *zc = zc_chan(w, 1, -1);
            din = zc ? zc->zc : w->din; /* zero-copy: the slot of the SEND_GRAD next */
            w->be->ops->zero(w->be, din, (size_t)n * w->in_floats * sizeof(float));
        }
        if (worker_simulated(w)) {
            split ? sim_half_bwd(w, step, n) : sim_compute(w, step, n, 1); /* din keeps 0 */
        } else {
            /* each micro-batch's gradients apart, summed in double: nn/params.h */
            mmp_params_mb_begin(w->params);
            if (w->kind == MMP_BRANCH_IMAGE) {
                mmp_image_net_backward_input(w->img, f->acts, cg->payload, n, din, wg);
            } else {
                mmp_text_net_backward_input(w->txt, f->acts, cg->payload, n, din, wg);
            }
            mmp_params_mb_end(w->params);
        }
        MMP_TRY(worker_chan_release(cg));
    }
    w->out_n = n;
    w->out_digest = f->digest;
    if (split) {
        f->b_done = 1; /* held until its BWD_WEIGHT */
    } else {
        f->mb = -1;
        w->inflight--;
    }
    double ms = (mmp_now() - t0) * 1e3 - w->gather_ms; /* a gather is communication */
    w->gather_ms = 0;
    w->busy_ms += ms;
    w->bwd_ms[mb] += (float)ms; /* with zb-h1's W: B + W, comparable with the fused BWD */
    mmp_trace_span(&w->trace, split ? "Bi" : "B", "compute", 0, t0 * 1e6, ms * 1e3, step + 1, mb);
    return MMP_OK;
}

/* zb-h1's BWD_WEIGHT: the weight gradients BWD_INPUT recorded, into the
 * gradient sums (nn/wgrad.h); then the micro-batch's activations are free. */
static mmp_err do_wgt(worker *w, int step, int mb)
{
    flight *f = flight_find(w, mb);
    if (!f || !f->b_done) {
        return mmp_errorf(MMP_ERR_INTERNAL, "weight pass %d without its BWD_INPUT", mb);
    }
    double t0 = mmp_now();
    mmp_err e = MMP_OK;
    if (worker_simulated(w)) {
        sim_half_bwd(w, step, f->n);
    } else if (w->batch_scope) {
        /* the whole batch's weight pass, at the step's first W (after the
         * first BWD_INPUT, which ran the batch); replica 0's alone are kept */
        e = mmp_fuse_step_run_weights(&w->fstep, w->fus, w->asg->replica == 0);
    } else if (w->kind == MMP_BRANCH_IMAGE) {
        e = mmp_image_net_backward_weights(w->img, &f->wg);
    } else if (w->kind == MMP_BRANCH_TEXT) {
        e = mmp_text_net_backward_weights(w->txt, &f->wg);
    } else {
        e = mmp_fusion_net_backward_weights(w->fus, &f->wg);
    }
    f->b_done = 0;
    f->mb = -1;
    w->inflight--;
    MMP_TRY(e);
    double ms = (mmp_now() - t0) * 1e3;
    w->busy_ms += ms;
    w->bwd_ms[mb] += (float)ms;
    w->wgt_ms[mb] += (float)ms;
    mmp_trace_span(&w->trace, "W", "compute", 0, t0 * 1e6, ms * 1e3, step + 1, mb);
    return MMP_OK;
}

static mmp_err do_send_grad(worker *w, int step, int mb, chan *c)
{
    int n = w->out_n;
    if (c && c->zc) {
        /* the backward wrote the gradients into this slot */
        size_t row = w->kind == MMP_BRANCH_FUSION
                         ? (c->peer_text ? w->fuse.txt_row : w->fuse.img_row)
                         : (size_t)w->in_floats;
        uint64_t digest = w->kind == MMP_BRANCH_FUSION ? 0 : w->out_digest;
        return zc_post(w, c, step, mb, 0, n, digest, (size_t)n * row * sizeof(float), NULL, 0);
    }
    if (w->kind == MMP_BRANCH_FUSION) {
        size_t row = c->peer_text ? w->fuse.txt_row : w->fuse.img_row;
        seg g = {c->peer_text ? w->dtxt : w->dimg, (size_t)n * row, 0, 0};
        return chan_send(w, c, step, mb, 0, n, 0, &g, 1);
    }
    seg g = {w->din, (size_t)n * (size_t)w->in_floats, 0, 0};
    return chan_send(w, c, step, mb, 0, n, w->out_digest, &g, 1);
}

/* Replicas: every replica ends with the sum of all replicas' gradients
 * (transport/reduce.h: the plain sum is the sample-weighted one, since each
 * micro-batch's loss is already divided by the global batch) and with every
 * micro-batch's batch-norm statistics, replayed in micro-batch order. */
static mmp_err reduce_replicas(worker *w, int step)
{
    double t0 = mmp_now();
    if (w->reduce_dev) {
        /* GPU replicas across hosts: NCCL all-gather, then the same
         * rank-order sum on the device (transport/reduce_nccl.h) */
        MMP_TRY(w->nccl->sum_f64(w->reduce_dev, w->params->grad_acc, w->params->total));
    } else if (w->reduce_host) {
        /* a GPU stage: the double sums go through the host's shared-memory
         * reduce (the same fixed rank order, so still bitwise one process) */
        size_t bytes = w->params->total * sizeof(double);
        w->be->ops->to_host(w->be, w->reduce_host, w->params->grad_acc, bytes);
        MMP_TRY(mmp_reduce_sum_f64(w->reduce, w->reduce_host, w->params->total));
        w->be->ops->to_device(w->be, w->params->grad_acc, w->reduce_host, bytes);
    } else {
        MMP_TRY(mmp_reduce_sum_f64(w->reduce, w->params->grad_acc, w->params->total));
    }
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
    if (w->batch_scope && w->reduce && !w->fstep.done) {
        /* a fusion replica routed no micro-batch this step still takes
         * part in the gather of the step's rows (it adds none) */
        MMP_TRY(gather_step(w, step));
        w->gather_ms = 0; /* no BWD's time to take it from */
    }
    if (w->batch_scope && mmp_fuse_step_weights_pending(&w->fstep)) {
        return mmp_errorf(MMP_ERR_INTERNAL,
                          "step %d: the batch's deferred weight gradients never ran (a "
                          "BWD_INPUT without its BWD_WEIGHT)",
                          step + 1);
    }
    if (w->reduce) {
        MMP_TRY(reduce_replicas(w, step));
    }
    mmp_params_grad_finish(w->params);
    mmp_params_grad_unscale(w->params, w->loss_scale);
    /* Every replica now holds the same sums, bit for bit, and the
     * coordinator takes one norm per stage: only the last replica, the
     * reduce chain's last rank and so the first to hold them, computes and
     * sends it; the others go straight to waiting for the coefficient (one
     * pass over the gradients and two control messages less each). */
    if (!w->reduce || w->asg->replica == w->replicas - 1) {
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__GradNorm g = MMPIPE__GRAD_NORM__INIT;
        g.step = step;
        g.sumsq = mmp_params_grad_sumsq(w->params);
        env.body_case = MMPIPE__ENVELOPE__BODY_GRAD_NORM;
        env.grad_norm = &g;
        MMP_TRY(worker_send_env(w, &env));
    }
    Mmpipe__Envelope *reply;
    MMP_TRY(worker_wait_for(w, MMPIPE__ENVELOPE__BODY_CLIP, &reply));
    if (reply->clip->call_off) {
        mmp_ctl_free(reply);
        /* a peer lost or holding: this process holds too (worker.c) */
        return mmp_errorf(MMP_ERR_PEER, "step %d called off by the coordinator", step + 1);
    }
    int ok = reply->clip->step == step;
    w->clip_coef = reply->clip->coef;
    w->skip_opt = reply->clip->skip;
    w->opt_step = reply->clip->opt_step;
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

mmp_err worker_run_step(worker *w, int step)
{
    const Mmpipe__Assignment *a = w->asg;
    double t0 = mmp_now();
    if (w->cpu_mark == 0) {
        w->cpu_mark = mmp_metrics_cpu_ms();
    }
    /* The gradients are zeroed just before the step's first instruction that
     * writes or reads them, not here: the forwards before it (on a first
     * stage, what every later stage waits for) start sooner. */
    int zeroed = 0;
    w->opt_ran = 0;
    w->fault_op = -1;
    if (w->kind == MMP_BRANCH_IMAGE) {
        /* a step cut short puts back the running statistics its forwards
         * (or, on replicas, the replay after the reduce) moved: worker.c */
        MMP_TRY(mmp_params_buffers_mark(w->params));
    }
    if (w->bn_rows) {
        memset(w->bn_rows, 0, (size_t)a->microbatches * (size_t)w->bn_row * sizeof(float));
    }
    w->busy_ms = w->data_ms = 0;
    w->skipped = 0;
    w->max_inflight = 0;
    if (w->batch_scope) {
        mmp_fuse_step_begin(&w->fstep, w->reduce != NULL);
    }
    memset(&w->loss, 0, sizeof w->loss);
    memset(w->fwd_ms, 0, (size_t)a->microbatches * sizeof(float));
    memset(w->bwd_ms, 0, (size_t)a->microbatches * sizeof(float));
    memset(w->wgt_ms, 0, (size_t)a->microbatches * sizeof(float));
    for (size_t i = 0; i < w->n_prog; i++) {
        const Mmpipe__Instr *in = w->prog[i];
        chan *c = in->edge >= 0 ? chan_of(w, in->edge) : NULL;
        int mb = in->mb;
        if (in->edge >= 0 && !c) {
            return mmp_errorf(MMP_ERR_PROTO, "instruction %zu names unknown channel %d", i,
                              in->edge);
        }
        mmp_err e = MMP_OK;
        if (!zeroed && in->op != MMPIPE__OP__LOAD && in->op != MMPIPE__OP__RECV_ACT &&
            in->op != MMPIPE__OP__FWD && in->op != MMPIPE__OP__SEND_ACT) {
            mmp_params_zero_grad(w->params);
            zeroed = 1;
        }
        switch (in->op) {
        case MMPIPE__OP__LOAD: {
            double l0 = mmp_now();
            e = worker_do_load(w, step, mb, 0);
            double ms = (mmp_now() - l0) * 1e3;
            w->busy_ms += ms;
            mmp_trace_span(&w->trace, "L", "data", 0, l0 * 1e6, ms * 1e3, step + 1, mb);
            break;
        }
        case MMPIPE__OP__RECV_ACT:
        case MMPIPE__OP__RECV_GRAD:
            e = worker_chan_recv(w, c, step, mb, 0);
            break;
        case MMPIPE__OP__FWD:
            zc_prepare(w, i, MMPIPE__OP__SEND_ACT, mb);
            e = worker_do_fwd(w, step, mb, 0);
            break;
        case MMPIPE__OP__SEND_ACT:
            e = worker_do_send_act(w, step, mb, c, 0);
            break;
        case MMPIPE__OP__BWD:
        case MMPIPE__OP__BWD_INPUT:
            zc_prepare(w, i, MMPIPE__OP__SEND_GRAD, mb);
            e = do_bwd(w, step, mb, in->op == MMPIPE__OP__BWD_INPUT);
            break;
        case MMPIPE__OP__BWD_WEIGHT:
            e = do_wgt(w, step, mb);
            break;
        case MMPIPE__OP__SEND_GRAD:
            e = do_send_grad(w, step, mb, c);
            break;
        case MMPIPE__OP__GRAD_NORM:
            e = do_grad_norm(w, step);
            break;
        case MMPIPE__OP__OPT_STEP: {
            double o0 = mmp_now();
            w->opt_ran = 1; /* from here the state is the step's end */
            if (w->skip_opt) {
                break; /* an fp16 overflow somewhere: every stage skips this step */
            }
            mmp_optim_step(w->params, &w->plan, w->opt_step, mmp_lr_at(&w->plan, step),
                           w->clip_coef);
            double ms = (mmp_now() - o0) * 1e3;
            w->busy_ms += ms;
            mmp_trace_span(&w->trace, "OPT", "compute", 0, o0 * 1e6, ms * 1e3, step + 1, -1);
            break;
        }
        default:
            e = mmp_errorf(MMP_ERR_PROTO, "unknown instruction %d", (int)in->op);
        }
        if (e != MMP_OK) {
            w->fault_op = in->op;
            return mmp_error_prefix(e, "step %d instruction %zu", step + 1, i);
        }
        worker_heartbeat(w, step, (int)i);
    }
    if (mmp_backend_error(w->be) != MMP_OK) {
        return mmp_error_prefix(mmp_backend_error(w->be), "step %d on cuda:%d", step + 1, w->gpu);
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
        tm[m].wgt_ms = w->wgt_ms[i];
        tp[m] = &tm[m];
        m++;
    }
    d.step = step;
    d.busy_ms = (float)w->busy_ms;
    d.wall_ms = (float)wall;
    d.idle_ms = (float)(wall - w->busy_ms);
    d.data_ms = (float)w->data_ms;
    /* a GPU stage's device memory (arena + workspace), a CPU stage's RSS */
    d.peak_mem_bytes =
        w->gpu >= 0 ? (uint64_t)mmp_backend_device_bytes(w->be) : (uint64_t)peak_rss();
    d.n_mbs = (size_t)m;
    d.mbs = tp;
    d.loss = w->loss.loss;
    d.itc = w->loss.itc;
    d.itm = w->loss.itm;
    d.max_inflight = w->max_inflight;
    d.state_bytes = (uint64_t)mmp_params_bytes(w->params);
    /* batch scope: the fusion's one activation store holds the whole batch */
    d.act_slots = w->kind == MMP_BRANCH_FUSION && w->batch_scope
                      ? (w->B + w->mb_max - 1) / (w->mb_max > 0 ? w->mb_max : 1)
                      : w->n_fl;
    d.device_total_bytes = (uint64_t)w->device_total;
    d.skipped = w->skipped;
    double cpu = mmp_metrics_cpu_ms();
    d.cpu_ms = (float)(cpu - w->cpu_mark);
    w->cpu_mark = cpu;
    env.body_case = MMPIPE__ENVELOPE__BODY_STEP_DONE;
    env.step_done = &d;
    return worker_send_env(w, &env);
}
