/* The charts of `mmpipe bench` (bench/grid/bench.h): throughput.png
 * (samples/s against micro-batches) and stages.png (busy and idle per stage,
 * per placement), as gnuplot data and script in the bench directory, drawn
 * by gnuplot run there as a child. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/grid/bench.h"

/* A string in a gnuplot script: single-quoted, quotes doubled. */
static void gp_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') {
            fputc('\'', f);
        }
        fputc(*s == '\n' ? ' ' : *s, f);
    }
    fputc('\'', f);
}

/* " bf16" when the grid has a precision axis, else "". */
static const char *prec_suffix(const mmp_bench *b, int prec, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s", b->prec_axis ? ", " : "",
             b->prec_axis ? MMP_BENCH_PREC_NAMES[prec] : "");
    return buf;
}

/* throughput.dat: one block per (precision, schedule, placement, balance)
 * series with at least one finished run; the plot command for them goes
 * into gp, and a dashed line per precision's baseline. */
static int throughput_chart(const mmp_bench *b, FILE *dat, FILE *gp)
{
    int lo = b->mb[0], hi = b->mb[0];
    for (int i = 1; i < b->n_mb; i++) {
        lo = b->mb[i] < lo ? b->mb[i] : lo;
        hi = b->mb[i] > hi ? b->mb[i] : hi;
    }
    fprintf(gp,
            "set output 'throughput.png'\n"
            "set title 'samples/s against micro-batches'\n"
            "set xlabel 'micro-batches per step'\nset ylabel 'samples/s (median)'\n"
            "set logscale x 2\nset xrange [%g:%g]\nset yrange [0:*]\nset grid\n"
            "set key outside right top\nset xtics (",
            lo / 1.4, hi * 1.4);
    for (int i = 0; i < b->n_mb; i++) {
        fprintf(gp, "%s%d", i ? ", " : "", b->mb[i]);
    }
    fprintf(gp, ")\nplot");
    int block = 0;
    char ps[16];
    for (int q = 0; q < b->n_prec; q++) {
        for (int s = 0; s < b->n_sched; s++) {
            for (int p = 0; p < b->n_place; p++) {
                for (int k = 0; k < b->n_bal; k++) {
                    int points = 0;
                    for (int i = 0; i < b->n_runs; i++) {
                        const mmp_bench_run *r = &b->runs[i];
                        if (!r->single && r->state == MMP_BENCH_OK && r->prec == b->prec[q] &&
                            r->sched == b->sched[s] && r->place == p && r->balance == b->bal[k]) {
                            if (!points) {
                                fprintf(dat, "%s# %s %s balance=%s %s\n", block ? "\n\n" : "",
                                        MMP_BENCH_SCHED_NAMES[b->sched[s]], b->place[p].name,
                                        MMP_BENCH_BALANCE_NAMES[b->bal[k]],
                                        MMP_BENCH_PREC_NAMES[b->prec[q]]);
                            }
                            fprintf(dat, "%d %.6g\n", r->mb, r->sps);
                            points++;
                        }
                    }
                    if (!points) {
                        continue;
                    }
                    char title[256];
                    snprintf(title, sizeof title, "%s, %s, balance %s%s",
                             MMP_BENCH_SCHED_NAMES[b->sched[s]], b->place[p].name,
                             MMP_BENCH_BALANCE_NAMES[b->bal[k]],
                             prec_suffix(b, b->prec[q], ps, sizeof ps));
                    fprintf(gp,
                            "%s 'throughput.dat' index %d using 1:2 with linespoints lw 2 pt 7 "
                            "title ",
                            block ? ", \\\n    " : "", block);
                    gp_str(gp, title);
                    block++;
                }
            }
        }
    }
    for (int q = 0; q < b->n_prec; q++) {
        double base = mmp_bench_baseline_sps(b, b->prec[q]);
        if (isfinite(base)) {
            char title[64];
            snprintf(title, sizeof title, "single process%s",
                     prec_suffix(b, b->prec[q], ps, sizeof ps));
            fprintf(gp, "%s %.6g with lines dt %d lw 2 lc rgb 'black' title ",
                    block ? ", \\\n    " : "", base, 2 + q);
            gp_str(gp, title);
            block++;
        }
    }
    fprintf(gp, "\n");
    return block;
}

/* stages.dat: per placement one block of "stage busy idle" (ms per step) for
 * its run at the first precision, the first schedule, the most
 * micro-batches, the first balance mode; rowstacked bars, one group per
 * placement. */
static int stages_chart(const mmp_bench *b, FILE *dat, FILE *gp)
{
    int hi = b->mb[0];
    for (int i = 1; i < b->n_mb; i++) {
        hi = b->mb[i] > hi ? b->mb[i] : hi;
    }
    int blocks = 0;
    char ps[16];
    fprintf(gp,
            "set output 'stages.png'\n"
            "set title 'busy and idle time per step (median) of each stage, by placement: %s, %d "
            "micro-batches, balance %s%s'\n"
            "unset logscale x\nset xrange [*:*]\nset yrange [0:*]\nset xtics auto\n"
            "unset xlabel\nset ylabel 'ms per step'\nset bmargin 5\n"
            "unset grid\nset grid ytics\nset key outside right top\n"
            "set style data histograms\nset style histogram rowstacked title offset 0,-1\n"
            "set style fill solid 0.8 border -1\nset boxwidth 0.75\nset xtics rotate by -30\n"
            "plot",
            MMP_BENCH_SCHED_NAMES[b->sched[0]], hi, MMP_BENCH_BALANCE_NAMES[b->bal[0]],
            prec_suffix(b, b->prec[0], ps, sizeof ps));
    for (int p = 0; p < b->n_place; p++) {
        const mmp_bench_run *r = NULL;
        for (int i = 0; i < b->n_runs; i++) {
            const mmp_bench_run *c = &b->runs[i];
            if (!c->single && c->state == MMP_BENCH_OK && c->prec == b->prec[0] &&
                c->sched == b->sched[0] && c->mb == hi && c->place == p &&
                c->balance == b->bal[0] && c->n_stages > 0) {
                r = c;
            }
        }
        if (!r) {
            continue;
        }
        fprintf(dat, "%s# %s (run %s): stage busy_ms idle_ms\n", blocks ? "\n\n" : "",
                b->place[p].name, r->id);
        for (int k = 0; k < r->n_stages; k++) {
            fprintf(dat, "\"%s\" %.6g %.6g\n", r->stages[k].label, r->stages[k].busy_ms,
                    r->stages[k].idle_ms);
        }
        fprintf(gp, "%s newhistogram ", blocks ? ", \\\n    " : "");
        gp_str(gp, b->place[p].name);
        fprintf(gp,
                ", 'stages.dat' index %d using 2:xtic(1) lc rgb '#3b6fb6' %s, "
                "'' index %d using 3 lc rgb '#d9d9d9' %s",
                blocks, blocks ? "notitle" : "title 'busy'", blocks,
                blocks ? "notitle" : "title 'idle'");
        blocks++;
    }
    fprintf(gp, "\n");
    return blocks;
}

int mmp_bench_have_gnuplot(void)
{
    const char *path = getenv("PATH");
    char dir[1200];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/gnuplot", (int)(len ? len : 1), len ? p : ".");
        if (access(dir, X_OK) == 0) {
            return 1;
        }
        p += len + (p[len] == ':');
    }
    return 0;
}

mmp_err mmp_bench_draw_charts(const mmp_bench *b)
{
    char dat1[1200], dat2[1200], gpp[1200], log[1200], why[600];
    snprintf(dat1, sizeof dat1, "%s/throughput.dat", b->out);
    snprintf(dat2, sizeof dat2, "%s/stages.dat", b->out);
    snprintf(gpp, sizeof gpp, "%s/charts.gp", b->out);
    snprintf(log, sizeof log, "%s/gnuplot.log", b->out);
    FILE *t = fopen(dat1, "w"), *s = fopen(dat2, "w"), *gp = fopen(gpp, "w");
    mmp_err ret = MMP_ERR_IO;
    if (!t || !s || !gp) {
        ret = mmp_errorf(MMP_ERR_IO, "cannot write the chart files in %s: %s", b->out,
                         strerror(errno));
        goto exit;
    }
    fprintf(gp, "# mmpipe bench charts: run `gnuplot charts.gp` in this directory.\n"
                "set terminal pngcairo noenhanced size 1100,600 font 'sans,10'\n");
    int lines = throughput_chart(b, t, gp);
    if (!lines) {
        ret = mmp_errorf(MMP_ERR_INVALID, "no finished run to chart");
        goto exit;
    }
    if (!stages_chart(b, s, gp)) {
        fprintf(stderr,
                "mmpipe bench: stages.png not drawn: no finished run at the first "
                "precision and schedule, the most micro-batches and the first balance mode\n");
    }
    int bad = fclose(t) | fclose(s) | fclose(gp);
    t = s = gp = NULL;
    if (bad) {
        ret = mmp_errorf(MMP_ERR_IO, "cannot write the chart files in %s", b->out);
        goto exit;
    }
    if (!mmp_bench_have_gnuplot()) {
        ret = mmp_errorf(MMP_ERR_UNSUPPORTED,
                         "gnuplot not found: install gnuplot-nox (scripts/setup does); the "
                         "charts' data and script are in %s",
                         b->out);
        goto exit;
    }
    char *argv[] = {"gnuplot", "charts.gp", NULL};
    int st = mmp_bench_spawn_wait(argv, log, b->out, 1, why, sizeof why);
    if (st != 0) {
        char last[256];
        mmp_bench_last_line(log, last, sizeof last);
        ret = mmp_errorf(MMP_ERR_IO, "gnuplot failed (%s): %s", log,
                         st < 0    ? why
                         : last[0] ? last
                                   : "no output");
        goto exit;
    }
    ret = MMP_OK;
exit:
    if (t) {
        fclose(t);
    }
    if (s) {
        fclose(s);
    }
    if (gp) {
        fclose(gp);
    }
    return ret;
}
