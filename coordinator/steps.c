/* A launch's assignments and its step loop: per step Start (with the fp16
 * loss scale), the gradient norm, the clip coefficient and the skip
 * decision (common/loss_scale.h), the stages' results, evaluation, the
 * balancer's turn, one metrics.jsonl line and the checkpoints. Per step,
 * never per micro-batch. */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coordinator/coord.h"
#include "common/ckpt.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/lr.h"
#include "common/metrics.h"
#include "common/progress.h"
#include "coordinator/placement.h"

/* Stage st's list as protobuf instructions: *ins (the messages) and *insp
 * (pointers to them), both for the caller to free. */
static mmp_err program_msg(const mmp_sched_stage *st, Mmpipe__Instr **ins, Mmpipe__Instr ***insp)
{
    *ins = calloc((size_t)st->n_prog + 1, sizeof **ins);
    *insp = calloc((size_t)st->n_prog + 1, sizeof **insp);
    if (!*ins || !*insp) {
        free(*ins);
        free(*insp);
        return mmp_errorf(MMP_ERR_NOMEM, "instruction list of %d", st->n_prog);
    }
    for (int k = 0; k < st->n_prog; k++) {
        mmpipe__instr__init(&(*ins)[k]);
        (*ins)[k].op = (Mmpipe__Op)st->prog[k].op;
        (*ins)[k].mb = st->prog[k].mb;
        (*ins)[k].edge = st->prog[k].edge;
        (*insp)[k] = &(*ins)[k];
    }
    return MMP_OK;
}

/* The device slot of process i (the assignment's slot): processes are dealt
 * to the plan's device slots in order. */
static int proc_slot(const coord *c, int i)
{
    int slots = mmp_plan_slots(&c->cur);
    return slots > 0 ? i % slots : 0;
}

/* The host process i runs on (an index into the plan's hosts): the host of
 * its device slot, as the launcher placed it (coordinator/procs.c). */
static int proc_host(const coord *c, int i)
{
    return mmp_plan_slot_host(&c->cur, proc_slot(c, i));
}

/* Where a process on host h listens for its tcp creator ends: the host part
 * of "host:port". One host: loopback; several: the host's address (what
 * the launcher reaches it by, so the other hosts reach it too). */
static const char *host_listen_address(const coord *c, int h)
{
    if (c->cur.n_hosts <= 1 || h < 0 || h >= c->cur.n_hosts) {
        return "127.0.0.1";
    }
    const mmp_host *host = &c->cur.hosts[h];
    const char *a = host->address[0] ? host->address : host->name;
    if (!strchr(a, ':')) {
        return a;
    }
    static char bracketed[MMP_ADDRESS_MAX + 2]; /* IPv6: [addr]:port */
    snprintf(bracketed, sizeof bracketed, "[%s]", a);
    return bracketed;
}

/* The data transport of an edge (plan key transport.data): between two
 * hosts nccl when both ends are GPU processes (device slots), tcp otherwise;
 * on one host cuda_ipc between two GPU processes (device slots, no host
 * copy), shm otherwise (a CPU end reads and writes host memory; a GPU end
 * stages through it). data: shm forces shm, data: tcp forces tcp (over
 * loopback on one host, and between GPU hosts too). */
static const char *edge_transport(const coord *c, const mmp_sched_edge *ed)
{
    /* shm across hosts is refused in coord_assign */
    return mmp_edge_transport(c->plan->transport.data,
                              proc_host(c, ed->from) != proc_host(c, ed->to),
                              mmp_plan_slot_device(&c->cur, proc_slot(c, ed->from)),
                              mmp_plan_slot_device(&c->cur, proc_slot(c, ed->to)));
}

/* A transport whose creator reports its address (Endpoints): tcp, nccl. */
static int network(const char *transport)
{
    return strcmp(transport, "tcp") == 0 || strcmp(transport, "nccl") == 0;
}

/* The process of stage st's replica 0 (the reduce's rank 0). */
static int replica0(const coord *c, const mmp_sched_stage *st)
{
    for (int j = 0; j < c->n; j++) {
        if (strcmp(c->sched.stages[j].name, st->name) == 0 && c->sched.stages[j].replica == 0) {
            return j;
        }
    }
    return -1;
}

/* The transport of stage st's replicas' reduce (mmp_reduce_transport):
 * "shm", "tcp" (forced, or spread over hosts) or "nccl" (spread over hosts,
 * every replica on a GPU of its own, a CUDA build). */
static const char *reduce_transport(const coord *c, const mmp_sched_stage *st)
{
    int r0 = replica0(c, st), cross = 0, n = 0;
    int host[MMP_SCHED_MAX_STAGES], device[MMP_SCHED_MAX_STAGES];
    for (int j = 0; j < c->n && n < MMP_SCHED_MAX_STAGES; j++) {
        if (strcmp(c->sched.stages[j].name, st->name) == 0) {
            cross |= proc_host(c, j) != proc_host(c, r0);
            host[n] = proc_host(c, j);
            device[n++] = mmp_plan_slot_device(&c->cur, proc_slot(c, j));
        }
    }
    int gpus = mmp_replicas_own_gpus(host, device, n);
#ifdef MMP_HAVE_CUDA
    int have_nccl = 1;
#else
    int have_nccl = 0;
#endif
    return mmp_reduce_transport(c->plan->transport.data, cross, gpus, have_nccl);
}

/* Whether rank 0 of stage st's replicas' reduce reports its address. */
static int reduce_over_network(const coord *c, const mmp_sched_stage *st)
{
    return st->n_replicas > 1 && network(reduce_transport(c, st));
}

/* An Endpoints message from stage `from` (its tcp creator ends listen there):
 * each address goes to the end that connects, once checked against the
 * assignment (the sender creates what it names: channel id the sending end
 * of a tcp edge, -1 rank 0 of a reduce over tcp). Returns 1 (c->failure set)
 * when one does not fit or cannot be sent. */
int coord_forward_endpoints(coord *c, int from, const Mmpipe__Endpoints *eps)
{
    const mmp_sched *s = &c->sched;
    const mmp_sched_stage *st = &s->stages[from];
    for (size_t k = 0; k < eps->n_endpoints; k++) {
        const Mmpipe__Endpoint *ep = eps->endpoints[k];
        int id = ep->channel;
        int fits = id == -1 ? st->replica == 0 && reduce_over_network(c, st)
                            : id >= 0 && id < s->n_edges && s->edges[id].from == from &&
                                  network(edge_transport(c, &s->edges[id]));
        if (!fits) {
            coord_fail(c,
                       "stage %s: endpoints field channel = %d names no tcp end it creates (%d "
                       "edges)",
                       c->procs[from].name, id, s->n_edges);
            return 1;
        }
        Mmpipe__Endpoints one = MMPIPE__ENDPOINTS__INIT;
        Mmpipe__Endpoint *p = (Mmpipe__Endpoint *)ep;
        one.n_endpoints = 1;
        one.endpoints = &p;
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_ENDPOINTS;
        env.endpoints = &one;
        for (int j = 0; j < c->n; j++) {
            int to = id >= 0 ? j == s->edges[id].to
                             : j != from && strcmp(s->stages[j].name, st->name) == 0;
            if (to && coord_send_to(c, j, &env) != MMP_OK) {
                coord_fail(c, "%s", mmp_last_error());
                return 1;
            }
        }
    }
    return 0;
}

mmp_err coord_assign(coord *c, const char *plan_json, const char *resume_dir)
{
    const mmp_sched *s = &c->sched;
    int ipc = 0, tcp = 0, nccl = 0;
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *ed = &s->edges[e];
        ipc += strcmp(edge_transport(c, ed), "cuda_ipc") == 0;
        tcp += strcmp(edge_transport(c, ed), "tcp") == 0;
        nccl += strcmp(edge_transport(c, ed), "nccl") == 0;
        if (c->plan->transport.data == MMP_DATA_SHM &&
            proc_host(c, ed->from) != proc_host(c, ed->to)) {
            return mmp_errorf(MMP_ERR_CONFIG,
                              "%s: transport.data: shm, but %s and %s are on different hosts "
                              "(auto or tcp cross hosts)",
                              c->plan->path, c->procs[ed->from].name, c->procs[ed->to].name);
        }
    }
    MMP_INFO("data channels: %d over cuda_ipc, %d over shm, %d over tcp, %d over nccl", ipc,
             s->n_edges - ipc - tcp - nccl, tcp, nccl);
    /* Each process's channels, in edge order. The arrays are sized for the
     * process with the most (2 (R_before + R_after) edges: up to a thousand
     * at MMP_MAX_REPLICAS), on the heap. */
    int *deg = calloc((size_t)c->n + 1, sizeof *deg), most = 0;
    if (!deg) {
        return mmp_errorf(MMP_ERR_NOMEM, "assignments of %d processes", c->n);
    }
    for (int e = 0; e < s->n_edges; e++) {
        deg[s->edges[e].from]++;
        deg[s->edges[e].to]++;
    }
    for (int i = 0; i < c->n; i++) {
        most = deg[i] > most ? deg[i] : most;
    }
    free(deg);
    typedef char addr_buf[MMP_ADDRESS_MAX + 16];
    typedef char peer_buf[64];
    Mmpipe__Channel *chans = malloc(((size_t)most + 1) * sizeof *chans);
    Mmpipe__Channel **chp = malloc(((size_t)most + 1) * sizeof *chp);
    addr_buf *addr = malloc(((size_t)most + 1) * sizeof *addr);
    peer_buf *peer = malloc(((size_t)most + 1) * sizeof *peer);
    mmp_err ret = MMP_OK;
    if (!chans || !chp || !addr || !peer) {
        ret = mmp_errorf(MMP_ERR_NOMEM, "assignments: %d channels a process", most);
    }
    for (int i = 0; i < c->n && ret == MMP_OK; i++) {
        const mmp_sched_stage *st = &s->stages[i];
        int nc = 0;
        for (int e = 0; e < s->n_edges; e++) {
            const mmp_sched_edge *ed = &s->edges[e];
            if (ed->from != i && ed->to != i) {
                continue;
            }
            Mmpipe__Channel *ch = &chans[nc];
            mmpipe__channel__init(ch);
            ch->id = e;
            ch->send = ed->from == i;
            ch->grad = ed->grad;
            snprintf(peer[nc], sizeof peer[nc], "%s", c->procs[ch->send ? ed->to : ed->from].name);
            ch->peer = peer[nc];
            ch->transport = (char *)edge_transport(c, ed); /* protobuf-c: char *, not written */
            if (network(ch->transport)) {
                /* the sender creates: it listens on a free port of its host
                 * and reports it (coord_forward_endpoints; nccl: with its
                 * ncclUniqueId) */
                snprintf(addr[nc], sizeof addr[nc], "%s:0",
                         host_listen_address(c, proc_host(c, ed->from)));
            } else {
                snprintf(addr[nc], sizeof addr[nc], "%s-g%d-e%d", c->shm_prefix, c->launch, e);
            }
            ch->address = addr[nc];
            ch->slots = ed->slots;
            ch->creator = ch->send; /* the sender creates and sizes the ring */
            chp[nc] = ch;
            nc++;
        }
        Mmpipe__Instr *ins, **insp;
        ret = program_msg(st, &ins, &insp);
        if (ret != MMP_OK) {
            break;
        }
        Mmpipe__Assignment a = MMPIPE__ASSIGNMENT__INIT;
        static const char *const kind_names[] = {"image", "text", "fusion"};
        static_assert(MMP_KIND_IMAGE == (int)MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE &&
                          MMP_KIND_TEXT == (int)MMPIPE__STAGE_KIND__STAGE_KIND_TEXT &&
                          MMP_KIND_FUSION == (int)MMPIPE__STAGE_KIND__STAGE_KIND_FUSION,
                      "schedule kinds are the wire's stage kinds");
        char ckpt_file[80];
        /* One checkpoint file per process; a branch cut into sub-stages
         * names them image.0.ckpt ..., a whole branch image.ckpt, so a
         * pipeline's checkpoint reads like the single-process one. */
        if (st->n_sub > 1) {
            snprintf(ckpt_file, sizeof ckpt_file, "%s.ckpt", st->name);
        } else {
            snprintf(ckpt_file, sizeof ckpt_file, "%s.ckpt", kind_names[st->kind]);
        }
        char reduce[MMP_ADDRESS_MAX + 64];
        if (reduce_over_network(c, st)) {
            /* rank 0 listens and reports its port, as a tcp channel's
             * creator; "#nccl": and its ncclUniqueId (transport/reduce_nccl.h) */
            snprintf(reduce, sizeof reduce, "%s:0%s",
                     host_listen_address(c, proc_host(c, replica0(c, st))),
                     strcmp(reduce_transport(c, st), "nccl") == 0 ? "#nccl" : "");
        } else {
            snprintf(reduce, sizeof reduce, "%s-g%d-r-%s", c->shm_prefix, c->launch, st->name);
        }
        a.name = c->procs[i].name;
        a.kind = (Mmpipe__StageKind)st->kind;
        a.sub = st->sub;
        a.replica = st->replica;
        a.replicas = st->n_replicas;
        a.reduce_address = reduce;
        a.slot = proc_slot(c, i);
        a.inflight_bound = st->stage_bound;
        a.layer_first = st->layer_first;
        a.layer_last = st->layer_last;
        a.plan_path = (char *)plan_json;
        a.run_dir = (char *)c->out_dir;
        a.n_channels = (size_t)nc;
        a.channels = chp;
        a.n_program = (size_t)st->n_prog;
        a.program = insp;
        a.microbatches = s->microbatches;
        a.ckpt_file = ckpt_file;
        a.resume_dir = (char *)(resume_dir ? resume_dir : "");
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_ASSIGNMENT;
        env.assignment = &a;
        ret = coord_send_to(c, i, &env);
        free(ins);
        free(insp);
    }
    free(chans);
    free(chp);
    free(addr);
    free(peer);
    return ret;
}

static const Mmpipe__StepDone *done_of(const coord *c, int i)
{
    return c->procs[i].done->step_done;
}

/* The step's metrics.jsonl line (common/metrics.h), from the stages'
 * reports. Returns 1 (c->failure set) when it cannot be written. */
/* coord_cpu_ms: the coordinator's own CPU time over the step (from the end
 * of the previous step's record to this one's). */
/* The step's line, without evaluation: it is written before the step's
 * checkpoint (what resume keeps), the evaluation comes after both. */
int coord_write_metrics(coord *c, int step, double step_ms, double grad_norm, double coord_cpu_ms)
{
    const mmp_plan *p = c->plan;
    static mmp_metrics_step line;
    static char restarts[MMP_RESTART_FIELD_MAX];
    mmp_metrics_step_clear(&line);
    double idle = 0, wall = 0;
    line.step = step + 1;
    line.loss = line.itc_loss = line.itm_loss = line.data_ms = 0;
    line.skipped_samples = 0;
    for (int i = 0; i < c->n; i++) {
        if (!c->procs[i].have_done) {
            continue; /* a lost replica's, never sent (coord_keep_held) */
        }
        const Mmpipe__StepDone *d = done_of(c, i);
        if (c->sched.stages[i].kind == MMP_KIND_FUSION) {
            /* Each fusion replica sums its micro-batches' losses, already
             * divided by the global batch: the step's loss is their sum. */
            line.loss += d->loss;
            line.itc_loss += d->itc;
            line.itm_loss += d->itm;
            line.skipped_samples += d->skipped;
        }
        idle += d->idle_ms;
        wall += d->wall_ms;
        line.data_ms = fmax(line.data_ms, d->data_ms);
    }
    line.lr = mmp_lr_at(p, step);
    line.grad_norm = grad_norm;
    line.samples_per_s = p->train.batch / (step_ms / 1e3);
    line.step_ms = step_ms;
    line.bubble = wall > 0 ? idle / wall : 0;
    line.loss_scale = c->ls.scale;
    line.step_skipped = c->step_skipped;
    line.chained = c->step_chained;
    line.cpu_ms = coord_cpu_ms;
    line.has_stages = 1;
    line.n_stages = 0;
    for (int i = 0; i < c->n && line.n_stages < MMP_METRICS_MAX_STAGES; i++) {
        if (!c->procs[i].have_done) {
            continue;
        }
        const Mmpipe__StepDone *d = done_of(c, i);
        mmp_metrics_stage *st = &line.stages[line.n_stages++];
        double fwd = 0, bwd = 0, wgt = 0;
        for (size_t k = 0; k < d->n_mbs; k++) {
            fwd += d->mbs[k]->fwd_ms;
            bwd += d->mbs[k]->bwd_ms;
            wgt += d->mbs[k]->wgt_ms;
        }
        double n_mb = d->n_mbs ? (double)d->n_mbs : 1;
        snprintf(st->name, sizeof st->name, "%s", c->sched.stages[i].name);
        st->replica = c->sched.stages[i].replica;
        st->microbatches = (int)d->n_mbs;
        st->busy_ms = d->busy_ms;
        st->idle_ms = d->idle_ms;
        st->wall_ms = d->wall_ms;
        st->data_wait_ms = d->data_ms;
        st->fwd_ms = fwd / n_mb;
        st->bwd_ms = bwd / n_mb;
        st->wgt_ms = wgt > 0 ? wgt / n_mb : NAN; /* zb-h1's split backward only */
        st->load_ms = d->data_ms / n_mb;
        st->max_inflight = d->max_inflight;
        st->peak_mem_bytes = (double)d->peak_mem_bytes;
        st->state_bytes = d->state_bytes > 0 ? (double)d->state_bytes : NAN;
        st->act_slots = d->act_slots > 0 ? d->act_slots : -1;
        st->cpu_ms = d->cpu_ms;
        line.cpu_ms += d->cpu_ms;
    }
    line.has_balance = 1;
    line.efficiency = c->bal.efficiency;
    mmp_placement_str(&c->sched, line.placement, sizeof line.placement);
    line.decision = c->decision[0] ? c->decision : NULL;
    line.restarts = mmp_restart_field(&c->restarts, step + 1, restarts, sizeof restarts);
    if (mmp_metrics_same_file(c->metrics, c->out_dir) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    /* (an append stream's position is the end once it has written) */
    if (fseeko(c->metrics, 0, SEEK_END) != 0 || (c->line_at = ftello(c->metrics)) < 0 ||
        mmp_metrics_write(c->metrics, &line) != MMP_OK) {
        coord_fail(c, "%s: %s", c->out_dir, mmp_last_error()); /* RUN: metrics.jsonl: why */
        return 1;
    }
    return 0;
}

/* The recall of the step's evaluation (c->eval_*) into its line, the last
 * of metrics.jsonl, which starts at c->line_at. */
static int add_eval(coord *c)
{
    if (mmp_metrics_same_file(c->metrics, c->out_dir) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    if (mmp_metrics_add_eval(c->metrics, c->line_at, c->eval_i2t, c->eval_t2i) != MMP_OK) {
        coord_fail(c, "%s: %s", c->out_dir, mmp_last_error());
        return 1;
    }
    return 0;
}

/* Evaluates the model as of `done` steps (every stage, EvalRequest): its
 * recall into c->eval_*. 0, or 1 after coord_fail. */
static int evaluate(coord *c, int done)
{
    c->have_eval = 0;
    Mmpipe__Envelope eenv = MMPIPE__ENVELOPE__INIT;
    Mmpipe__EvalRequest er = MMPIPE__EVAL_REQUEST__INIT;
    er.step = done - 1;
    eenv.body_case = MMPIPE__ENVELOPE__BODY_EVAL_REQUEST;
    eenv.eval_request = &er;
    /* no time limit of its own: a large validation set takes what it takes;
     * the stages talk after every chunk, so the watchdog
     * (train.stall_timeout) still names a stalled one */
    return coord_broadcast(c, &eenv) != MMP_OK ||
           coord_wait_until(c, coord_got_eval, NULL, 0, "evaluation");
}

/* A launch from a step whose evaluation was due but is not in its line (a
 * stage died or the run was stopped during it; the step's checkpoint came
 * first): that evaluation now, its recall into the line. 0, or 1. */
static int evaluate_resumed(coord *c, int first_step)
{
    if (first_step <= 0 || !mmp_plan_eval_due(c->plan, first_step)) {
        return 0;
    }
    off_t at = -1;
    if (mmp_metrics_eval_pending(c->metrics, first_step, &at) != MMP_OK) {
        coord_fail(c, "%s/metrics.jsonl: %s", c->out_dir, mmp_last_error());
        return 1;
    }
    if (at < 0) {
        return 0;
    }
    MMP_INFO("step %d: its evaluation was cut short; evaluating it now", first_step);
    c->line_at = at;
    if (evaluate(c, first_step) || add_eval(c)) {
        return 1;
    }
    MMP_INFO("step %d: val recall@1 image->text %.3f, text->image %.3f", first_step,
             (double)c->eval_i2t, (double)c->eval_t2i);
    return 0;
}

void coord_ckpt_publish(coord *c)
{
    while (c->ckpt_pending >= 0 && !c->failure[0]) {
        int step = c->ckpt_pending;
        for (int i = 0; i < c->n; i++) {
            if (c->procs[i].ckpt_written <= step) {
                return; /* its file of step is not on disk yet */
            }
        }
        /* latest moves only after every stage wrote its file. */
        char dir[1100];
        mmp_ckpt_step_dir(dir, sizeof dir, c->out_dir, step);
        if (mmp_ckpt_write_meta_scaled(dir, step, c->plan, &c->ckpt_pending_ls) != MMP_OK ||
            mmp_ckpt_mark_latest(c->out_dir, step) != MMP_OK ||
            mmp_ckpt_prune(c->out_dir, step, c->plan->train.ckpt_keep) != MMP_OK) {
            coord_fail(c, "checkpoint: %s", mmp_last_error());
            return;
        }
        mmp_trace_instant(&c->trace, "checkpoint", mmp_trace_now_us(), dir);
        c->ckpt_step = step;
        c->ckpt_pending = c->ckpt_req > step ? c->ckpt_req : -1;
        c->ckpt_pending_ls = c->ckpt_req_ls;
    }
}

/* Waits until every stage's file of the checkpoint asked for (step) is on
 * disk, and coord_ckpt_publish, run by the last acknowledgement, published
 * it. */
static int wait_published(coord *c, int step)
{
    if (coord_wait_until(c, coord_all_flag, ALL(have_on_disk), 600, "checkpoint files")) {
        return 1;
    }
    if (c->ckpt_step != step) {
        coord_fail(c,
                   "checkpoint of step %d: every stage wrote its file, but it was not "
                   "published",
                   step);
        return 1;
    }
    return 0;
}

int coord_writer_of(const coord *c, int i)
{
    int w = -1;
    for (int j = 0; j < c->n; j++) {
        if (c->procs[j].alive && strcmp(c->sched.stages[j].name, c->sched.stages[i].name) == 0 &&
            (w < 0 || c->sched.stages[j].replica < w)) {
            w = c->sched.stages[j].replica;
        }
    }
    return w;
}

int coord_checkpoint(coord *c, int steps_done, int background)
{
    if (c->ckpt_req == steps_done && !background) {
        return wait_published(c, steps_done); /* asked in the background; a stop came since */
    }
    char dir[1100];
    if (mmp_ckpt_step_begin(c->out_dir, steps_done, dir, sizeof dir) != MMP_OK) {
        coord_fail(c, "checkpoint: %s", mmp_last_error());
        return 1;
    }
    for (int i = 0; i < c->n; i++) {
        c->procs[i].have_ack = c->procs[i].have_on_disk = 0;
    }
    c->ckpt_req = steps_done;
    c->ckpt_req_ls = c->ls;
    if (c->ckpt_pending < 0) {
        c->ckpt_pending = steps_done;
        c->ckpt_pending_ls = c->ls;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__CheckpointRequest r = MMPIPE__CHECKPOINT_REQUEST__INIT;
    r.step = steps_done;
    r.dir = dir;
    r.background = background;
    env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST;
    env.checkpoint_request = &r;
    for (int i = 0; i < c->n; i++) {
        proc *p = &c->procs[i];
        if (!p->alive) {
            /* a lost replica (coord_keep_held): another of its stage writes */
            p->have_ack = p->have_on_disk = 1;
            p->ckpt_written = steps_done + 1;
            continue;
        }
        r.writer = coord_writer_of(c, i);
        if (coord_send_to(c, i, &env) != MMP_OK) {
            return 1;
        }
    }
    if (background) {
        if (coord_wait_until(c, coord_all_flag, ALL(have_ack), 600, "checkpoint snapshots")) {
            return 1;
        }
        mmp_trace_instant(&c->trace, "checkpoint snapshot", mmp_trace_now_us(), dir);
        return 0;
    }
    return wait_published(c, steps_done);
}

/* Sends every process its list under the routing c->speed, from step on. */
/* Whether process i's list differs between schedules a and b. */
static int list_changed(const mmp_sched *a, const mmp_sched *b, int i)
{
    const mmp_sched_stage *x = &a->stages[i], *y = &b->stages[i];
    if (x->n_prog != y->n_prog) {
        return 1;
    }
    for (int k = 0; k < x->n_prog; k++) {
        if (x->prog[k].op != y->prog[k].op || x->prog[k].mb != y->prog[k].mb ||
            x->prog[k].edge != y->prog[k].edge) {
            return 1;
        }
    }
    return 0;
}

/* Compiles the routing for c->speed and sends each process whose list
 * changed its new list (a Program makes a stage drop its prefetched
 * batches: with few micro-batches most speed changes deal them as before,
 * and then nothing is sent). *sent: how many processes got one. */
static int reroute(coord *c, int step, int *sent)
{
    mmp_sched next;
    *sent = 0;
    if (mmp_sched_compile_routed(&next, &c->cur, c->speed) != MMP_OK) {
        coord_fail(c, "re-routing: %s", mmp_last_error());
        mmp_sched_fini(&next);
        return 1;
    }
    for (int i = 0; i < c->n; i++) {
        const mmp_sched_stage *st = &next.stages[i];
        if (c->sched.n_stages == next.n_stages && !list_changed(&c->sched, &next, i)) {
            continue;
        }
        (*sent)++;
        Mmpipe__Instr *ins, **insp;
        if (program_msg(st, &ins, &insp) != MMP_OK) {
            coord_fail(c, "re-routing: %s", mmp_last_error());
            mmp_sched_fini(&next);
            return 1;
        }
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Program pr = MMPIPE__PROGRAM__INIT;
        pr.first_step = step;
        pr.n_program = (size_t)st->n_prog;
        pr.program = insp;
        env.body_case = MMPIPE__ENVELOPE__BODY_PROGRAM;
        env.program = &pr;
        mmp_err e = coord_send_to(c, i, &env);
        free(ins);
        free(insp);
        if (e != MMP_OK) {
            mmp_sched_fini(&next);
            return 1;
        }
    }
    mmp_sched_fini(&c->sched);
    c->sched = next;
    c->bal.sched = &c->sched;
    mmp_balancer_routed(&c->bal, c->speed);
    return 0;
}

/* The balancer's turn after step `done`: feeds it the step's reports, and
 * re-routes now or asks for a re-placement (c->replan). Fills c->decision. */
static int balance(coord *c, int done, double step_ms)
{
    mmp_bal_proc bp[MMP_SCHED_MAX_STAGES];
    for (int i = 0; i < c->n; i++) {
        const Mmpipe__StepDone *d = done_of(c, i);
        bp[i] = (mmp_bal_proc){.busy_ms = d->busy_ms,
                               .cpu_ms = d->cpu_ms,
                               .peak_mem_bytes = (double)d->peak_mem_bytes,
                               .state_bytes = (double)d->state_bytes,
                               .act_slots = d->act_slots,
                               .device_total_bytes = (double)d->device_total_bytes};
        for (size_t k = 0; k < d->n_mbs; k++) {
            bp[i].fwd_ms += d->mbs[k]->fwd_ms;
            bp[i].bwd_ms += d->mbs[k]->bwd_ms;
            bp[i].samples += mmp_plan_mb_size(c->plan, d->mbs[k]->mb);
        }
    }
    mmp_balancer_observe(&c->bal, bp, step_ms);
    c->decision[0] = 0;
    char why[1024], esc[1100];
    double gain;
    int go = 0;
    if (done < c->plan->job.steps &&
        mmp_balancer_replan(&c->bal, done, &c->next, &go, why, sizeof why, &gain) != MMP_OK) {
        coord_fail(c, "balancer: %s", mmp_last_error());
        return 1;
    }
    if (go) {
        mmp_sched probe;
        mmp_err e = mmp_sched_compile(&probe, &c->next);
        char to[1024] = "";
        if (e == MMP_OK) {
            mmp_placement_str(&probe, to, sizeof to);
        }
        mmp_sched_fini(&probe);
        if (e != MMP_OK) {
            coord_fail(c, "balancer: the new placement does not compile: %s", mmp_last_error());
            return 1;
        }
        char g[32];
        snprintf(g, sizeof g, isfinite(gain) ? "%.4f" : "null", gain);
        snprintf(c->decision, sizeof c->decision,
                 "{\"action\":\"replace\",\"to\":\"%s\",\"predicted_gain\":%s,\"reason\":\"%s\"}",
                 to, g, mmp_json_escape(why, esc, sizeof esc));
        MMP_INFO("balancer: after step %d, re-placing to %s: %s", done, to, why);
        mmp_trace_instant(&c->trace, "re-place", mmp_trace_now_us(), to);
        c->replan = 1;
        memcpy(c->nice, c->bal.next_nice, sizeof c->nice);
        return 0;
    }
    double speed[MMP_SCHED_MAX_STAGES];
    if (done < c->plan->job.steps && mmp_balancer_route(&c->bal, speed, why, sizeof why)) {
        memcpy(c->speed, speed, sizeof speed);
        int sent = 0;
        if (reroute(c, done, &sent)) {
            return 1;
        }
        if (!sent) {
            return 0; /* the same micro-batches to the same replicas */
        }
        snprintf(c->decision, sizeof c->decision, "{\"action\":\"route\",\"reason\":\"%s\"}",
                 mmp_json_escape(why, esc, sizeof esc));
        MMP_INFO("balancer: after step %d, routing by %s", done, why);
        mmp_trace_instant(&c->trace, "re-route", mmp_trace_now_us(), why);
    }
    return 0;
}

/* Whether step `step`'s Start can follow its predecessor's Clip at once
 * (a chained step): nothing the coordinator does after step - 1 needs the
 * stages between steps (evaluation, checkpoint, a balancer decision, a
 * graceful stop). The stages then go from one step's optimizer straight
 * into the next step's first forward, without waiting a round trip for the
 * Start while the coordinator reads the step's results and writes its
 * metrics; messages of one socket arrive in order, so a stage reads the
 * Start only after the Clip, and the coordinator files a norm of the
 * chained step that comes before the results of this one (control_loop.c). */
static int can_chain(const coord *c, int step)
{
    const mmp_plan *p = c->plan;
    int done = step; /* steps done when `step` would start */
    return step < p->job.steps && !mmp_plan_eval_due(p, done) &&
           !(p->train.ckpt_every > 0 && done % p->train.ckpt_every == 0) &&
           !mmp_balancer_may_act(&c->bal, done) && !c->replan && !mmp_interrupt_signal();
}

static mmp_err send_start(coord *c, int step)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Start st = MMPIPE__START__INIT;
    st.first_step = step;
    st.steps = 1;
    st.loss_scale = c->ls.scale;
    env.body_case = MMPIPE__ENVELOPE__BODY_START;
    env.start = &st;
    c->stepping = 1;
    for (int i = 0; i < c->n; i++) {
        MMP_TRY(coord_send_to(c, i, &env));
        c->procs[i].in_step++;
    }
    return MMP_OK;
}

/* Runs steps from first_step; returns 0 at the end, when the balancer asks
 * for a re-placement (c->replan, after checkpointing) or when a signal asked
 * to stop (c->stopped, after finishing the step in flight and checkpointing
 * it), 1 on a failure. */
int coord_run_steps(coord *c, int first_step)
{
    const mmp_plan *p = c->plan;
    mmp_progress progress;
    mmp_progress_init(&progress, first_step, p->job.steps, 10);
    c->in_steps = 1;
    double cpu_prev = mmp_metrics_cpu_ms();
    double t_done = 0; /* when the last step's results were all in */
    c->ahead = 0;
    if (!mmp_interrupt_signal() && evaluate_resumed(c, first_step)) {
        c->in_steps = 0;
        return 1;
    }
    for (int step = first_step; step < p->job.steps; step++) {
        if (step == first_step && mmp_interrupt_signal()) {
            c->stopped = 1; /* nothing trained since the state this launch started from */
            break;
        }
        /* A chained step started while the last one's results came in:
         * its time runs from then (step times add up to the wall time). */
        int chained = c->ahead;
        c->step_chained = chained;
        double t0 = chained ? t_done : mmp_now();
        c->cur_step = step;
        c->ahead = 0;
        for (int i = 0; i < c->n; i++) {
            proc *q = &c->procs[i];
            q->have_done = 0;
            q->have_norm = q->have_next_norm;
            q->norm_seq = q->next_norm_seq;
            q->sumsq = q->next_sumsq;
            q->have_next_norm = 0;
        }
        /* Replicas hold the same reduced gradients (transport/reduce.h):
         * the first of a stage's replicas to send its norm gives the
         * stage's, and the clip goes out without waiting for the others
         * (the last replica to finish the reduce is usually the first with
         * the sum; the others still copy it out). Their norms come before
         * their step results. */
        if ((!chained && send_start(c, step) != MMP_OK) ||
            coord_wait_until(c, coord_stage_norms, NULL, 0, "gradient norms")) {
            break;
        }
        /* Sum in stage order (image, text, fusion), as the single process
         * does: one replica per stage. */
        double sumsq = 0;
        for (int i = 0; i < c->n; i++) {
            if (c->sched.stages[i].replica == 0) {
                sumsq += c->procs[coord_stage_norm(c, i)].sumsq;
            }
        }
        double norm = sqrt(sumsq);
        c->step_t0 = t0;
        c->step_norm = norm;
        c->cpu_prev = cpu_prev;
        /* fp16: an inf/nan anywhere skips the step on every stage and halves
         * the scale (the single process decides the same: stages/single.c) */
        float used = c->ls.scale;
        c->step_skipped = mmp_loss_scale_update(&c->ls, p, sumsq);
        if (!c->step_skipped && !isfinite(norm)) {
            coord_fail(c, "step %d: gradient norm is not finite", step + 1);
            break;
        }
        if (c->step_skipped) {
            mmp_progress_end(&progress);
            MMP_INFO("step %d: fp16 gradient overflow: optimizer step skipped on every stage, "
                     "loss scale %g -> %g",
                     step + 1, (double)used, (double)c->ls.scale);
        }
        Mmpipe__Envelope cenv = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Clip clip = MMPIPE__CLIP__INIT;
        clip.step = step;
        clip.coef = c->step_skipped ? 0.0f : mmp_clip_coef(p, norm);
        clip.skip = c->step_skipped;
        clip.opt_step = mmp_loss_scale_opt_step(&c->ls, step);
        cenv.body_case = MMPIPE__ENVELOPE__BODY_CLIP;
        cenv.clip = &clip;
        if (coord_broadcast(c, &cenv) != MMP_OK) {
            break;
        }
        if (can_chain(c, step + 1)) {
            if (send_start(c, step + 1) != MMP_OK) {
                break;
            }
            c->ahead = 1;
        }
        if (coord_wait_until(c, coord_all_flag, ALL(have_done), 0, "step results")) {
            break;
        }
        t_done = mmp_now();
        double step_ms = (t_done - t0) * 1e3;
        int done = step + 1;
        int eval = mmp_plan_eval_due(p, done);
        if (balance(c, done, step_ms)) {
            break;
        }
        if (c->ahead && (c->replan || c->decision[0])) {
            /* can_chain asked mmp_balancer_may_act, which must agree */
            coord_fail(c, "balancer acted after step %d, whose successor had started", done);
            break;
        }
        /* The step's line and checkpoint come before its evaluation: a
         * validation sample that fails (its stage stops on it) must not take
         * the finished step with it; the line gets the recall after. */
        double cpu_now = mmp_metrics_cpu_ms();
        if (coord_write_metrics(c, step, step_ms, norm, cpu_now - cpu_prev)) {
            break;
        }
        cpu_prev = cpu_now;
        c->steps_done = done; /* its line is written: a fault from here on comes after it */
        if ((p->train.ckpt_every > 0 && done % p->train.ckpt_every == 0) || done == p->job.steps ||
            c->replan) {
            /* in the background unless the run (or this launch) ends here */
            int background =
                p->train.ckpt_async && done < p->job.steps && !c->replan && !mmp_interrupt_signal();
            if (coord_checkpoint(c, done, background)) {
                break;
            }
        }
        if (eval && (evaluate(c, done) || add_eval(c))) {
            break;
        }
        if (eval) {
            mmp_progress_end(&progress);
            MMP_INFO("step %d: val recall@1 image->text %.3f, text->image %.3f", done,
                     (double)c->eval_i2t, (double)c->eval_t2i);
        }
        double lsum = 0;
        for (int i = 0; i < c->n; i++) {
            if (c->sched.stages[i].kind == MMP_KIND_FUSION) {
                lsum += done_of(c, i)->loss;
            }
        }
        char text[256];
        double sps = p->train.batch / (step_ms / 1e3);
        snprintf(text, sizeof text, "loss %.4f  %.*f samples/s  efficiency %.2f", lsum,
                 sps < 10 ? 2 : 0, sps, c->bal.efficiency);
        mmp_progress_update(&progress, done, text);
        if (c->replan) {
            c->replan_step = done;
            break;
        }
        if (mmp_interrupt_signal() && done < p->job.steps && !c->ahead) {
            mmp_progress_end(&progress);
            MMP_INFO("%s: step %d finished; checkpointing and stopping (a second signal stops "
                     "at once)",
                     strsignal(mmp_interrupt_signal()), done);
            if (c->ckpt_step != done && coord_checkpoint(c, done, 0)) {
                break;
            }
            c->stopped = 1;
            break;
        }
    }
    c->in_steps = 0;
    mmp_progress_end(&progress);
    if (!c->failure[0] && c->steps_done == p->job.steps && c->restarts.n > 0) {
        /* a restart after the last step's line (during the final evaluation
         * or its checkpoint) has no later line to ride on: it goes on the last */
        static char field[MMP_RESTART_FIELD_MAX];
        const char *t = mmp_restart_field(&c->restarts, p->job.steps, field, sizeof field);
        if (t && (mmp_metrics_same_file(c->metrics, c->out_dir) != MMP_OK ||
                  mmp_metrics_add_restarts(c->metrics, t) != MMP_OK)) {
            coord_fail(c, "%s: %s", c->out_dir, mmp_last_error());
        }
    }
    return c->failure[0] ? 1 : 0;
}
