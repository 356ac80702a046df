/* Evaluation (the validation pairs through the same forward, retrieval
 * recall at the fusion stage) and a stage's checkpoint file. */
#include "stages/worker_internal.h"

#include "nn/retrieval.h"

/* ---- evaluation and checkpoints --------------------------------------------------------- */

typedef struct eval_beat {
    worker *w;
    int step, chunks;
} eval_beat;

/* The retrieval over a large validation set takes a while (n^2 dot
 * products): it keeps talking too (worker_heartbeat: at most once a second). */
static void retrieval_progress(void *ctx, int64_t done, int64_t n)
{
    eval_beat *b = ctx;
    (void)done, (void)n;
    worker_heartbeat(b->w, b->step, b->chunks);
}

mmp_err worker_run_eval(worker *w, int step)
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
        ie = worker_xcalloc((size_t)nv * E, sizeof(float), &err);
        te = worker_xcalloc((size_t)nv * E, sizeof(float), &err);
        if (err != MMP_OK) {
            goto exit;
        }
    }
    for (int c = 0; c < chunks; c++) {
        /* An evaluation is many forwards: talking as it goes keeps the
         * coordinator's stall watchdog, sized for one, from calling it a
         * stall (at most one heartbeat a second). */
        worker_heartbeat(w, step, c);
        if (w->kind == MMP_BRANCH_FUSION) {
            chan *ci = worker_act_in(w, 0), *ct = worker_act_in(w, 1);
            if ((err = worker_chan_recv(w, ci, step, c, 1)) != MMP_OK ||
                (err = worker_chan_recv(w, ct, step, c, 1)) != MMP_OK ||
                (err = worker_do_fwd(w, step, c, 1)) != MMP_OK) {
                goto exit;
            }
            int n = ci->hdr.n;
            const float *txt = ct->payload, *mask = ct->payload + (size_t)n * w->T * w->D;
            if (!worker_simulated(w)) {
                /* the embeddings and flags of the chunk, on the host */
                float *ih = ie + (size_t)kept * E, *th = te + (size_t)kept * E;
                size_t eb = (size_t)n * E * sizeof(float);
                mmp_backend *be = w->be;
                mmp_fusion_net_embed(w->fus, w->fl[0].acts, ci->payload, txt, mask, n,
                                     w->emb_dev[0] ? w->emb_dev[0] : ih,
                                     w->emb_dev[1] ? w->emb_dev[1] : th);
                if (w->emb_dev[0]) {
                    be->ops->to_host(be, ih, w->emb_dev[0], eb);
                    be->ops->to_host(be, th, w->emb_dev[1], eb);
                }
                worker_valid_to_host(w, w->valid_in[0], ci, w->fuse.img_row, 0);
                worker_valid_to_host(w, w->valid_in[1], ct, w->fuse.txt_row, 1);
                const float *iv = w->valid_in[0], *tv = w->valid_in[1];
                int64_t base = kept;
                for (int i = 0; i < n; i++) { /* keep the good pairs, in order */
                    if (iv[i] != 0 && tv[i] != 0) {
                        memmove(ie + kept * E, ie + (base + i) * E, (size_t)E * sizeof(float));
                        memmove(te + kept * E, te + (base + i) * E, (size_t)E * sizeof(float));
                        kept++;
                    }
                }
            }
            if ((err = worker_chan_release(ci)) != MMP_OK ||
                (err = worker_chan_release(ct)) != MMP_OK) {
                goto exit;
            }
            continue;
        }
        if (w->sub == 0) {
            err = worker_do_load(w, step, c, 1);
        } else {
            err = worker_chan_recv(w, worker_act_in(w, w->kind == MMP_BRANCH_TEXT), step, c, 1);
        }
        if (err == MMP_OK) {
            err = worker_do_fwd(w, step, c, 1);
        }
        chan *out = NULL;
        for (int i = 0; i < w->n_chans; i++) {
            if (w->chans[i].send && !w->chans[i].grad && w->chans[i].peer_r0) {
                out = &w->chans[i];
            }
        }
        if (err == MMP_OK) {
            err = worker_do_send_act(w, step, c, out, 1);
        }
        if (err != MMP_OK) {
            goto exit;
        }
    }
    if (mmp_backend_error(w->be) != MMP_OK) {
        /* a failed device op: the embeddings (and what was sent) are not
         * the model's; no recall from them (a CPU stage never fails) */
        err = mmp_error_prefix(mmp_backend_error(w->be), "evaluation after step %d on cuda:%d",
                               step + 1, w->gpu);
        goto exit;
    }
    if (w->kind == MMP_BRANCH_FUSION) {
        double i2t = 0, t2i = 0; /* simulated: no embeddings, recall 0 */
        if (!worker_simulated(w) && kept < nv) {
            MMP_WARN("evaluation: %lld of %lld validation pairs skipped (bad data, "
                     "data.on_bad_sample: skip)",
                     (long long)(nv - kept), (long long)nv);
        }
        if (!worker_simulated(w) && kept > 0 &&
            (err = mmp_retrieval_r1_blocked(ie, te, (int)kept, E, 0, retrieval_progress,
                                            &(eval_beat){.w = w, .step = step, .chunks = chunks},
                                            &i2t, &t2i)) != MMP_OK) {
            goto exit;
        }
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__EvalDone d = MMPIPE__EVAL_DONE__INIT;
        d.step = step;
        d.i2t_r1 = (float)i2t;
        d.t2i_r1 = (float)t2i;
        env.body_case = MMPIPE__ENVELOPE__BODY_EVAL_DONE;
        env.eval_done = &d;
        err = worker_send_env(w, &env);
    }
exit:
    free(ie);
    free(te);
    return err;
}

static mmp_err send_ckpt_ack(worker *w, int step, mmp_err e, const char *why, int pending)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__CheckpointAck ack = MMPIPE__CHECKPOINT_ACK__INIT;
    ack.step = step;
    ack.ok = e == MMP_OK;
    ack.error = e == MMP_OK ? "" : (char *)why;
    ack.pending = pending;
    env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK;
    env.checkpoint_ack = &ack;
    return worker_send_env(w, &env);
}

mmp_err worker_ckpt_settle(worker *w, int wait)
{
    int step;
    mmp_err result;
    const char *why;
    int done = wait ? mmp_ckpt_bg_wait(&w->ckpt, &step, &result, &why)
                    : mmp_ckpt_bg_poll(&w->ckpt, &step, &result, &why);
    if (!done) {
        return MMP_OK;
    }
    if (result != MMP_OK) {
        MMP_ERROR("checkpoint of step %d: %s", step, why);
    }
    /* the write's own row of the trace: it ran beside the steps */
    mmp_trace_span(&w->trace, "CKPT WRITE", "io", 1, w->ckpt.t_start_us,
                   w->ckpt.t_end_us - w->ckpt.t_start_us, step, -1);
    return send_ckpt_ack(w, step, result, why, 0);
}

int worker_ckpt_busy(const worker *w)
{
    return w->ckpt.busy;
}

mmp_err worker_run_checkpoint(worker *w, const Mmpipe__CheckpointRequest *r)
{
    /* the one before first: the coordinator takes the acks in order */
    MMP_TRY(worker_ckpt_settle(w, 1));
    char path[1200];
    if (snprintf(path, sizeof path, "%s/%s", r->dir, w->asg->ckpt_file) >= (int)sizeof path) {
        return mmp_errorf(MMP_ERR_PROTO, "checkpoint request: directory '%.200s...' too long",
                          r->dir);
    }
    if (r->writer >= w->replicas) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "checkpoint request: field writer = %d, the stage has %d replicas",
                          r->writer, w->replicas);
    }
    if (w->asg->replica != r->writer) { /* replicas hold identical state: one file */
        return send_ckpt_ack(w, r->step, MMP_OK, "", 0);
    }
    mmp_err e = mmp_mkdirs(r->dir);
    if (e == MMP_OK && r->background) {
        /* a host copy now; the file is written while the next steps run */
        double t0 = mmp_trace_now_us();
        e = mmp_params_snapshot(w->params, &w->ckpt.snap);
        if (e == MMP_OK) {
            mmp_trace_span(&w->trace, "CKPT SNAPSHOT", "io", 0, t0, mmp_trace_now_us() - t0,
                           r->step, -1);
            e = mmp_ckpt_bg_start(&w->ckpt, r->step, path);
        }
        if (e == MMP_OK) {
            return send_ckpt_ack(w, r->step, MMP_OK, "", 1);
        }
    } else if (e == MMP_OK) {
        double t0 = mmp_trace_now_us();
        e = mmp_params_save(w->params, path);
        mmp_trace_span(&w->trace, "CKPT WRITE", "io", 0, t0, mmp_trace_now_us() - t0, r->step, -1);
    }
    return send_ckpt_ack(w, r->step, e, e == MMP_OK ? "" : mmp_last_error(), 0);
}
