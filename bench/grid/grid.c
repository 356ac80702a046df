/* The grid of `mmpipe bench` (bench/grid/bench.h): which runs there are,
 * the overrides that make each one, and the launch command line of each. It
 * starts nothing and reads no file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/grid/bench.h"

const char *const MMP_BENCH_SCHED_NAMES[3] = {"gpipe", "1f1b", "zb-h1"};
const char *const MMP_BENCH_BALANCE_NAMES[2] = {"off", "dynamic"};
const char *const MMP_BENCH_PREC_NAMES[3] = {"fp32", "bf16", "fp16"};

void mmp_bench_fini(mmp_bench *b)
{
    if (!b) {
        return;
    }
    for (int i = 0; i < b->n_runs; i++) {
        for (int k = 0; k < b->runs[i].n_sets; k++) {
            if (b->runs[i].owned[k]) {
                free(b->runs[i].sets[k]);
            }
        }
    }
    free(b->runs);
    b->runs = NULL;
    b->n_runs = 0;
    for (int k = 0; k < b->n_place; k++) {
        free(b->place[k].buf);
        b->place[k].buf = NULL;
    }
}

/* The option that owns kv's key when the grid sets it itself (an override
 * of it would make a row's labels lie), else NULL. */
const char *mmp_bench_grid_key_option(const char *kv)
{
    static const char *const keys[][2] = {
        {"job.steps", "--steps and --warmup"},    {"train.schedule", "--schedules"},
        {"train.microbatches", "--microbatches"}, {"balance.mode", "--balance"},
        {"train.eval_every", "bench (0)"},        {"train.ckpt_every", "bench (0)"},
        {"train.precision", "--precisions"},
    };
    size_t len = strcspn(kv, "=");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i][0]) == len && strncmp(kv, keys[i][0], len) == 0) {
            return keys[i][1];
        }
    }
    return NULL;
}

static int run_add_set(mmp_bench_run *r, const char *s, int own)
{
    if (r->n_sets == (int)(sizeof r->sets / sizeof r->sets[0])) {
        return -1;
    }
    r->sets[r->n_sets] = own ? strdup(s) : (char *)s;
    if (!r->sets[r->n_sets]) {
        return -1;
    }
    r->owned[r->n_sets++] = (char)own;
    return 0;
}

static int run_add_setf(mmp_bench_run *r, const char *key, const char *val)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s=%s", key, val);
    return run_add_set(r, buf, 1);
}

/* Lays out every run and its overrides: per precision, the baseline first,
 * then schedules, micro-batch counts, placements and balance modes,
 * outermost first. */
mmp_err mmp_bench_build_grid(mmp_bench *b, const mmp_plan *plan)
{
    int per_prec = (b->no_single ? 0 : 1) + b->n_sched * b->n_mb * b->n_place * b->n_bal;
    int n = b->n_prec * per_prec;
    b->runs = calloc((size_t)n, sizeof *b->runs);
    if (!b->runs) {
        return mmp_errorf(MMP_ERR_NOMEM, "out of memory for %d runs", n);
    }
    char steps[32];
    snprintf(steps, sizeof steps, "%d", b->warmup + b->steps);
    for (int i = 0; i < n; i++) {
        mmp_bench_run *r = &b->runs[b->n_runs++];
        r->sps = r->step_ms = r->bubble = r->bubble_pred = r->efficiency = NAN;
        snprintf(r->status, sizeof r->status, "not run");
        r->prec = b->prec[i / per_prec];
        const char *prec = MMP_BENCH_PREC_NAMES[r->prec];
        int g = i % per_prec - (b->no_single ? 0 : 1);
        int err = run_add_setf(r, "job.steps", steps) | run_add_set(r, "train.eval_every=0", 0) |
                  run_add_set(r, "train.ckpt_every=0", 0) |
                  run_add_setf(r, "train.precision", prec);
        char id[sizeof r->id];
        if (g < 0) {
            r->single = 1;
            r->sched = plan->train.schedule;
            r->mb = plan->train.microbatches;
            r->place = -1;
            r->balance = MMP_BALANCE_OFF; /* one process has nothing to balance */
            snprintf(id, sizeof id, "single");
            err |= run_add_set(r, "balance.mode=off", 0);
        } else {
            int bi = g % b->n_bal, pi = g / b->n_bal % b->n_place,
                mi = g / (b->n_bal * b->n_place) % b->n_mb,
                si = g / (b->n_bal * b->n_place * b->n_mb);
            r->sched = b->sched[si];
            r->mb = b->mb[mi];
            r->place = pi;
            r->balance = b->bal[bi];
            snprintf(id, sizeof id, "%s-m%d-%s-%s", MMP_BENCH_SCHED_NAMES[r->sched], r->mb,
                     b->place[pi].slug, MMP_BENCH_BALANCE_NAMES[r->balance]);
            char mb[32];
            snprintf(mb, sizeof mb, "%d", r->mb);
            err |= run_add_setf(r, "train.schedule", MMP_BENCH_SCHED_NAMES[r->sched]) |
                   run_add_setf(r, "train.microbatches", mb);
            for (int k = 0; k < b->place[pi].n_kv; k++) {
                err |= run_add_set(r, b->place[pi].kv[k], 0);
            }
            err |= run_add_setf(r, "balance.mode", MMP_BENCH_BALANCE_NAMES[r->balance]);
        }
        if (b->prec_axis) {
            snprintf(r->id, sizeof r->id, "%.150s-%s", id, prec);
        } else {
            snprintf(r->id, sizeof r->id, "%s", id);
        }
        for (int k = 0; k < b->n_user_sets; k++) {
            err |= run_add_set(r, b->user_sets[k], 0);
        }
        if (err) {
            return mmp_errorf(MMP_ERR_INVALID, "too many overrides for run %s", r->id);
        }
    }
    return MMP_OK;
}

mmp_err mmp_bench_check_runs(const mmp_bench *b)
{
    static mmp_plan plan;
    char label[256];
    for (int i = 0; i < b->n_runs; i++) {
        const mmp_bench_run *r = &b->runs[i];
        if (mmp_plan_load(&plan, b->plan_path, (const char *const *)r->sets, r->n_sets) != MMP_OK ||
            mmp_plan_check_runnable(&plan) != MMP_OK) {
            return mmp_error_prefix(MMP_ERR_CONFIG, "run %s (%s)", r->id,
                                    mmp_bench_run_label(b, r, label, sizeof label));
        }
    }
    return MMP_OK;
}

int mmp_bench_run_argv(const mmp_bench *b, const mmp_bench_run *r, char *run_dir, char **argv)
{
    int n = 0;
    argv[n++] = (char *)b->self;
    argv[n++] = "launch";
    argv[n++] = (char *)b->plan_path;
    argv[n++] = "--out";
    argv[n++] = run_dir;
    argv[n++] = "--force";
    if (r->single) {
        argv[n++] = "--single-process";
    }
    for (int k = 0; k < r->n_sets; k++) {
        argv[n++] = "--set";
        argv[n++] = r->sets[k];
    }
    argv[n] = NULL;
    return n;
}

const char *mmp_bench_run_label(const mmp_bench *b, const mmp_bench_run *r, char *buf, size_t n)
{
    const char *prec = b->prec_axis ? MMP_BENCH_PREC_NAMES[r->prec] : "";
    const char *sep = b->prec_axis ? " " : "";
    if (r->single) {
        snprintf(buf, n, "single-process m=%d%s%s", r->mb, sep, prec);
    } else {
        snprintf(buf, n, "%s m=%d %s balance=%s%s%s", MMP_BENCH_SCHED_NAMES[r->sched], r->mb,
                 b->place[r->place].name, MMP_BENCH_BALANCE_NAMES[r->balance], sep, prec);
    }
    return buf;
}

/* Prints an argument as a shell word (single-quoted when it needs it). */
static void print_word(FILE *f, const char *s)
{
    if (*s &&
        strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.,/:=+@%") ==
            strlen(s)) {
        fputs(s, f);
        return;
    }
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') {
            fputs("'\\''", f);
        } else {
            fputc(*s, f);
        }
    }
    fputc('\'', f);
}

void mmp_bench_print_runs(const mmp_bench *b, FILE *f)
{
    char *argv[MMP_BENCH_ARGV_MAX];
    char dir[1200], label[400];
    fprintf(f, "%d run%s into %s/runs/, %d warm-up + %d measured steps each:\n", b->n_runs,
            b->n_runs == 1 ? "" : "s", b->out, b->warmup, b->steps);
    for (int i = 0; i < b->n_runs; i++) {
        const mmp_bench_run *r = &b->runs[i];
        snprintf(dir, sizeof dir, "%s/runs/%s", b->out, r->id);
        int n = mmp_bench_run_argv(b, r, dir, argv);
        fprintf(f, "[%d/%d] %s\n  mmpipe", i + 1, b->n_runs,
                mmp_bench_run_label(b, r, label, sizeof label));
        for (int k = 1; k < n; k++) {
            fputc(' ', f);
            print_word(f, argv[k]);
        }
        fputc('\n', f);
    }
}
