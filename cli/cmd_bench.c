/* mmpipe bench: the command line of the grid bench. Parses the options into
 * an mmp_bench and runs it through the bench library (bench/grid/bench.h):
 * the grid, the supervised runs, their reduction and prediction, the tables
 * and the charts all live there; this file only reads arguments, picks the
 * defaults from the plan and maps results to an exit status. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/grid/bench.h"
#include "cli/cli.h"
#include "common/config.h"

static const char USAGE[] =
    "usage: mmpipe bench PLAN.yaml|--plan PLAN.yaml [--out DIR] [--force] [--steps N]\n"
    "                    [--warmup W] [--schedules LIST] [--microbatches LIST] [--balance LIST]\n"
    "                    [--precisions LIST]\n"
    "                    [--placement NAME[=KEY=VALUE[,KEY=VALUE]...]]... [--set KEY=VALUE]...\n"
    "                    [--no-single] [--dry-run]\n"
    "\n"
    "Runs the plan over a grid: each precision x schedule x micro-batch count x\n"
    "placement x balance mode is one `mmpipe launch` (its own processes; W\n"
    "warm-up steps, then N measured ones; evaluation and checkpoints only after\n"
    "the last), and per precision one --single-process run (the plan's own\n"
    "schedule and micro-batches) is the baseline of that precision's runs. From each run's "
    "metrics.jsonl, over the measured steps:\n"
    "median samples/s and step time, mean bubble (idle share), median balance\n"
    "efficiency (the run's balance.efficiency when it reports one, else the\n"
    "stages' busy time / (stages x step time)), each stage's largest peak\n"
    "memory; and the bubble the schedule simulator (what `mmpipe simulate --costs\n"
    "RUN` runs) predicts from the run's own costs (empty when it cannot model\n"
    "the run). Writes into DIR:\n"
    "  results.csv     one row per run: run_id, schedule, microbatches, placement,\n"
    "                  balance, precision, samples_per_s, ratio_to_single\n"
    "                  (samples/s over the baseline's in the same precision),\n"
    "                  step_ms, bubble_measured, bubble_predicted,\n"
    "                  balance_efficiency, peak_mem (per stage: device memory on\n"
    "                  GPU stages, host RSS on CPU ones), status (ok | failed: ...)\n"
    "  results.md      the same as a Markdown table (also printed on stdout)\n"
    "  throughput.png  samples/s against micro-batches, one line per precision,\n"
    "                  schedule, placement and balance mode; the baselines dashed\n"
    "  stages.png      each stage's busy and idle ms per step (medians), one group\n"
    "                  per placement, at the first precision and schedule, the\n"
    "                  most micro-batches and the first balance mode\n"
    "  runs/ID/        each run's directory as launch wrote it (metrics.jsonl,\n"
    "                  trace.json, ...), with log.txt (its output) and\n"
    "                  simulate.txt (the prediction)\n"
    "Every run's plan (the plan with its overrides) is loaded and checked before\n"
    "the first run, --dry-run too: one the plan refuses stops the bench, naming\n"
    "the run. A run that fails when it runs is reported in its row and the grid\n"
    "goes on. The charts are drawn by gnuplot (charts.gp and its .dat files stay\n"
    "in DIR).\n"
    "\n"
    "options:\n"
    "  --out DIR          bench directory (default runs/bench-<plan file name>)\n"
    "  --force            replace DIR's earlier results and runs\n"
    "  --steps N          measured steps per run (default 10)\n"
    "  --warmup W         steps before them, not counted (default 3)\n"
    "  --schedules LIST   comma list of gpipe, 1f1b, zb-h1 (default: train.schedule)\n"
    "  --microbatches LIST\n"
    "                     comma list of micro-batch counts (default:\n"
    "                     train.microbatches)\n"
    "  --placement NAME[=KEY=VALUE[,KEY=VALUE]...]\n"
    "                     one placement: its name and the plan overrides that\n"
    "                     make it, e.g. split=stages.image.split=[2] or\n"
    "                     2/2/2=stages.image.replicas=2,stages.text.replicas=2,...\n"
    "                     (commas inside [] or {} belong to the value; NAME alone:\n"
    "                     the plan's own placement). Repeatable; default one\n"
    "                     placement \"plan\" without overrides. A placement may\n"
    "                     set any other key too: batch=model.fusion.itc_scope=batch\n"
    "                     and microbatch=model.fusion.itc_scope=microbatch compare\n"
    "                     the contrastive scopes (bench/itc_scope.sh)\n"
    "  --balance LIST     comma list of off, dynamic (default: balance.mode)\n"
    "  --precisions LIST  comma list of fp32, bf16, fp16 (default: train.precision);\n"
    "                     run ids then end in the precision (gpipe-m4-plan-off-bf16,\n"
    "                     single-bf16)\n"
    "  --set KEY=VALUE    override a plan key in every run, the baseline too\n"
    "                     (repeatable; applied after the grid's own overrides).\n"
    "                     The keys the grid sets (job.steps, train.schedule,\n"
    "                     train.microbatches, balance.mode, train.precision,\n"
    "                     train.eval_every, train.ckpt_every) are refused here and\n"
    "                     in placements\n"
    "  --no-single        no baseline run (ratio_to_single stays empty)\n"
    "  --dry-run          print the runs, as launch command lines, and exit\n"
    "  --plan PLAN.yaml   the plan, as an option\n"
    "  -h, --help         this text\n"
    "\n"
    "Progress, one line per run, goes to stderr. Ctrl-C (SIGINT) is passed to\n"
    "the running child, which stops its stages and cleans up; the results so\n"
    "far are written and bench exits 130 (SIGTERM likewise: 143).\n"
    "\n"
    "Exit status: 0 every run ok, 1 a run failed (or the plan, DIR or gnuplot\n"
    "did), 2 usage error, 130 / 143 interrupted by SIGINT / SIGTERM.\n";

/* s as a directory-name piece: [A-Za-z0-9._-], others become '_'. */
static void slugify(const char *s, char *out, size_t n)
{
    size_t i = 0;
    for (; *s && i + 1 < n; s++) {
        int c = (unsigned char)*s;
        int keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '-' || c == '_';
        out[i++] = keep ? (char)c : '_';
    }
    out[i] = 0;
    if (strcmp(out, ".") == 0 || strcmp(out, "..") == 0) {
        out[0] = '_';
    }
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* Prints "mmpipe bench: <message>" and a pointer to --help; returns 2. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mmpipe bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see mmpipe bench --help)\n");
    va_end(ap);
    return 2;
}

/* 1 when opt is one of bench's options that take a value. */
static int takes_value(const char *opt)
{
    static const char *const with_value[] = {
        "--plan",         "--out",     "--steps",      "--warmup", "--schedules",
        "--microbatches", "--balance", "--precisions", "--set",    "--placement"};
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
        if (strcmp(opt, with_value[k]) == 0) {
            return 1;
        }
    }
    return 0;
}

static int name_index(const char *const *names, int n, const char *s, size_t len)
{
    for (int i = 0; i < n; i++) {
        if (strlen(names[i]) == len && strncmp(names[i], s, len) == 0) {
            return i;
        }
    }
    return -1;
}

/* A comma list of names (what: the option) into out[] (duplicates dropped).
 * 0, or 2 after printing the usage error. */
static int parse_names(const char *opt, const char *arg, const char *const *names, int n_names,
                       int *out, int *n_out)
{
    *n_out = 0;
    const char *p = arg;
    for (;;) {
        size_t len = strcspn(p, ",");
        int k = name_index(names, n_names, p, len);
        if (k < 0) {
            char item[64];
            snprintf(item, sizeof item, "%.*s", (int)(len < 60 ? len : 60), p);
            char choices[128] = "";
            for (int i = 0; i < n_names; i++) {
                strcat(choices, i ? ", " : "");
                strcat(choices, names[i]);
            }
            return usage_error("%s: unknown value '%s' (one of: %s)", opt, item, choices);
        }
        int dup = 0;
        for (int i = 0; i < *n_out; i++) {
            dup |= out[i] == k;
        }
        if (!dup) {
            out[(*n_out)++] = k;
        }
        if (!p[len]) {
            return 0;
        }
        p += len + 1;
    }
}

/* A comma list of positive integers into out[] (duplicates dropped). */
static int parse_counts(const char *opt, const char *arg, int *out, int *n_out)
{
    *n_out = 0;
    const char *p = arg;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',') || v < 1 || v > 1000000 || errno) {
            return usage_error("%s: '%s' is not a comma list of positive integers", opt, arg);
        }
        int dup = 0;
        for (int i = 0; i < *n_out; i++) {
            dup |= out[i] == (int)v;
        }
        if (!dup) {
            if (*n_out == MMP_BENCH_MAX_LIST) {
                return usage_error("%s: more than %d values", opt, MMP_BENCH_MAX_LIST);
            }
            out[(*n_out)++] = (int)v;
        }
        if (!*end) {
            return 0;
        }
        p = end + 1;
    }
}

static int parse_int(const char *opt, const char *arg, int min, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || errno || v < min || v > 1000000) {
        return usage_error("%s wants a %s integer, got '%s'", opt,
                           min > 0 ? "positive" : "non-negative", arg);
    }
    *out = (int)v;
    return 0;
}

/* NAME[=KEY=VALUE[,KEY=VALUE]...]: commas inside [] or {} stay in the value. */
static int parse_placement(const char *arg, mmp_bench_placement *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->buf = strdup(arg);
    if (!pl->buf) {
        return usage_error("out of memory");
    }
    char *eq = strchr(pl->buf, '=');
    pl->name = pl->buf;
    if (eq) {
        *eq = 0;
    }
    if (!pl->name[0]) {
        return usage_error("--placement '%s': no NAME before '=' (NAME=KEY=VALUE[,KEY=VALUE]...)",
                           arg);
    }
    slugify(pl->name, pl->slug, sizeof pl->slug);
    if (!eq) {
        return 0;
    }
    char *p = eq + 1;
    if (!*p) {
        return usage_error("--placement '%s': no KEY=VALUE after the name "
                           "(NAME=KEY=VALUE[,KEY=VALUE]...)",
                           arg);
    }
    for (;;) {
        char *item = p;
        int depth = 0;
        while (*p && !(*p == ',' && depth == 0)) {
            depth += (*p == '[' || *p == '{') - (*p == ']' || *p == '}');
            p++;
        }
        int last = !*p;
        *p = 0;
        char *ieq = strchr(item, '=');
        size_t klen = ieq ? (size_t)(ieq - item) : 0;
        if (!ieq || klen == 0 ||
            strspn(item, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") !=
                klen) {
            return usage_error("--placement '%s': '%s' is not KEY=VALUE (a dotted plan key, "
                               "e.g. stages.image.split=[2])",
                               arg, item);
        }
        if (pl->n_kv == MMP_BENCH_MAX_KV) {
            return usage_error("--placement '%s': more than %d overrides", arg, MMP_BENCH_MAX_KV);
        }
        if (mmp_bench_grid_key_option(item)) {
            return usage_error("--placement '%s': %.*s is set by %s, not by a placement", arg,
                               (int)klen, item, mmp_bench_grid_key_option(item));
        }
        pl->kv[pl->n_kv++] = item;
        if (last) {
            return 0;
        }
        p++;
    }
}

int mmp_cmd_bench(int argc, char **argv)
{
    static mmp_bench b;
    static mmp_plan plan;
    memset(&b, 0, sizeof b);
    b.steps = 10;
    b.warmup = 3;
    const char *schedules = NULL, *mbs = NULL, *balances = NULL, *precs = NULL;
    int ret = 2, dry_run = 0;
    b.user_sets = calloc((size_t)argc + 1, sizeof *b.user_sets);
    if (!b.user_sets) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc && !mmp_cli_is_option(argv[i + 1]) ? argv[i + 1] : NULL;
        if (mmp_cli_help(a, USAGE)) {
            ret = 0;
            goto exit;
        } else if (strcmp(a, "--force") == 0) {
            b.force = 1;
        } else if (strcmp(a, "--dry-run") == 0) {
            dry_run = 1;
        } else if (strcmp(a, "--no-single") == 0) {
            b.no_single = 1;
        } else if (v && strcmp(a, "--plan") == 0) {
            int rc = mmp_cli_take_plan("bench", USAGE, argv[++i], &b.plan_path);
            if (rc) {
                ret = rc;
                goto exit;
            }
        } else if (v && strcmp(a, "--out") == 0) {
            b.out = argv[++i];
        } else if (v && strcmp(a, "--steps") == 0) {
            if (parse_int(a, argv[++i], 1, &b.steps)) {
                goto exit;
            }
        } else if (v && strcmp(a, "--warmup") == 0) {
            if (parse_int(a, argv[++i], 0, &b.warmup)) {
                goto exit;
            }
        } else if (v && strcmp(a, "--schedules") == 0) {
            schedules = argv[++i];
        } else if (v && strcmp(a, "--microbatches") == 0) {
            mbs = argv[++i];
        } else if (v && strcmp(a, "--balance") == 0) {
            balances = argv[++i];
        } else if (v && strcmp(a, "--precisions") == 0) {
            precs = argv[++i];
        } else if (v && strcmp(a, "--set") == 0) {
            if (!strchr(argv[++i], '=')) {
                usage_error("--set '%s': expected KEY=VALUE", argv[i]);
                goto exit;
            }
            if (mmp_bench_grid_key_option(argv[i])) {
                usage_error("--set '%s': the grid sets this key; use %s", argv[i],
                            mmp_bench_grid_key_option(argv[i]));
                goto exit;
            }
            b.user_sets[b.n_user_sets++] = argv[i];
        } else if (v && strcmp(a, "--placement") == 0) {
            if (b.n_place == MMP_BENCH_MAX_PLACEMENTS) {
                usage_error("more than %d placements", MMP_BENCH_MAX_PLACEMENTS);
                goto exit;
            }
            mmp_bench_placement *pl = &b.place[b.n_place++];
            if (parse_placement(argv[++i], pl)) {
                goto exit;
            }
            for (int k = 0; k + 1 < b.n_place; k++) {
                if (strcmp(b.place[k].slug, pl->slug) == 0) {
                    usage_error("--placement: '%s' and '%s' name the same placement (names "
                                "must differ in [A-Za-z0-9._-])",
                                b.place[k].name, pl->name);
                    goto exit;
                }
            }
        } else if (!v && takes_value(a)) {
            if (i + 1 < argc) {
                mmp_cli_usage_error("bench", USAGE, "%s needs a value, not the option '%s'", a,
                                    argv[i + 1]);
            } else {
                mmp_cli_usage_error("bench", USAGE, "%s needs a value", a);
            }
            goto exit;
        } else {
            int rc = mmp_cli_take_plan("bench", USAGE, a, &b.plan_path);
            if (rc) {
                ret = rc;
                goto exit;
            }
        }
    }
    if (mmp_cli_need_plan("bench", USAGE, b.plan_path)) {
        goto exit;
    }
    if (schedules &&
        parse_names("--schedules", schedules, MMP_BENCH_SCHED_NAMES, 3, b.sched, &b.n_sched)) {
        goto exit;
    }
    if (balances &&
        parse_names("--balance", balances, MMP_BENCH_BALANCE_NAMES, 2, b.bal, &b.n_bal)) {
        goto exit;
    }
    if (mbs && parse_counts("--microbatches", mbs, b.mb, &b.n_mb)) {
        goto exit;
    }
    if (precs && parse_names("--precisions", precs, MMP_BENCH_PREC_NAMES, 3, b.prec, &b.n_prec)) {
        goto exit;
    }
    b.prec_axis = precs != NULL;
    ret = 1;
    /* The plan with the user's overrides: the defaults of the grid, and a
     * plan error reported once rather than by every run. */
    if (mmp_plan_load(&plan, b.plan_path, b.user_sets, b.n_user_sets) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        goto exit;
    }
    if (!b.n_sched) {
        b.sched[b.n_sched++] = plan.train.schedule;
    }
    if (!b.n_mb) {
        b.mb[b.n_mb++] = plan.train.microbatches;
    }
    if (!b.n_bal) {
        b.bal[b.n_bal++] = plan.balance.mode;
    }
    if (!b.n_prec) {
        b.prec[b.n_prec++] = plan.train.precision;
    }
    if (!b.n_place) {
        b.place[0].name = "plan";
        snprintf(b.place[0].slug, sizeof b.place[0].slug, "plan");
        b.n_place = 1;
    }
    char out_buf[1100];
    if (!b.out) {
        const char *base = strrchr(b.plan_path, '/');
        base = base ? base + 1 : b.plan_path;
        size_t len = strlen(base);
        const char *dot = strrchr(base, '.');
        if (dot && dot != base && (strcmp(dot, ".yaml") == 0 || strcmp(dot, ".yml") == 0)) {
            len = (size_t)(dot - base);
        }
        snprintf(out_buf, sizeof out_buf, "runs/bench-%.*s", (int)len, base);
        b.out = out_buf;
    }
    char self[1100];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n >= (ssize_t)sizeof self - 1) {
        fprintf(stderr, "mmpipe bench: cannot find this executable (/proc/self/exe): %s\n",
                strerror(errno));
        goto exit;
    }
    self[n] = 0;
    b.self = self;
    if (mmp_bench_build_grid(&b, &plan) != MMP_OK || mmp_bench_check_runs(&b) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        goto exit;
    }
    if (dry_run) {
        mmp_bench_print_runs(&b, stdout);
        ret = 0;
        goto exit;
    }
    if (mmp_bench_prepare_out(&b) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        goto exit;
    }
    if (!mmp_bench_have_gnuplot()) {
        fprintf(stderr, "mmpipe bench: warning: gnuplot not found (install gnuplot-nox; "
                        "scripts/setup does): the runs go ahead, the charts will not be drawn\n");
    }
    int failed = 0, interrupted = 0;
    mmp_bench_run_all(&b, &failed, &interrupted);
    int bad = 0;
    if (mmp_bench_write_results(&b) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        bad = 1;
    }
    if (interrupted) {
        fprintf(stderr, "mmpipe bench: interrupted; the results so far are in %s\n", b.out);
        ret = 128 + interrupted;
        goto exit;
    }
    int no_charts = 0;
    if (mmp_bench_draw_charts(&b) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        no_charts = 1;
    }
    fprintf(stderr, "mmpipe bench: results in %s/: results.csv, results.md%s\n", b.out,
            no_charts ? " (no charts)" : ", throughput.png, stages.png");
    bad |= no_charts;
    ret = failed || bad ? 1 : 0;
exit:
    mmp_bench_fini(&b);
    free(b.user_sets);
    return ret;
}
