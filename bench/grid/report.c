/* The results of `mmpipe bench` as tables (bench/grid/bench.h):
 * results.csv (one row per run) and results.md (the same as Markdown, also
 * printed on stdout). Reads only the runs' reduced rows. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench/grid/bench.h"

double mmp_bench_baseline_sps(const mmp_bench *b, int prec)
{
    for (int i = 0; i < b->n_runs; i++) {
        if (b->runs[i].single && b->runs[i].prec == prec && b->runs[i].state == MMP_BENCH_OK) {
            return b->runs[i].sps;
        }
    }
    return NAN;
}

static const char *placement_of(const mmp_bench *b, const mmp_bench_run *r)
{
    return r->placement[0] ? r->placement : r->single ? "single-process" : b->place[r->place].name;
}

/* x as "%.*f", or "" when it is not a number. */
static const char *num(char *buf, size_t n, double x, int decimals)
{
    if (isfinite(x)) {
        snprintf(buf, n, "%.*f", decimals, x);
    } else {
        buf[0] = 0;
    }
    return buf;
}

static void csv_field(FILE *f, const char *s, int last)
{
    if (strpbrk(s, ",\"\n\r")) {
        fputc('"', f);
        for (; *s; s++) {
            if (*s == '"') {
                fputc('"', f);
            }
            fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
        }
        fputc('"', f);
    } else {
        fputs(s, f);
    }
    fputc(last ? '\n' : ',', f);
}

static mmp_err write_csv(const mmp_bench *b, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    fputs("run_id,schedule,microbatches,placement,balance,precision,samples_per_s,ratio_to_single,"
          "step_ms,bubble_measured,bubble_predicted,balance_efficiency,peak_mem,status\n",
          f);
    for (int i = 0; i < b->n_runs; i++) {
        const mmp_bench_run *r = &b->runs[i];
        double base = mmp_bench_baseline_sps(b, r->prec);
        char t[9][64];
        snprintf(t[0], sizeof t[0], "%d", r->mb);
        csv_field(f, r->id, 0);
        /* the baseline as results.md shows it: one process, no schedule to
         * balance */
        csv_field(f, r->single ? "single-process" : MMP_BENCH_SCHED_NAMES[r->sched], 0);
        csv_field(f, t[0], 0);
        csv_field(f, placement_of(b, r), 0);
        csv_field(f, r->single ? "" : MMP_BENCH_BALANCE_NAMES[r->balance], 0);
        csv_field(f, MMP_BENCH_PREC_NAMES[r->prec], 0);
        csv_field(f, num(t[1], 64, r->sps, 2), 0);
        csv_field(f, num(t[2], 64, r->sps / base, 4), 0);
        csv_field(f, num(t[3], 64, r->step_ms, 3), 0);
        csv_field(f, num(t[4], 64, r->bubble, 4), 0);
        csv_field(f, num(t[5], 64, r->bubble_pred, 4), 0);
        csv_field(f, num(t[6], 64, r->efficiency, 4), 0);
        csv_field(f, r->peak, 0);
        csv_field(f, r->status, 1);
    }
    if (fclose(f) != 0) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    return MMP_OK;
}

/* s in a Markdown table cell: '|' escaped, empty as "-". */
static void md_cell(FILE *f, const char *s)
{
    fputs(" ", f);
    if (!*s) {
        fputs("-", f);
    }
    for (; *s; s++) {
        if (*s == '|') {
            fputc('\\', f);
        }
        fputc(*s, f);
    }
    fputs(" |", f);
}

static void pct(char *buf, size_t n, double x)
{
    if (isfinite(x)) {
        snprintf(buf, n, "%.1f%%", 100 * x);
    } else {
        buf[0] = 0;
    }
}

void mmp_bench_write_md(const mmp_bench *b, FILE *f)
{
    fprintf(f, "| run | schedule | micro-batches | placement | balance | precision | samples/s | x "
               "single | step ms | bubble | predicted bubble | balance efficiency | peak memory | "
               "status |\n"
               "|---|---|--:|---|---|---|--:|--:|--:|--:|--:|--:|---|---|\n");
    int notes = 0;
    for (int i = 0; i < b->n_runs; i++) {
        const mmp_bench_run *r = &b->runs[i];
        double base = mmp_bench_baseline_sps(b, r->prec);
        char t[64];
        fputs("|", f);
        md_cell(f, r->id);
        md_cell(f, r->single ? "single-process" : MMP_BENCH_SCHED_NAMES[r->sched]);
        snprintf(t, sizeof t, "%d", r->mb);
        md_cell(f, t);
        md_cell(f, placement_of(b, r));
        md_cell(f, r->single ? "" : MMP_BENCH_BALANCE_NAMES[r->balance]);
        md_cell(f, MMP_BENCH_PREC_NAMES[r->prec]);
        md_cell(f, num(t, sizeof t, r->sps, 1));
        if (isfinite(r->sps / base)) {
            snprintf(t, sizeof t, "%.2fx", r->sps / base);
        } else {
            t[0] = 0;
        }
        md_cell(f, t);
        md_cell(f, num(t, sizeof t, r->step_ms, 1));
        pct(t, sizeof t, r->bubble);
        md_cell(f, t);
        pct(t, sizeof t, r->bubble_pred);
        if (r->pred_note[0]) {
            snprintf(t, sizeof t, "n/a (%d)", ++notes);
        }
        md_cell(f, t);
        pct(t, sizeof t, r->efficiency);
        md_cell(f, t);
        md_cell(f, r->peak);
        md_cell(f, r->status);
        fputs("\n", f);
    }
    notes = 0;
    for (int i = 0; i < b->n_runs; i++) {
        if (b->runs[i].pred_note[0]) {
            fprintf(f, "%s(%d) no predicted bubble for %s: %s\n", notes ? "" : "\n", notes + 1,
                    b->runs[i].id, b->runs[i].pred_note);
            notes++;
        }
    }
    fprintf(
        f,
        "\n%d warm-up + %d measured steps per run; medians over the measured steps (bubble: "
        "mean); x single: samples/s over the single-process baseline's in the same precision.\n",
        b->warmup, b->steps);
}

mmp_err mmp_bench_write_results(const mmp_bench *b)
{
    char csv[1200], md[1200];
    snprintf(csv, sizeof csv, "%s/results.csv", b->out);
    snprintf(md, sizeof md, "%s/results.md", b->out);
    mmp_err ret = write_csv(b, csv);
    FILE *f = fopen(md, "w");
    if (!f) {
        return mmp_errorf(MMP_ERR_IO, "%s: %s", md, strerror(errno));
    }
    mmp_bench_write_md(b, f);
    if (fclose(f) != 0 && ret == MMP_OK) {
        ret = mmp_errorf(MMP_ERR_IO, "%s: %s", md, strerror(errno));
    }
    fputs("\n", stdout);
    mmp_bench_write_md(b, stdout);
    fflush(stdout);
    return ret;
}
