/* Cost estimates for the simulator and the planner (coordinator/costs.h). */
#include "coordinator/costs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/stats.h"
#include "coordinator/placement.h"

void mmp_costs_nominal(const mmp_plan *p, const mmp_sched *s, mmp_sim_costs *c)
{
    memset(c, 0, sizeof *c);
    double samples = (double)p->train.batch / p->train.microbatches;
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        int layers =
            g->kind == MMP_KIND_FUSION ? p->model.fusion.layers : g->layer_last - g->layer_first;
        if (p->compute == MMP_COMPUTE_SIMULATED) {
            /* the plan's own costs, on the slot the coordinator gives process st */
            int slots = mmp_plan_slots(p), slot = slots > 0 ? st % slots : 0;
            int n = mmp_plan_mb_size(p, 0);
            c->fwd_ms[st] = mmp_plan_sim_ms(p, (mmp_branch)g->kind, g->layer_first, g->layer_last,
                                            n, 0, 0, slot);
            c->bwd_ms[st] = mmp_plan_sim_ms(p, (mmp_branch)g->kind, g->layer_first, g->layer_last,
                                            n, 0, 1, slot);
            continue;
        }
        c->fwd_ms[st] = MMP_COSTS_NOMINAL_FWD_MS * layers * samples;
        c->bwd_ms[st] = 2 * c->fwd_ms[st];
    }
}

/* ---- measured ----------------------------------------------------------------------- */

/* Per-step values of every process's fwd, bwd, load, zb-h1 weight pass (0
 * when fused) and of the step time. */
typedef struct measured {
    int cap, n; /* records: room for, and read */
    double *fwd[MMP_SCHED_MAX_STAGES], *bwd[MMP_SCHED_MAX_STAGES], *load[MMP_SCHED_MAX_STAGES];
    double *wgt[MMP_SCHED_MAX_STAGES];
    double *step;
    double mem[MMP_SCHED_MAX_STAGES];   /* the most peak_mem_bytes any record gave */
    double state[MMP_SCHED_MAX_STAGES]; /* that record's state_bytes (0: none) */
    int slots[MMP_SCHED_MAX_STAGES];    /* and act_slots (0: none) */
    int mbs[MMP_SCHED_MAX_STAGES];      /* micro-batches each had in the last step (0: none) */
} measured;

static void measured_fini(measured *m)
{
    for (int i = 0; i < MMP_SCHED_MAX_STAGES; i++) {
        free(m->fwd[i]);
        free(m->bwd[i]);
        free(m->load[i]);
        free(m->wgt[i]);
    }
    free(m->step);
    memset(m, 0, sizeof *m);
}

static mmp_err measured_init(measured *m, int n_stages, int cap)
{
    memset(m, 0, sizeof *m);
    m->cap = cap > 0 ? cap : 1;
    m->step = malloc((size_t)m->cap * sizeof *m->step);
    int ok = m->step != NULL;
    for (int st = 0; st < n_stages; st++) {
        m->fwd[st] = malloc((size_t)m->cap * sizeof *m->fwd[st]);
        m->bwd[st] = malloc((size_t)m->cap * sizeof *m->bwd[st]);
        m->load[st] = malloc((size_t)m->cap * sizeof *m->load[st]);
        m->wgt[st] = malloc((size_t)m->cap * sizeof *m->wgt[st]);
        ok &= m->fwd[st] && m->bwd[st] && m->load[st] && m->wgt[st];
    }
    return ok ? MMP_OK : mmp_errorf(MMP_ERR_NOMEM, "costs: %d step records", cap);
}

/* One step record of the simulated placement into m's next slot. */
static mmp_err take_record(const mmp_sched *s, const mmp_metrics_step *rec, const char *where,
                           measured *m)
{
    if (isnan(rec->step_ms)) {
        return mmp_errorf(MMP_ERR_DATA, "%s: no step_ms number", where);
    }
    if (rec->n_stages == 1 && strcmp(rec->stages[0].name, "single") == 0) {
        return mmp_errorf(MMP_ERR_DATA,
                          "%s: a --single-process run's step: it measures no stage of its own "
                          "(costs come from a pipeline run of the plan)",
                          where);
    }
    MMP_ASSERT(m->n < m->cap);
    int k = m->n;
    m->step[k] = rec->step_ms;
    double sum[4][MMP_SCHED_MAX_STAGES] = {{0}};
    int count[MMP_SCHED_MAX_STAGES] = {0};
    for (int e = 0; e < rec->n_stages; e++) {
        const mmp_metrics_stage *g = &rec->stages[e];
        int replica = g->replica < 0 ? 0 : g->replica, st = -1;
        for (int i = 0; i < s->n_stages; i++) {
            if (strcmp(s->stages[i].name, g->name) == 0 && s->stages[i].replica == replica) {
                st = i;
            }
        }
        if (st < 0) {
            continue; /* a process this placement does not have */
        }
        if (isnan(g->fwd_ms) || isnan(g->bwd_ms)) {
            return mmp_errorf(MMP_ERR_DATA, "%s: stage %s: %s is missing", where, g->name,
                              isnan(g->fwd_ms) ? "fwd_ms" : "bwd_ms");
        }
        sum[0][st] += g->fwd_ms;
        sum[1][st] += g->bwd_ms;
        m->mbs[st] = g->microbatches > 0 ? g->microbatches : 0;
        sum[2][st] += isnan(g->load_ms) ? 0 : g->load_ms;
        sum[3][st] += isnan(g->wgt_ms) ? 0 : g->wgt_ms;
        if (!isnan(g->peak_mem_bytes) && g->peak_mem_bytes > m->mem[st]) {
            m->mem[st] = g->peak_mem_bytes;
            m->state[st] = isnan(g->state_bytes) ? 0 : g->state_bytes;
            m->slots[st] = g->act_slots > 0 ? g->act_slots : 0;
        }
        count[st]++;
    }
    for (int st = 0; st < s->n_stages; st++) {
        /* a replica without its own entry: its stage's other replicas */
        for (int r = 0; !count[st] && r < s->n_stages; r++) {
            if (count[r] && strcmp(s->stages[r].name, s->stages[st].name) == 0) {
                for (int i = 0; i < 4; i++) {
                    sum[i][st] = sum[i][r];
                }
                count[st] = count[r];
            }
        }
        if (!count[st]) {
            return mmp_errorf(MMP_ERR_DATA,
                              "%s: no stage \"%s\" in this step's stages (the plan has it; were "
                              "the costs measured with another placement?)",
                              where, s->stages[st].name);
        }
        m->fwd[st][k] = sum[0][st] / count[st];
        m->bwd[st][k] = sum[1][st] / count[st];
        m->load[st][k] = sum[2][st] / count[st];
        m->wgt[st][k] = sum[3][st] / count[st];
    }
    m->n++;
    return MMP_OK;
}

/* Replicas the balancer routed unevenly (metrics' per-process micro-batch
 * counts of the last step, e.g. 32:16 to a fast and a slow replica) are
 * simulated so: *s compiled again with those counts as routing speeds,
 * which mmp_sched_route deals back out in the same proportion. Nothing to
 * do where every replica of a stage had as many as the others. */
static mmp_err route_as_measured(mmp_plan *plan, mmp_sched *s, const measured *m,
                                 mmp_costs_run *info)
{
    double speed[MMP_SCHED_MAX_STAGES];
    int uneven = 0;
    for (int i = 0; i < s->n_stages; i++) {
        const mmp_sched_stage *g = &s->stages[i];
        int first = i - g->replica; /* the stage's replica 0 */
        if (m->mbs[i] <= 0 || (g->n_replicas > 1 && m->mbs[first] <= 0)) {
            return MMP_OK; /* a process without its count: the plan's own deal */
        }
        speed[i] = m->mbs[i];
        uneven |= g->n_replicas > 1 && m->mbs[i] != m->mbs[first];
    }
    if (!uneven) {
        return MMP_OK;
    }
    int len = 0;
    for (int i = 0; i < s->n_stages; i++) {
        const mmp_sched_stage *g = &s->stages[i];
        if (g->n_replicas > 1 && len < (int)sizeof info->routing - 40) {
            len += snprintf(info->routing + len, sizeof info->routing - (size_t)len, "%s%s/%d %d",
                            len ? ", " : "", g->name, g->replica, m->mbs[i]);
        }
    }
    mmp_sched_fini(s);
    return mmp_sched_compile_routed(s, plan, speed);
}

/* The median after the first value (a launch's warm-up step) when there are two or more. */
static double steady_median(double *v, int n)
{
    return mmp_median(v + (n > 1), n - (n > 1));
}

/* First pass: how many records, and the last placement recorded. */
static mmp_err scan_run(const char *run, mmp_costs_run *info, int *records)
{
    static mmp_metrics_step rec;
    mmp_metrics_reader r;
    int got = 0;
    *records = 0;
    mmp_err e = mmp_metrics_open(&r, run);
    snprintf(info->path, sizeof info->path, "%s", r.path);
    while (e == MMP_OK && (e = mmp_metrics_next(&r, &rec, &got)) == MMP_OK && got) {
        (*records)++;
        if (rec.placement[0]) {
            snprintf(info->placement, sizeof info->placement, "%s", rec.placement);
        }
    }
    mmp_metrics_close(&r);
    return e;
}

mmp_err mmp_costs_measure(const char *run, mmp_plan *plan, mmp_sched *s, mmp_sim_costs *c,
                          mmp_costs_run *info)
{
    static mmp_metrics_step rec;
    memset(info, 0, sizeof *info);
    memset(s, 0, sizeof *s);
    int records = 0;
    MMP_TRY(scan_run(run, info, &records));
    if (info->placement[0]) {
        /* Costs measured on another placement than the plan's (a balanced
         * run re-places its stages) are simulated on the one they were
         * measured on. */
        mmp_placement pl;
        mmp_err e = mmp_placement_parse(info->placement, mmp_plan_image_layers(plan),
                                        mmp_plan_text_layers(plan), &pl);
        if (e != MMP_OK) {
            return mmp_error_prefix(e, "%s: measured placement", info->path);
        }
        mmp_placement_to_plan(&pl, plan);
    }
    MMP_TRY(mmp_sched_compile(s, plan));
    measured m;
    mmp_metrics_reader r;
    int got = 0;
    mmp_err ret = measured_init(&m, s->n_stages, records);
    if (ret == MMP_OK) {
        ret = mmp_metrics_open(&r, run);
    }
    /* Only the records the first pass counted: a run still training appends
     * more in between, and they wait for the next reading. */
    while (ret == MMP_OK && m.n < m.cap && (ret = mmp_metrics_next(&r, &rec, &got)) == MMP_OK &&
           got) {
        /* only step records, and only the steps of the placement simulated */
        if (!rec.has_stages || (info->placement[0] && strcmp(rec.placement, info->placement))) {
            continue;
        }
        char where[1200];
        snprintf(where, sizeof where, "%s:%d", info->path, r.lineno);
        ret = take_record(s, &rec, where, &m);
    }
    mmp_metrics_close(&r);
    if (ret == MMP_OK && m.n == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "%s: no step records (lines with \"stages\")", info->path);
    }
    if (ret == MMP_OK) {
        ret = route_as_measured(plan, s, &m, info);
    }
    if (ret == MMP_OK) {
        memset(c, 0, sizeof *c);
        for (int st = 0; st < s->n_stages; st++) {
            c->fwd_ms[st] = steady_median(m.fwd[st], m.n);
            c->bwd_ms[st] = steady_median(m.bwd[st], m.n);
            c->load_ms[st] = steady_median(m.load[st], m.n);
            c->wgt_ms[st] = steady_median(m.wgt[st], m.n); /* 0: fused, simulated as 1:1 */
            c->mem_bytes[st] = m.mem[st];
            c->state_bytes[st] = m.state[st];
            c->act_slots[st] = m.slots[st];
        }
        for (int st = 0; st < s->n_stages; st++) {
            /* a replica without its own figure: its stage's others' */
            for (int r = 0; c->mem_bytes[st] == 0 && r < s->n_stages; r++) {
                if (strcmp(s->stages[r].name, s->stages[st].name) == 0) {
                    c->mem_bytes[st] = c->mem_bytes[r];
                    c->state_bytes[st] = c->state_bytes[r];
                    c->act_slots[st] = c->act_slots[r];
                }
            }
        }
        info->step_ms = steady_median(m.step, m.n);
        info->n_steps = m.n - (m.n > 1);
    }
    measured_fini(&m);
    return ret;
}

/* ---- per layer ---------------------------------------------------------------------- */

int mmp_costs_per_layer(const mmp_sched *s, const double *fwd_ms, const double *bwd_ms,
                        mmp_layer_costs *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < s->n_stages; i += s->stages[i].n_replicas) {
        const mmp_sched_stage *g = &s->stages[i];
        double best = INFINITY, fwd = 0, bwd = 0;
        for (int r = 0; r < g->n_replicas; r++) {
            double t = fwd_ms[i + r] + bwd_ms[i + r];
            if (isfinite(t) && t < best) {
                best = t;
                fwd = fwd_ms[i + r];
                bwd = bwd_ms[i + r];
            }
        }
        if (!isfinite(best)) {
            return 0;
        }
        if (g->kind == MMP_KIND_FUSION) {
            out->fusion_fwd = fwd;
            out->fusion_bwd = bwd;
            continue;
        }
        int br = g->kind == MMP_KIND_IMAGE ? MMP_PLANNER_IMAGE : MMP_PLANNER_TEXT;
        int nl = g->layer_last - g->layer_first;
        for (int l = g->layer_first; l < g->layer_last && l < MMP_PLANNER_MAX_LAYERS; l++) {
            out->fwd[br][l] = fwd / nl;
            out->bwd[br][l] = bwd / nl;
        }
    }
    return 1;
}

void mmp_costs_per_layer_mem(const mmp_sched *s, const double *mem_bytes, const double *state_bytes,
                             const int *act_slots, int q0, mmp_layer_costs *out)
{
    out->have_mem = 1;
    for (int i = 0; i < s->n_stages; i += s->stages[i].n_replicas) {
        const mmp_sched_stage *g = &s->stages[i];
        int top = i;
        for (int r = 0; r < g->n_replicas; r++) {
            top = mem_bytes[i + r] > mem_bytes[top] ? i + r : top;
        }
        double peak = mem_bytes[top] > 0 ? mem_bytes[top] : 0;
        double state = state_bytes ? state_bytes[top] : 0;
        int slots = act_slots ? act_slots[top] : 0;
        out->have_mem &= peak > 0;
        double act = 0; /* per slot */
        if (state > 0 && state <= peak && slots > 0 && q0 > 0) {
            act = (peak - state) / slots;
        } else {
            state = peak;
        }
        int nl = g->kind == MMP_KIND_FUSION ? 1 : g->layer_last - g->layer_first;
        double per_sample = q0 > 0 ? act / q0 / nl : 0;
        if (g->kind == MMP_KIND_FUSION) {
            out->fusion_mem = state;
            out->fusion_act = per_sample;
            continue;
        }
        int br = g->kind == MMP_KIND_IMAGE ? MMP_PLANNER_IMAGE : MMP_PLANNER_TEXT;
        for (int l = g->layer_first; l < g->layer_last && l < MMP_PLANNER_MAX_LAYERS; l++) {
            out->mem[br][l] = state / nl;
            out->act[br][l] = per_sample;
        }
    }
}

void mmp_costs_planner_input(const mmp_plan *p, const mmp_layer_costs *lc, mmp_planner_input *in)
{
    memset(in, 0, sizeof *in);
    int mem = lc->have_mem;
    in->branch[MMP_PLANNER_IMAGE] = (mmp_planner_layers){.n = mmp_plan_image_layers(p),
                                                         .fwd_ms = lc->fwd[0],
                                                         .bwd_ms = lc->bwd[0],
                                                         .state_bytes = mem ? lc->mem[0] : NULL,
                                                         .act_bytes = mem ? lc->act[0] : NULL};
    in->branch[MMP_PLANNER_TEXT] = (mmp_planner_layers){.n = mmp_plan_text_layers(p),
                                                        .fwd_ms = lc->fwd[1],
                                                        .bwd_ms = lc->bwd[1],
                                                        .state_bytes = mem ? lc->mem[1] : NULL,
                                                        .act_bytes = mem ? lc->act[1] : NULL};
    in->fusion = (mmp_planner_layers){.n = 1,
                                      .fwd_ms = &lc->fusion_fwd,
                                      .bwd_ms = &lc->fusion_bwd,
                                      .state_bytes = mem ? &lc->fusion_mem : NULL,
                                      .act_bytes = mem ? &lc->fusion_act : NULL};
    in->microbatches = p->train.microbatches;
    in->schedule = p->train.schedule;
    in->batch_loss = p->model.fusion.itc_scope == MMP_ITC_BATCH;
    in->method = MMP_PLANNER_AUTO;
}

/* ---- the printed prediction ----------------------------------------------------------- */

void mmp_costs_report(FILE *f, const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                      const mmp_sim_result *r)
{
    fprintf(f, "%-10s %-9s %5s %9s %9s %9s %9s %10s %10s %7s\n", "stage", "layers", "depth",
            "in-flight", "load ms", "fwd ms", "bwd ms", "busy ms", "idle ms", "bubble");
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        char layers[32], inflight[32];
        snprintf(layers, sizeof layers, "[%d,%d)", g->layer_first, g->layer_last);
        snprintf(inflight, sizeof inflight, "%d/%d", g->max_inflight, g->inflight_bound);
        fprintf(f, "%-10s %-9s %5d %9s %9.3f %9.3f %9.3f %10.3f %10.3f %6.1f%%\n",
                g->n_replicas > 1 ? g->proc : g->name, layers, g->depth, inflight, c->load_ms[st],
                c->fwd_ms[st], c->bwd_ms[st], r->busy_ms[st], r->idle_ms[st],
                r->step_ms > 0 ? 100 * r->idle_ms[st] / r->step_ms : 0.0);
    }
    fprintf(f, "(costs per micro-batch; in-flight: most micro-batches held / the schedule's "
               "bound)\n");
    fprintf(f, "\npredicted step time %.3f ms, %.1f samples/s, bubble %.1f%%\n", r->step_ms,
            r->step_ms > 0 ? p->train.batch / (r->step_ms / 1000) : 0.0, 100 * r->bubble);
}
