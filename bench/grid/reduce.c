/* One finished run of `mmpipe bench` into its row (bench/grid/bench.h): its
 * metrics.jsonl, read through common/metrics.h, reduced to medians over the
 * measured steps; and the bubble the schedule simulator predicts from the
 * run's own costs, by calling the compiler and mmp_sched_simulate. Reads the
 * run's files; writes only its simulate.txt. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/grid/bench.h"
#include "common/metrics.h"
#include "common/stats.h"
#include "coordinator/costs.h"
#include "coordinator/schedule.h"

/* A growing list of one quantity's per-step values. */
typedef struct series {
    double *v;
    int n, cap;
} series;

static int push(series *s, double x)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        double *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) {
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

typedef struct stage_acc {
    char label[48];
    series busy, idle;
    double peak;
} stage_acc;

typedef struct acc {
    series sps, step, bubble, eff;
    int n_stages;
    stage_acc stages[MMP_BENCH_MAX_STAGE_ROWS];
    char placement[256];
} acc;

static void acc_fini(acc *a)
{
    free(a->sps.v);
    free(a->step.v);
    free(a->bubble.v);
    free(a->eff.v);
    for (int i = 0; i < a->n_stages; i++) {
        free(a->stages[i].busy.v);
        free(a->stages[i].idle.v);
    }
}

/* One step record into a; measured: past the warm-up. NULL, or what is
 * wrong with it. */
static const char *take_record(const mmp_metrics_step *m, int measured, acc *a)
{
    if (!m->has_stages) {
        return "no \"stages\" list";
    }
    if (isnan(m->samples_per_s) || isnan(m->step_ms) || isnan(m->bubble)) {
        return "no samples_per_s, step_ms or bubble number";
    }
    if (m->placement[0]) {
        snprintf(a->placement, sizeof a->placement, "%.255s", m->placement);
    }
    double busy_sum = 0;
    int entries = 0;
    for (int e = 0; e < m->n_stages; e++) {
        const mmp_metrics_stage *g = &m->stages[e];
        char label[48];
        if (g->replica > 0) {
            snprintf(label, sizeof label, "%.36s/%d", g->name, g->replica);
        } else {
            snprintf(label, sizeof label, "%s", g->name);
        }
        int k = 0;
        while (k < a->n_stages && strcmp(a->stages[k].label, label) != 0) {
            k++;
        }
        if (k == a->n_stages) {
            if (k == MMP_BENCH_MAX_STAGE_ROWS) {
                return "too many stage entries";
            }
            memset(&a->stages[k], 0, sizeof a->stages[k]);
            snprintf(a->stages[k].label, sizeof a->stages[k].label, "%s", label);
            a->n_stages++;
        }
        stage_acc *s = &a->stages[k];
        double busy = isnan(g->busy_ms) ? 0 : g->busy_ms, idle = isnan(g->idle_ms) ? 0 : g->idle_ms;
        s->peak = fmax(s->peak, isnan(g->peak_mem_bytes) ? 0 : g->peak_mem_bytes);
        if (measured && (push(&s->busy, busy) || push(&s->idle, idle))) {
            return "out of memory";
        }
        busy_sum += busy;
        entries++;
    }
    if (!measured) {
        return NULL;
    }
    double eff = !isnan(m->efficiency)       ? m->efficiency
                 : entries && m->step_ms > 0 ? busy_sum / (entries * m->step_ms)
                                             : NAN;
    if (push(&a->sps, m->samples_per_s) || push(&a->step, m->step_ms) ||
        push(&a->bubble, m->bubble) || (isfinite(eff) && push(&a->eff, eff))) {
        return "out of memory";
    }
    return NULL;
}

/* The reduction of a into r. */
static void fill_row(acc *a, mmp_bench_run *r)
{
    r->sps = mmp_median(a->sps.v, a->sps.n);
    r->step_ms = mmp_median(a->step.v, a->step.n);
    r->bubble = mmp_mean(a->bubble.v, a->bubble.n);
    r->efficiency = mmp_median(a->eff.v, a->eff.n);
    if (a->placement[0]) {
        snprintf(r->placement, sizeof r->placement, "%s", a->placement);
    }
    r->n_stages = a->n_stages;
    size_t used = 0;
    r->peak[0] = 0;
    for (int k = 0; k < a->n_stages; k++) {
        mmp_bench_stage_row *s = &r->stages[k];
        snprintf(s->label, sizeof s->label, "%s", a->stages[k].label);
        s->busy_ms = mmp_median(a->stages[k].busy.v, a->stages[k].busy.n);
        s->idle_ms = mmp_median(a->stages[k].idle.v, a->stages[k].idle.n);
        s->peak_bytes = a->stages[k].peak;
        int w = snprintf(r->peak + used, sizeof r->peak - used, "%s%s:%.1fMB", k ? " " : "",
                         s->label, s->peak_bytes / 1e6);
        if (w < 0 || (size_t)w >= sizeof r->peak - used) {
            r->peak[used] = 0; /* keep whole entries only */
            break;
        }
        used += (size_t)w;
    }
}

mmp_err mmp_bench_reduce(const char *run_dir, int warmup, mmp_bench_run *r)
{
    static acc a;
    static mmp_metrics_step m;
    memset(&a, 0, sizeof a);
    mmp_metrics_reader rd;
    int got = 0;
    mmp_err ret = mmp_metrics_open(&rd, run_dir);
    while (ret == MMP_OK && (ret = mmp_metrics_next(&rd, &m, &got)) == MMP_OK && got) {
        const char *why = m.step < 0 ? "no step number" : take_record(&m, m.step > warmup, &a);
        if (why) {
            ret = mmp_errorf(MMP_ERR_DATA, "metrics.jsonl:%d: %s", rd.lineno, why);
        }
    }
    mmp_metrics_close(&rd);
    if (ret == MMP_OK && a.sps.n == 0) {
        ret = mmp_errorf(MMP_ERR_DATA, "metrics.jsonl: no step after the %d warm-up steps", warmup);
    }
    if (ret == MMP_OK) {
        fill_row(&a, r);
    }
    acc_fini(&a);
    return ret;
}

void mmp_bench_predict(const mmp_bench *b, const char *run_dir, mmp_bench_run *r)
{
    static mmp_plan plan;
    static mmp_sched sched;
    mmp_sim_costs costs;
    mmp_sim_result res;
    mmp_costs_run info;
    char path[1300];
    snprintf(path, sizeof path, "%s/simulate.txt", run_dir);
    FILE *f = fopen(path, "w");
    memset(&sched, 0, sizeof sched);
    /* the plan as the run was launched: the bench's plan with the run's overrides */
    mmp_err e = mmp_plan_load(&plan, b->plan_path, (const char *const *)r->sets, r->n_sets);
    if (e == MMP_OK) {
        e = mmp_costs_measure(run_dir, &plan, &sched, &costs, &info);
    }
    if (e == MMP_OK) {
        e = mmp_sched_simulate(&sched, &costs, &res);
    }
    if (e != MMP_OK) {
        snprintf(r->pred_note, sizeof r->pred_note, "%.230s", mmp_last_error());
        if (f) {
            fprintf(f, "no prediction: %s\n", mmp_last_error());
        }
    } else {
        r->bubble_pred = res.bubble;
        if (f) {
            fprintf(f,
                    "%s, schedule %s, %d micro-batches: costs measured, medians over %d step%s "
                    "of %s (first left out as warm-up); send and step overhead not measured (0 "
                    "ms); placement %s\n\n",
                    r->id, mmp_schedule_name(sched.kind), sched.microbatches, info.n_steps,
                    info.n_steps == 1 ? "" : "s", info.path,
                    info.placement[0] ? info.placement : "the plan's");
            mmp_costs_report(f, &plan, &sched, &costs, &res);
            fprintf(f,
                    "measured step time %.3f ms (median of %d step%s), prediction error %+.1f%%\n",
                    info.step_ms, info.n_steps, info.n_steps == 1 ? "" : "s",
                    info.step_ms > 0 ? 100 * (res.step_ms - info.step_ms) / info.step_ms : 0.0);
        }
    }
    if (f) {
        fclose(f);
    }
    mmp_sched_fini(&sched);
}
