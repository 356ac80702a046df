/* The stage worker's set-up from its assignment (checked first): the plan,
 * the nets on the stage's backend, the data set and loader of a branch's
 * first sub-stage, the data channels and the replicas' reduce; and the
 * teardown that undoes all of it, valid after a failed set-up. */
#include "stages/worker_internal.h"

#include "common/cuda_module.h"
#include "common/pin.h"

#include <sys/resource.h>

/* ---- set-up ---------------------------------------------------------------------- */

chan *worker_find_chan(worker *w, int id)
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
static size_t chan_row_bytes(const worker *w, const Mmpipe__Channel *c, size_t *data_row,
                             mmp_precision prec)
{
    int64_t data, extra = 0;
    int from_text = w->kind == MMP_BRANCH_TEXT ||
                    (w->kind == MMP_BRANCH_FUSION && strncmp(c->peer, "text", 4) == 0);
    if (from_text) {
        data = (int64_t)w->T * w->D;
        extra = c->grad ? 0 : w->T; /* the mask travels with text activations */
    } else if (w->kind == MMP_BRANCH_FUSION) {
        data = (int64_t)mmp_image_net_tokens(&w->plan) * w->D;
    } else {
        /* image: what leaves forward is this range's output; what arrives
         * forward is its input; gradients mirror them. */
        int outward = c->send != c->grad; /* act send or grad recv: our output side */
        data = outward ? w->out_floats : w->in_floats;
    }
    if (!c->grad) {
        extra += 1; /* the valid flag of each sample travels with activations */
    }
    *data_row = (size_t)data;
    return (size_t)data * mmp_backend_lp_bytes(prec) + (size_t)extra * sizeof(float);
}

/* The precision of a channel's data: the training precision between a
 * branch and fusion, fp32 between the sub-stages of a branch (cutting a
 * branch never changes the arithmetic, so any split equals the single
 * process, which rounds exactly at the branch outputs: stages/single.c). */
static mmp_precision chan_prec(const worker *w, const Mmpipe__Channel *c)
{
    if (w->kind == MMP_BRANCH_FUSION || strncmp(c->peer, "fusion", 6) == 0) {
        return w->plan.train.precision;
    }
    return MMP_PREC_FP32;
}

/* How long a channel or the replicas' reduce waits on a peer before it
 * reports the peer lost: longer than the coordinator's stall watchdog
 * (train.stall_timeout), which names the stage at fault first. */
static int peer_timeout_ms(const worker *w)
{
    int stall = w->plan.train.stall_timeout;
    return stall > 30 ? 2000 * stall : 60000;
}

/* A tcp end given port 0 whose creator has not reported its port yet (the
 * creator itself listens there; a connector waits for an Endpoints message). */
static int port_zero(const char *address)
{
    size_t n = strlen(address);
    return address[0] != '/' && n >= 2 && strcmp(address + n - 2, ":0") == 0;
}

/* A transport whose creator reports its address (tcp, nccl: Endpoints). */
static int network(const char *transport)
{
    return strcmp(transport, "tcp") == 0 || strcmp(transport, "nccl") == 0;
}

/* Opens the channel ends of one pass: 0 the creators, 1 the others, with
 * addr[i] the address of a->channels[i]. */
static mmp_err open_channels(worker *w, int pass, char (*addr)[MMP_ENDPOINT_MAX])
{
    const Mmpipe__Assignment *a = w->asg;
    {
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
            ch->prec = chan_prec(w, c);
            ch->row_bytes = chan_row_bytes(w, c, &ch->data_row, ch->prec);
            mmp_channel_cfg cfg = {.address = addr[i],
                                   .slot_bytes = ch->row_bytes * (size_t)w->mb_max,
                                   .slots = c->slots,
                                   .send = c->send,
                                   .timeout_ms = peer_timeout_ms(w),
                                   .secret = w->token};
            mmp_err e = MMP_OK;
            if (strcmp(c->transport, "cuda_ipc") == 0 || strcmp(c->transport, "nccl") == 0) {
                /* device slots, ordered on the backend's stream: no host copy, no host wait */
                if (w->gpu < 0) {
                    e = mmp_errorf(MMP_ERR_PROTO, "transport %s for a stage on the CPU",
                                   c->transport);
                }
                cfg.on_gpu = 1;
                cfg.device = w->gpu;
                cfg.cuda_stream = mmp_backend_stream(w->be);
            } else if (w->gpu >= 0) {
                /* a host channel of a GPU stage: staged through these */
                ch->stage_dev = worker_balloc(w, cfg.slot_bytes, &e);
                ch->stage_host = e == MMP_OK ? mmp_backend_host_alloc(w->be, cfg.slot_bytes) : NULL;
                if (e == MMP_OK && !ch->stage_host) {
                    e = mmp_errorf(MMP_ERR_NOMEM, "%zu bytes of pinned staging", cfg.slot_bytes);
                }
            }
            if (ch->prec != MMP_PREC_FP32) {
                size_t rows = (size_t)w->mb_max;
                if (c->send) {
                    ch->packed = worker_balloc(w, rows * ch->data_row * sizeof(float), &e);
                } else {
                    ch->wide = worker_balloc(w, rows * (ch->row_bytes + ch->data_row * 4), &e);
                }
            }
            if (e == MMP_OK) {
                e = mmp_channel_open(&ch->ch, c->transport, &cfg, c->creator);
            }
            if (e != MMP_OK) {
                mmp_backend_host_free(w->be, ch->stage_host);
                w->be->ops->free(w->be, ch->packed);
                w->be->ops->free(w->be, ch->wide);
                w->n_chans--;
                return mmp_error_prefix(e, "channel %d to %s", c->id, c->peer);
            }
        }
    }
    return MMP_OK;
}

/* Rank k > 0 of a reduce over nccl before rank 0's report: the
 * coordinator's "host:0#nccl". */
static int nccl_waiting(const char *address)
{
    size_t n = strlen(address);
    return n > 7 && strcmp(address + n - 7, ":0#nccl") == 0;
}

/* A "#nccl" reduce address: rank 0's "host:0#nccl" (from the coordinator)
 * or the others' "host:port#nccl:<id hex>" (rank 0's report, untrusted:
 * checked whole) into the host reduce's "host:port" and (rank > 0) the id. */
static mmp_err split_nccl(const worker *w, const char *address, char *host, unsigned char *id)
{
    if (w->gpu < 0) {
        return mmp_errorf(MMP_ERR_PROTO, "reduce address '%s': nccl for a stage on the CPU",
                          address);
    }
#ifdef MMP_HAVE_CUDA
    if (w->asg->replica > 0) {
        return mmp_nccl_parse_address(address, host, MMP_ENDPOINT_MAX, id);
    }
    if (!nccl_waiting(address)) {
        return mmp_errorf(MMP_ERR_PROTO, "reduce address '%s': rank 0 wants \"host:0#nccl\"",
                          address);
    }
    snprintf(host, MMP_ENDPOINT_MAX, "%.*s", (int)(strlen(address) - 5), address);
    (void)id;
    return MMP_OK;
#else
    (void)host, (void)id;
    return mmp_errorf(MMP_ERR_UNSUPPORTED, "reduce address '%s': nccl, but built without CUDA",
                      address);
#endif
}

/* The replicas' reduce at address: a shm name, "host:port" (tcp), or for
 * GPU replicas across hosts a "#nccl" address (split_nccl): the gradients
 * then go over NCCL (w->reduce_dev) beside the tcp reduce (w->reduce). */
static mmp_err open_reduce(worker *w, const char *address)
{
    const Mmpipe__Assignment *a = w->asg;
    char host[MMP_ENDPOINT_MAX];
    unsigned char id[MMP_NCCL_ID_BYTES];
    int nccl = address[0] != '/' && strstr(address, "#nccl") != NULL;
    snprintf(host, sizeof host, "%s", address);
    if (nccl) {
        MMP_TRY(split_nccl(w, address, host, id));
    }
    size_t cap = 2 * w->params->total; /* the gradients in double */
    cap = cap > w->gather_floats ? cap : w->gather_floats;
    if ((size_t)a->microbatches * (size_t)w->bn_row > cap) {
        cap = (size_t)a->microbatches * (size_t)w->bn_row;
    }
    if (cap < 2 * (size_t)w->replicas) {
        cap = 2 * (size_t)w->replicas; /* the nccl reduce's n check: R doubles */
    }
    mmp_reduce_cfg rc = {.name = host,
                         .replicas = w->replicas,
                         .rank = a->replica,
                         .capacity = cap,
                         .timeout_ms = peer_timeout_ms(w),
                         .secret = w->token};
    MMP_TRY(mmp_reduce_open(&w->reduce, &rc));
    if (nccl) {
        MMP_INFO("%s: replicas' reduce over nccl on cuda:%d (all-gather, rank-order sum), tcp via "
                 "%s beside it (rank %d of %d)",
                 w->name, w->gpu, mmp_reduce_address(w->reduce), a->replica, w->replicas);
        mmp_reduce_nccl_cfg nc = {.replicas = w->replicas,
                                  .rank = a->replica,
                                  .capacity = w->params->total,
                                  .device = w->gpu,
                                  .stream = mmp_backend_stream(w->be),
                                  .side = w->reduce,
                                  .id = a->replica > 0 ? id : NULL,
                                  .timeout_ms = peer_timeout_ms(w)};
        MMP_TRY(mmp_reduce_nccl_load(&w->nccl));
        return w->nccl->open(&w->reduce_dev, &nc);
    }
    if (address[0] != '/') {
        MMP_INFO("%s: replicas' reduce over tcp via %s (rank %d of %d)", w->name,
                 mmp_reduce_address(w->reduce), a->replica, w->replicas);
    }
    if (w->gpu >= 0) {
        w->reduce_host = mmp_backend_host_alloc(w->be, w->params->total * sizeof(double));
        if (!w->reduce_host) {
            return mmp_errorf(MMP_ERR_NOMEM, "%zu bytes of pinned reduce staging",
                              w->params->total * sizeof(double));
        }
    }
    return MMP_OK;
}

/* The data channels and the replicas' reduce. Creators first (setup never
 * blocks, so no process waits for a peer that is itself waiting); then the
 * tcp creators' real addresses go to the coordinator (Endpoints), which
 * forwards each to the end that connects; a tcp connector given port 0
 * waits for its address; then the connectors. */
static mmp_err open_data_plane(worker *w)
{
    const Mmpipe__Assignment *a = w->asg;
    if (a->n_channels > MAX_CHANNELS) {
        return mmp_errorf(MMP_ERR_PROTO, "%zu channels (at most %d)", a->n_channels, MAX_CHANNELS);
    }
    /* a tcp channel holds its socket, a reduce a pidfd a replica */
    char what[120];
    snprintf(what, sizeof what, "stage %s: %zu channels and %d replicas", w->name, a->n_channels,
             w->replicas);
    MMP_TRY(mmp_ctl_reserve_fds(64 + (long)a->n_channels + 2L * w->replicas, what));
    static char addr[MAX_CHANNELS][MMP_ENDPOINT_MAX];
    char reduce_addr[MMP_ENDPOINT_MAX];
    for (size_t i = 0; i < a->n_channels; i++) {
        snprintf(addr[i], sizeof addr[i], "%s", a->channels[i]->address);
    }
    snprintf(reduce_addr, sizeof reduce_addr, "%s", a->reduce_address ? a->reduce_address : "");
    int reduce_tcp = w->replicas > 1 && reduce_addr[0] != '/';
    MMP_TRY(open_channels(w, 0, addr));
    if (w->replicas > 1 && (!reduce_tcp || a->replica == 0)) {
        MMP_TRY(open_reduce(w, reduce_addr));
    }

    /* Report where the tcp creators listen. */
    Mmpipe__Endpoint eps[MAX_CHANNELS + 1], *epp[MAX_CHANNELS + 1];
    size_t n_eps = 0;
    for (int k = 0; k < w->n_chans; k++) {
        const Mmpipe__Channel *c = NULL;
        for (size_t i = 0; i < a->n_channels; i++) {
            c = a->channels[i]->id == w->chans[k].id ? a->channels[i] : c;
        }
        if (c && c->creator && network(c->transport)) {
            mmpipe__endpoint__init(&eps[n_eps]);
            eps[n_eps].channel = c->id;
            eps[n_eps].address = (char *)mmp_channel_address(w->chans[k].ch);
            epp[n_eps] = &eps[n_eps];
            n_eps++;
        }
    }
    char reduce_at[MMP_ENDPOINT_MAX];
    if (reduce_tcp && a->replica == 0) {
        snprintf(reduce_at, sizeof reduce_at, "%s", mmp_reduce_address(w->reduce));
        if (w->reduce_dev) { /* "host:port#nccl:<the id>" */
            MMP_TRY(w->nccl->address(w->reduce_dev, mmp_reduce_address(w->reduce), reduce_at,
                                     sizeof reduce_at));
        }
        mmpipe__endpoint__init(&eps[n_eps]);
        eps[n_eps].channel = -1;
        eps[n_eps].address = reduce_at;
        epp[n_eps] = &eps[n_eps];
        n_eps++;
    }
    if (n_eps > 0) {
        Mmpipe__Endpoints msg = MMPIPE__ENDPOINTS__INIT;
        msg.n_endpoints = n_eps;
        msg.endpoints = epp;
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_ENDPOINTS;
        env.endpoints = &msg;
        MMP_TRY(worker_send_env(w, &env));
    }

    /* Wait for the addresses the connectors need. */
    int needed =
        reduce_tcp && a->replica > 0 && (port_zero(reduce_addr) || nccl_waiting(reduce_addr));
    for (size_t i = 0; i < a->n_channels; i++) {
        const Mmpipe__Channel *c = a->channels[i];
        needed += !c->creator && network(c->transport) && port_zero(addr[i]);
    }
    while (needed > 0) {
        Mmpipe__Envelope *env = NULL;
        MMP_TRY(worker_wait_for(w, MMPIPE__ENVELOPE__BODY_ENDPOINTS, &env));
        mmp_err e = MMP_OK;
        for (size_t k = 0; e == MMP_OK && k < env->endpoints->n_endpoints; k++) {
            const Mmpipe__Endpoint *ep = env->endpoints->endpoints[k];
            char *slot = NULL;
            if (ep->channel == -1 && reduce_tcp && a->replica > 0) {
                slot = reduce_addr;
            }
            for (size_t i = 0; !slot && i < a->n_channels; i++) {
                const Mmpipe__Channel *c = a->channels[i];
                if (c->id == ep->channel && !c->creator && network(c->transport)) {
                    slot = addr[i];
                }
            }
            if (!slot || !(port_zero(slot) || nccl_waiting(slot))) {
                e = mmp_errorf(MMP_ERR_PROTO,
                               "endpoints: field channel = %d (address '%s') is no tcp end this "
                               "stage connects and still waits for",
                               ep->channel, ep->address);
            } else if (mmp_channel_check_endpoint(ep->address) != MMP_OK) {
                /* never a shm name: the reduce would join whatever segment it names */
                e = mmp_error_prefix(MMP_ERR_PROTO, "endpoints: field channel = %d", ep->channel);
            } else {
                snprintf(slot, MMP_ENDPOINT_MAX, "%s", ep->address);
                needed--;
            }
        }
        mmp_ctl_free(env);
        MMP_TRY(e);
    }
    if (reduce_tcp && a->replica > 0) {
        MMP_TRY(open_reduce(w, reduce_addr));
    }
    return open_channels(w, 1, addr);
}

void *worker_balloc(worker *w, size_t bytes, mmp_err *err)
{
    void *p = NULL;
    if (*err == MMP_OK) {
        *err = w->be->ops->alloc(w->be, &p, bytes);
    }
    return p;
}

/* The stage's backend, on its slot's device, before anything touches CUDA
 * (the coordinator never does: this is a fresh process). */
static mmp_err open_backend(worker *w)
{
    w->gpu = mmp_plan_slot_device(&w->plan, w->slot);
    if (w->gpu < 0) {
        w->be = mmp_backend_cpu();
        return MMP_OK;
    }
#ifdef MMP_HAVE_CUDA
    MMP_TRY(mmp_backend_create_cuda(&w->be, w->gpu));
    /* the device's memory in all, for the balancer's cap (StepDone) */
    void *sym = NULL;
    char name[256];
    if (mmp_cuda_module_sym("mmp_cuda_device_info", &sym) == MMP_OK) {
        mmp_err (*info)(int, char *, size_t, size_t *);
        memcpy(&info, &sym, sizeof info);
        if (info(w->gpu, name, sizeof name, &w->device_total) != MMP_OK) {
            w->device_total = 0;
        }
    }
    MMP_INFO("%s: on cuda:%d (%.1f GiB)", w->name, w->gpu, (double)w->device_total / (1 << 30));
    return MMP_OK;
#else
    return mmp_errorf(MMP_ERR_INVALID, "%s: placed on cuda:%d, but built without CUDA", w->name,
                      w->gpu);
#endif
}

void *worker_xcalloc(size_t n, size_t size, mmp_err *err)
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
        } else if (prog[i]->op == MMPIPE__OP__BWD || prog[i]->op == MMPIPE__OP__BWD_WEIGHT) {
            cur--; /* zb-h1 holds a micro-batch until its weight pass */
        }
        most = cur > most ? cur : most;
    }
    return most;
}

/* Makes prog this process's list: which micro-batches it handles (its
 * loader loads only those) and that it fits the activation slots. */
mmp_err worker_set_program(worker *w, Mmpipe__Instr **prog, size_t n)
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

/* Whether the checkpoint tensor named name is one this stage loads (a
 * parameter of its own or one of its AdamW moments, as mmp_params_load
 * reads them): the rest of the step's tensors are checked, not kept. */
static int ckpt_wants(void *params, const char *name)
{
    char base[MMP_NAME_MAX + 16];
    if (snprintf(base, sizeof base, "%s", name) >= (int)sizeof base) {
        return 0;
    }
    size_t n = strlen(base);
    int moment =
        n > 7 && (strcmp(base + n - 7, ".adam_m") == 0 || strcmp(base + n - 7, ".adam_v") == 0);
    if (moment) {
        base[n - 7] = 0;
    }
    const mmp_param *q = mmp_params_find(params, base);
    return q && (!moment || q->trainable);
}

/* What takes long to read, after the data channels are connected (a peer
 * waits for those for a bounded time, a load may take many minutes): the
 * data sets' manifests and the checkpoint to resume from, each announced to
 * the coordinator (worker_startup) with its progress. Branch stages that
 * load data open the training set; every stage opens the validation set's
 * index to know how many evaluation chunks come. */
static mmp_err load_data(worker *w)
{
    const Mmpipe__Assignment *a = w->asg;
    const mmp_plan *p = &w->plan;
    char phase[1200];
    if (w->kind != MMP_BRANCH_FUSION && w->sub == 0) {
        snprintf(phase, sizeof phase, "manifest %s", p->data.manifest);
        worker_startup(w, phase, 0, 0, "");
        MMP_TRY(mmp_dataset_open_progress(&w->train, p->data.manifest, p->data.vocab, p,
                                          worker_load_progress, w));
    }
    if (mmp_plan_evaluates(p)) { /* only then is there a validation set to read */
        snprintf(phase, sizeof phase, "manifest %s", p->data.val_manifest);
        worker_startup(w, phase, 0, 0, "");
        MMP_TRY(mmp_dataset_open_progress(&w->val, p->data.val_manifest, p->data.vocab, p,
                                          worker_load_progress, w));
    }
    if (a->resume_dir && a->resume_dir[0]) {
        snprintf(phase, sizeof phase, "checkpoint %s", a->resume_dir);
        worker_startup(w, phase, 0, 0, "");
        /* By name from every file of the step: a re-placement may have cut
         * the branch elsewhere than the processes that wrote it. */
        mmp_ckpt c = {0};
        mmp_ckpt_read_opts o = {.progress = worker_load_progress,
                                .progress_ctx = w,
                                .want = ckpt_wants,
                                .want_ctx = w->params};
        mmp_err e = mmp_ckpt_read_dir_opts(&c, a->resume_dir, &o);
        if (e == MMP_OK) {
            e = mmp_params_load(w->params, &c);
        }
        mmp_ckpt_fini(&c);
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "resume from %s", a->resume_dir);
        }
    }
    if (p->train.ckpt_async && a->replica == 0) {
        /* The background checkpoint's host copy, allocated and touched now,
         * while the stage starts: the first snapshot during training paid
         * for first touching every page of it (2.2-3.0 s for the 1.3 GB of
         * bench/ckpt_async.sh's text stage, more than a write at once). */
        worker_startup(w, "checkpoint snapshot memory", 0, 0, "");
        MMP_TRY(mmp_params_snapshot(w->params, &w->ckpt.snap));
    }
    return MMP_OK;
}

mmp_err worker_build(worker *w)
{
    const Mmpipe__Assignment *a = w->asg;
    mmp_plan *p = &w->plan;
    MMP_TRY(mmp_peer_check_assignment(a));
    MMP_TRY(mmp_plan_load(p, a->plan_path, NULL, 0));
    mmp_cpu_set_threads(p->train.threads); /* train.threads holds in every process */
    if (p->train.pin.mode != MMP_PIN_OFF && w->pin_index >= 0) {
        char cores[256];
        MMP_TRY(mmp_pin_apply(p, w->pin_index, NULL, cores, sizeof cores));
        MMP_INFO("pinned to core%s %s (train.pin)", strchr(cores, ',') ? "s" : "", cores);
    }
    if (w->nice > 0) {
        MMP_TRY(mmp_nice_self(w->nice));
        /* what the kernel now says, not what was asked (tests read it) */
        MMP_INFO("running at nice %d (train.priority: a large share of shared cores)",
                 getpriority(PRIO_PROCESS, 0));
    }
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
    w->batch_scope = w->kind == MMP_BRANCH_FUSION && p->model.fusion.itc_scope == MMP_ITC_BATCH &&
                     p->compute != MMP_COMPUTE_SIMULATED;
    /* The vocab the data sets below open too (the plan names it: data.vocab
     * or the one beside the manifest). */
    worker_startup(w, "model and data channels", 0, 0, "");
    int V;
    {
        mmp_tokenizer *tok;
        MMP_TRY(mmp_tokenizer_load(&tok, p->data.vocab));
        V = mmp_tokenizer_vocab_size(tok);
        mmp_tokenizer_destroy(tok);
    }
    MMP_TRY(open_backend(w));
    if (w->kind == MMP_BRANCH_IMAGE) {
        MMP_TRY(mmp_image_net_create_on(&w->img, w->be, p, w->first, w->last, seed));
        w->params = mmp_image_net_params(w->img);
        w->in_floats = mmp_image_net_in_floats(w->img);
        w->out_floats = mmp_image_net_out_floats(w->img);
    } else if (w->kind == MMP_BRANCH_TEXT) {
        MMP_TRY(mmp_text_net_create_on(&w->txt, w->be, p, V, w->first, w->last, seed));
        w->params = mmp_text_net_params(w->txt);
        w->in_floats = w->out_floats = mmp_text_net_out_floats(w->txt);
    } else {
        MMP_TRY(mmp_fusion_net_create_on(&w->fus, w->be, p, seed));
        w->params = mmp_fusion_net_params(w->fus);
    }
    w->n_fl = program_max_inflight(a->program, a->n_program);
    if (a->inflight_bound > w->n_fl) {
        w->n_fl = a->inflight_bound; /* room for any routing the balancer sends */
    }
    if (w->n_fl > MAX_INFLIGHT) {
        return mmp_errorf(MMP_ERR_PROTO, "program holds %d micro-batches", w->n_fl);
    }
    mmp_err err = MMP_OK;
    w->fl = worker_xcalloc((size_t)w->n_fl, sizeof *w->fl, &err);
    for (int i = 0; err == MMP_OK && i < w->n_fl; i++) {
        w->fl[i].mb = -1;
        mmp_wgrad_init(&w->fl[i].wg, w->be);
        if (w->kind == MMP_BRANCH_IMAGE) {
            err = mmp_image_acts_create((mmp_image_acts **)&w->fl[i].acts, w->img, w->mb_max);
        } else if (w->kind == MMP_BRANCH_TEXT) {
            err = mmp_text_acts_create((mmp_text_acts **)&w->fl[i].acts, w->txt, w->mb_max);
            w->fl[i].mask = worker_balloc(w, (size_t)w->mb_max * w->T * sizeof(float), &err);
        } else {
            /* batch scope: one acts for the whole batch (see worker) */
            if (!w->batch_scope || i == 0) {
                err = mmp_fusion_acts_create((mmp_fusion_acts **)&w->fl[i].acts, w->fus,
                                             w->batch_scope ? w->B : w->mb_max);
            }
        }
        w->fl[i].valid = worker_xcalloc((size_t)w->mb_max, sizeof(float), &err);
        if (w->gpu >= 0 && w->kind != MMP_BRANCH_FUSION) {
            w->fl[i].valid_dev = worker_balloc(w, (size_t)w->mb_max * sizeof(float), &err);
        }
    }
    /* staging memory (pinned on a GPU): a training batch's flags go up
     * asynchronously (worker_do_fwd), rewritten only after upload_wait */
    w->in_valid = mmp_backend_host_alloc(w->be, (size_t)w->mb_max * sizeof(float));
    if (!w->in_valid && err == MMP_OK) {
        err = mmp_errorf(MMP_ERR_NOMEM, "%zu bytes of staging memory for the valid flags",
                         (size_t)w->mb_max * sizeof(float));
    }
    w->eval_valid = worker_xcalloc((size_t)w->mb_max, 1, &err);
    size_t mbx = (size_t)w->mb_max;
    int S = p->data.image_size;
    if (w->kind == MMP_BRANCH_IMAGE && w->sub == 0) {
        w->images = worker_xcalloc(mbx * 3 * (size_t)S * S, sizeof(float), &err);
    }
    w->ids = worker_xcalloc(mbx * (size_t)w->T, sizeof(int32_t), &err);
    w->mask = worker_xcalloc(mbx * (size_t)w->T, sizeof(float), &err);
    if (w->gpu >= 0 && w->sub == 0 && w->kind != MMP_BRANCH_FUSION) {
        /* where the loaded inputs are uploaded (the CPU reads them in place) */
        w->d_images = w->kind == MMP_BRANCH_IMAGE
                          ? worker_balloc(w, mbx * 3 * (size_t)S * S * sizeof(float), &err)
                          : NULL;
        w->d_ids = w->kind == MMP_BRANCH_TEXT
                       ? worker_balloc(w, mbx * (size_t)w->T * sizeof(int32_t), &err)
                       : NULL;
    }
    w->out = worker_balloc(w, mbx * (size_t)(w->out_floats + w->T) * sizeof(float), &err);
    w->din = worker_balloc(w, mbx * (size_t)w->in_floats * sizeof(float), &err);
    if (w->kind == MMP_BRANCH_FUSION) {
        size_t img = mbx * (size_t)mmp_image_net_tokens(p) * w->D, txt = mbx * (size_t)w->T * w->D;
        w->dimg = worker_balloc(w, img * sizeof(float), &err);
        w->dtxt = worker_balloc(w, txt * sizeof(float), &err);
        w->valid_in[0] = worker_xcalloc(mbx, sizeof(float), &err);
        w->valid_in[1] = worker_xcalloc(mbx, sizeof(float), &err);
        if (w->gpu >= 0) {
            size_t emb = mbx * (size_t)mmp_fusion_embed_dim(w->fus) * sizeof(float);
            w->emb_dev[0] = worker_balloc(w, emb, &err);
            w->emb_dev[1] = worker_balloc(w, emb, &err);
        }
    }
    w->samples = worker_xcalloc(mbx, sizeof(int64_t), &err);
    if (w->kind == MMP_BRANCH_FUSION && err == MMP_OK) {
        size_t img_row = (size_t)mmp_image_net_tokens(p) * w->D;
        err =
            mmp_fuse_init(&w->fuse, w->be, w->batch_scope ? w->B : w->mb_max, img_row, w->T, w->D);
        if (err == MMP_OK && w->batch_scope) {
            err = mmp_fuse_step_init(&w->fstep, w->be, w->B, img_row, w->T, w->D);
        }
        if (err == MMP_OK && w->batch_scope && w->replicas > 1) {
            /* rows of images, texts, masks, two valid flags, and the count */
            w->gather_floats = (size_t)w->B * (img_row + w->fstep.txt_row + w->T + 2) + 1;
            w->gather = worker_xcalloc(w->gather_floats, sizeof(float), &err);
        }
    }
    w->fwd_ms = worker_xcalloc((size_t)a->microbatches, sizeof(float), &err);
    w->bwd_ms = worker_xcalloc((size_t)a->microbatches, sizeof(float), &err);
    w->wgt_ms = worker_xcalloc((size_t)a->microbatches, sizeof(float), &err);
    w->owns = worker_xcalloc((size_t)a->microbatches, 1, &err);
    if (w->kind == MMP_BRANCH_IMAGE && w->replicas > 1 && !worker_simulated(w)) {
        w->bn_row = mmp_image_net_bn_row_floats(w->img);
        w->bn_rows = worker_xcalloc((size_t)a->microbatches * (size_t)(w->bn_row ? w->bn_row : 1),
                                    sizeof(float), &err);
    }
    MMP_TRY(err);
    MMP_TRY(worker_set_program(w, a->program, a->n_program));
    MMP_TRY(open_data_plane(w));
    return load_data(w);
}

void worker_close_data_plane(worker *w)
{
    if (w->be) {
        w->be->ops->sync(w->be); /* nothing queued may still read or write a slot */
    }
    for (int i = 0; i < w->n_chans; i++) {
        mmp_channel_close(w->chans[i].ch);
        w->chans[i].ch = NULL;
    }
    if (w->uploaded) {
        worker_release_uploaded(w);
    }
    if (w->batch) {
        mmp_loader_release(w->loader, w->batch);
        w->batch = NULL;
    }
    mmp_loader_destroy(w->loader);
    w->loader = NULL;
    if (w->reduce_dev) {
        w->nccl->close(w->reduce_dev); /* before its side reduce */
        w->reduce_dev = NULL;
    }
    mmp_reduce_close(w->reduce);
    w->reduce = NULL;
}

void worker_teardown(worker *w)
{
    mmp_ckpt_bg_fini(&w->ckpt); /* a write still in flight is abandoned, no file published */
    mmp_backend *be = w->be ? w->be : mmp_backend_cpu();
    worker_close_data_plane(w);
    for (int i = 0; i < w->n_chans; i++) {
        mmp_backend_host_free(be, w->chans[i].stage_host);
        w->chans[i].stage_host = NULL;
        be->ops->free(be, w->chans[i].packed);
        be->ops->free(be, w->chans[i].wide);
        w->chans[i].packed = NULL;
        w->chans[i].wide = NULL;
    }
    for (int i = 0; w->fl && i < w->n_fl; i++) {
        if (w->kind == MMP_BRANCH_IMAGE) {
            mmp_image_acts_destroy(w->fl[i].acts);
        } else if (w->kind == MMP_BRANCH_TEXT) {
            mmp_text_acts_destroy(w->fl[i].acts);
        } else {
            mmp_fusion_acts_destroy(w->fl[i].acts);
        }
        be->ops->free(be, w->fl[i].mask);
        free(w->fl[i].valid);
        be->ops->free(be, w->fl[i].valid_dev);
        mmp_wgrad_fini(&w->fl[i].wg);
    }
    mmp_backend_host_free(be, w->reduce_host);
    w->reduce_host = NULL;
    free(w->owns);
    free(w->bn_rows);
    if (w->prog_env) {
        mmp_ctl_free(w->prog_env);
    }
    mmp_fuse_fini(&w->fuse);
    mmp_fuse_step_fini(&w->fstep);
    free(w->gather);
    w->gather = NULL;
    mmp_backend_host_free(be, w->in_valid);
    w->in_valid = NULL;
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
    free(w->valid_in[0]);
    free(w->valid_in[1]);
    be->ops->free(be, w->out);
    be->ops->free(be, w->din);
    be->ops->free(be, w->dimg);
    be->ops->free(be, w->dtxt);
    be->ops->free(be, w->d_images);
    be->ops->free(be, w->d_ids);
    be->ops->free(be, w->emb_dev[0]);
    be->ops->free(be, w->emb_dev[1]);
    free(w->samples);
    free(w->fwd_ms);
    free(w->bwd_ms);
    free(w->wgt_ms);
    mmp_backend_destroy(w->be); /* after everything of its memory; never the shared CPU one */
    w->be = NULL;
    mmp_trace_close(&w->trace);
    if (w->asg_env) {
        mmp_ctl_free(w->asg_env);
    }
    mmp_ctl_close(w->ctl);
}
