/* mmpipe bench: a grid of runs over one plan. Every schedule x micro-batch
 * count x placement x balance mode is one `mmpipe launch` of this same
 * executable (a child process in its own process group, its output in
 * runs/ID/log.txt), plus one --single-process run as the baseline. Each
 * run's metrics.jsonl is reduced to medians over the measured steps,
 * `mmpipe simulate --costs RUN` adds the bubble those costs predict, and the
 * grid is written as results.csv, results.md and gnuplot charts.
 *
 * It never trains anything itself and never touches a run's files other
 * than reading them: a run is only ever what `mmpipe launch` made of it. */
#include <errno.h>
#include <fcntl.h>
#include <libfyaml.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/ckpt.h"
#include "common/config.h"
#include "common/fsutil.h"

extern char **environ;

static const char USAGE[] =
    "usage: mmpipe bench PLAN.yaml [--out DIR] [--force] [--steps N] [--warmup W]\n"
    "                    [--schedules LIST] [--microbatches LIST] [--balance LIST]\n"
    "                    [--placement NAME[=KEY=VALUE[,KEY=VALUE]...]]... [--set KEY=VALUE]...\n"
    "                    [--no-single] [--dry-run]\n"
    "\n"
    "Runs the plan over a grid: each schedule x micro-batch count x placement x\n"
    "balance mode is one `mmpipe launch` (its own processes; W warm-up steps,\n"
    "then N measured ones; evaluation and checkpoints only after the last),\n"
    "and one --single-process run (the plan's own schedule and micro-batches)\n"
    "is the baseline. From each run's metrics.jsonl, over the measured steps:\n"
    "median samples/s and step time, mean bubble (idle share), median balance\n"
    "efficiency (the run's balance.efficiency when it reports one, else the\n"
    "stages' busy time / (stages x step time)), each stage's largest peak\n"
    "memory; and the bubble `mmpipe simulate --costs RUN` predicts from the\n"
    "run's own costs (empty when simulate cannot model the run). Writes into DIR:\n"
    "  results.csv     one row per run: run_id, schedule, microbatches, placement,\n"
    "                  balance, samples_per_s, ratio_to_single (samples/s over the\n"
    "                  baseline's), step_ms, bubble_measured, bubble_predicted,\n"
    "                  balance_efficiency, peak_mem, status (ok | failed: ...)\n"
    "  results.md      the same as a Markdown table (also printed on stdout)\n"
    "  throughput.png  samples/s against micro-batches, one line per schedule,\n"
    "                  placement and balance mode; the baseline dashed\n"
    "  stages.png      each stage's busy and idle ms per step (medians), one group\n"
    "                  per placement, at the first schedule, the most micro-batches\n"
    "                  and the first balance mode\n"
    "  runs/ID/        each run's directory as launch wrote it (metrics.jsonl,\n"
    "                  trace.json, ...), with log.txt (its output) and\n"
    "                  simulate.txt\n"
    "A failed run is reported in its row and the grid goes on. The charts are\n"
    "drawn by gnuplot (charts.gp and its .dat files stay in DIR).\n"
    "\n"
    "options:\n"
    "  --out DIR          bench directory (default runs/bench-<plan file name>)\n"
    "  --force            replace DIR's earlier results and runs\n"
    "  --steps N          measured steps per run (default 10)\n"
    "  --warmup W         steps before them, not counted (default 3)\n"
    "  --schedules LIST   comma list of gpipe, 1f1b (default: train.schedule)\n"
    "  --microbatches LIST\n"
    "                     comma list of micro-batch counts (default:\n"
    "                     train.microbatches)\n"
    "  --placement NAME[=KEY=VALUE[,KEY=VALUE]...]\n"
    "                     one placement: its name and the plan overrides that\n"
    "                     make it, e.g. split=stages.image.split=[2] or\n"
    "                     2/2/2=stages.image.replicas=2,stages.text.replicas=2,...\n"
    "                     (commas inside [] or {} belong to the value; NAME alone:\n"
    "                     the plan's own placement). Repeatable; default one\n"
    "                     placement \"plan\" without overrides\n"
    "  --balance LIST     comma list of off, dynamic (default: balance.mode)\n"
    "  --set KEY=VALUE    override a plan key in every run, the baseline too\n"
    "                     (repeatable; applied after the grid's own overrides).\n"
    "                     The keys the grid sets (job.steps, train.schedule,\n"
    "                     train.microbatches, balance.mode, train.eval_every,\n"
    "                     train.ckpt_every) are refused here and in placements\n"
    "  --no-single        no baseline run (ratio_to_single stays empty)\n"
    "  --dry-run          print the runs, as launch command lines, and exit\n"
    "  --plan PLAN.yaml   the plan, as an option\n"
    "  -h, --help         this text\n"
    "\n"
    "Progress, one line per run, goes to stderr. Ctrl-C (SIGINT) is passed to\n"
    "the running child, which stops its stages and cleans up; the results so\n"
    "far are written and bench exits 130.\n"
    "\n"
    "Exit status: 0 every run ok, 1 a run failed (or the plan, DIR or gnuplot\n"
    "did), 2 usage error, 130 interrupted.\n";

#define MAX_LIST 32 /* values per --schedules / --microbatches / --balance */
#define MAX_PLACEMENTS 32
#define MAX_KV 32          /* overrides per placement */
#define MAX_STAGE_ROWS 128 /* stage entries (stage x replica) per run */
#define RUN_ARGS_MAX (16 + 2 * MAX_KV)

static const char *const BENCH_FILES[] = {"results.csv", "results.md",     "throughput.png",
                                          "stages.png",  "throughput.dat", "stages.dat",
                                          "charts.gp",   "gnuplot.log",    "runs"};

typedef struct placement {
    char *buf; /* the argument, cut in place into name and overrides */
    const char *name;
    char slug[64]; /* name as a directory name */
    int n_kv;
    const char *kv[MAX_KV];
} placement;

typedef enum run_state { RUN_NOT_RUN = 0, RUN_OK, RUN_FAILED, RUN_INTERRUPTED } run_state;

typedef struct stage_row {
    char label[48];          /* name, "/replica" when replica > 0 */
    double busy_ms, idle_ms; /* medians over the measured steps */
    double peak_bytes;       /* largest over all steps */
} stage_row;

typedef struct run {
    char id[160];
    int single; /* the --single-process baseline */
    int sched;  /* mmp_schedule */
    int mb;
    int place;   /* index into placements; -1 for the baseline */
    int balance; /* mmp_balance_mode */
    int n_sets;
    char *sets[RUN_ARGS_MAX + 64]; /* its --set values, owned where owned[] */
    char owned[RUN_ARGS_MAX + 64];
    /* results */
    run_state state;
    char status[320];
    double sps, step_ms, bubble, bubble_pred, efficiency; /* NAN when unknown */
    char placement[256];
    char peak[1024];
    char pred_note[240]; /* why there is no prediction */
    int n_stages;
    stage_row stages[MAX_STAGE_ROWS];
} run;

typedef struct bench {
    const char *plan_path, *out, *self;
    int steps, warmup, force, dry_run, no_single;
    int n_sched, sched[MAX_LIST];
    int n_mb, mb[MAX_LIST];
    int n_bal, bal[MAX_LIST];
    int n_place;
    placement place[MAX_PLACEMENTS];
    int n_user_sets;
    const char **user_sets;
    int n_runs;
    run *runs;
} bench;

static const char *const SCHED_NAMES[] = {"gpipe", "1f1b"};
static const char *const BALANCE_NAMES[] = {"off", "dynamic"};

/* ---- signals and children --------------------------------------------------------------- */

static volatile sig_atomic_t g_signal; /* the first SIGINT / SIGTERM received */
static volatile sig_atomic_t g_child;  /* process group of the running child, 0 when none */

/* Passes the signal to the child's whole group (coordinator and stages),
 * as a terminal's Ctrl-C would; the child cleans up and exits. */
static void on_signal(int sig)
{
    if (!g_signal) {
        g_signal = sig;
    }
    pid_t c = (pid_t)g_child;
    if (c > 0) {
        kill(-c, sig);
    }
}

/* Starts argv (argv[0] a path, or a name searched in PATH when search) in its
 * own process group with stdin from /dev/null and stdout and stderr into
 * log_path (truncated), in directory cwd (NULL: ours). Returns its pid, or
 * -1 with the reason in why. Does not wait. */
static pid_t spawn(char *const argv[], const char *log_path, const char *cwd, int search, char *why,
                   size_t why_n)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, def;
    pid_t pid = -1;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    sigemptyset(&none);
    sigemptyset(&def);
    sigaddset(&def, SIGINT);
    sigaddset(&def, SIGTERM);
    sigaddset(&def, SIGPIPE);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &def);
    int e = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (!e) {
        e = posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (!e) {
        e = posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    if (!e && cwd) {
        e = posix_spawn_file_actions_addchdir_np(&fa, cwd);
    }
    if (!e) {
        e = search ? posix_spawnp(&pid, argv[0], &fa, &at, argv, environ)
                   : posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
    }
    if (e) {
        snprintf(why, why_n, "cannot start %s: %s", argv[0], strerror(e));
        pid = -1;
    } else {
        g_child = pid;
        if (g_signal) { /* arrived before g_child was set */
            kill(-pid, g_signal);
        }
    }
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Waits for pid (blocks); returns its wait status, or -1. */
static int wait_child(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            g_child = 0;
            return -1;
        }
    }
    g_child = 0;
    return st;
}

/* ---- small text helpers ------------------------------------------------------------------ */

/* The last non-blank line of a file (progress lines end in \r or \n), at
 * most n-1 characters; "" when none. */
static void last_line(const char *path, char *line, size_t n)
{
    line[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        return;
    }
    char buf[4096];
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
    long from = size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = 0;
    while (len > 0 && strchr(" \t\r\n", buf[len - 1])) {
        buf[--len] = 0;
    }
    size_t start = len;
    while (start > 0 && buf[start - 1] != '\n' && buf[start - 1] != '\r') {
        start--;
    }
    const char *s = buf + start;
    s += strspn(s, " \t");
    snprintf(line, n, "%s", s);
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
            if (*n_out == MAX_LIST) {
                return usage_error("%s: more than %d values", opt, MAX_LIST);
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

/* The option that owns kv's key when the grid sets it itself (an override
 * of it would make a row's labels lie), else NULL. */
static const char *grid_key_option(const char *kv)
{
    static const char *const keys[][2] = {
        {"job.steps", "--steps and --warmup"},    {"train.schedule", "--schedules"},
        {"train.microbatches", "--microbatches"}, {"balance.mode", "--balance"},
        {"train.eval_every", "bench (0)"},        {"train.ckpt_every", "bench (0)"},
    };
    size_t len = strcspn(kv, "=");
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strlen(keys[i][0]) == len && strncmp(kv, keys[i][0], len) == 0) {
            return keys[i][1];
        }
    }
    return NULL;
}

/* NAME[=KEY=VALUE[,KEY=VALUE]...]: commas inside [] or {} stay in the value. */
static int parse_placement(const char *arg, placement *pl)
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
        if (pl->n_kv == MAX_KV) {
            return usage_error("--placement '%s': more than %d overrides", arg, MAX_KV);
        }
        if (grid_key_option(item)) {
            return usage_error("--placement '%s': %.*s is set by %s, not by a placement", arg,
                               (int)klen, item, grid_key_option(item));
        }
        pl->kv[pl->n_kv++] = item;
        if (last) {
            return 0;
        }
        p++;
    }
}

/* ---- the grid ------------------------------------------------------------------------------ */

static int run_add_set(run *r, const char *s, int own)
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

static int run_add_setf(run *r, const char *key, const char *val)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s=%s", key, val);
    return run_add_set(r, buf, 1);
}

static void runs_free(bench *b)
{
    for (int i = 0; i < b->n_runs; i++) {
        for (int k = 0; k < b->runs[i].n_sets; k++) {
            if (b->runs[i].owned[k]) {
                free(b->runs[i].sets[k]);
            }
        }
    }
    free(b->runs);
    b->runs = NULL;
}

/* Lays out every run and its overrides: the baseline first, then schedules,
 * micro-batch counts, placements and balance modes, outermost first. */
static int build_grid(bench *b, const mmp_plan *plan)
{
    int n = (b->no_single ? 0 : 1) + b->n_sched * b->n_mb * b->n_place * b->n_bal;
    b->runs = calloc((size_t)n, sizeof *b->runs);
    if (!b->runs) {
        fprintf(stderr, "mmpipe bench: out of memory for %d runs\n", n);
        return 1;
    }
    char steps[32];
    snprintf(steps, sizeof steps, "%d", b->warmup + b->steps);
    for (int i = 0; i < n; i++) {
        run *r = &b->runs[b->n_runs++];
        r->sps = r->step_ms = r->bubble = r->bubble_pred = r->efficiency = NAN;
        snprintf(r->status, sizeof r->status, "not run");
        int g = i - (b->no_single ? 0 : 1);
        int err = run_add_setf(r, "job.steps", steps) | run_add_set(r, "train.eval_every=0", 0) |
                  run_add_set(r, "train.ckpt_every=0", 0);
        if (g < 0) {
            r->single = 1;
            r->sched = plan->train.schedule;
            r->mb = plan->train.microbatches;
            r->place = -1;
            r->balance = MMP_BALANCE_OFF; /* one process has nothing to balance */
            snprintf(r->id, sizeof r->id, "single");
            err |= run_add_set(r, "balance.mode=off", 0);
        } else {
            int bi = g % b->n_bal, pi = g / b->n_bal % b->n_place,
                mi = g / (b->n_bal * b->n_place) % b->n_mb,
                si = g / (b->n_bal * b->n_place * b->n_mb);
            r->sched = b->sched[si];
            r->mb = b->mb[mi];
            r->place = pi;
            r->balance = b->bal[bi];
            snprintf(r->id, sizeof r->id, "%s-m%d-%s-%s", SCHED_NAMES[r->sched], r->mb,
                     b->place[pi].slug, BALANCE_NAMES[r->balance]);
            char mb[32];
            snprintf(mb, sizeof mb, "%d", r->mb);
            err |= run_add_setf(r, "train.schedule", SCHED_NAMES[r->sched]) |
                   run_add_setf(r, "train.microbatches", mb);
            for (int k = 0; k < b->place[pi].n_kv; k++) {
                err |= run_add_set(r, b->place[pi].kv[k], 0);
            }
            err |= run_add_setf(r, "balance.mode", BALANCE_NAMES[r->balance]);
        }
        for (int k = 0; k < b->n_user_sets; k++) {
            err |= run_add_set(r, b->user_sets[k], 0);
        }
        if (err) {
            fprintf(stderr, "mmpipe bench: too many overrides for run %s\n", r->id);
            return 1;
        }
    }
    return 0;
}

/* Fills argv (NULL-terminated; argv[0] is self) with r's `mmpipe launch
 * --out run_dir`, or with `mmpipe simulate --costs run_dir` when simulate,
 * and the same overrides. Returns the count; argv borrows every string. */
static int run_argv(const bench *b, const run *r, int simulate, char *run_dir, char **argv)
{
    int n = 0;
    argv[n++] = (char *)b->self;
    argv[n++] = simulate ? "simulate" : "launch";
    argv[n++] = (char *)b->plan_path;
    if (simulate) {
        argv[n++] = "--costs";
        argv[n++] = run_dir;
    } else {
        argv[n++] = "--out";
        argv[n++] = run_dir;
        argv[n++] = "--force";
        if (r->single) {
            argv[n++] = "--single-process";
        }
    }
    for (int k = 0; k < r->n_sets; k++) {
        argv[n++] = "--set";
        argv[n++] = r->sets[k];
    }
    argv[n] = NULL;
    return n;
}

static const char *run_label(const bench *b, const run *r, char *buf, size_t n)
{
    if (r->single) {
        snprintf(buf, n, "single-process m=%d", r->mb);
    } else {
        snprintf(buf, n, "%s m=%d %s balance=%s", SCHED_NAMES[r->sched], r->mb,
                 b->place[r->place].name, BALANCE_NAMES[r->balance]);
    }
    return buf;
}

/* ---- reading a run's metrics ------------------------------------------------------------ */

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median (sorts in place); NAN when empty. */
static double median(series *s)
{
    if (s->n == 0) {
        return NAN;
    }
    qsort(s->v, (size_t)s->n, sizeof *s->v, cmp_double);
    return s->n % 2 ? s->v[s->n / 2] : 0.5 * (s->v[s->n / 2 - 1] + s->v[s->n / 2]);
}

static double mean(const series *s)
{
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        sum += s->v[i];
    }
    return s->n ? sum / s->n : NAN;
}

typedef struct stage_acc {
    char label[48];
    series busy, idle;
    double peak;
} stage_acc;

typedef struct acc {
    series sps, step, bubble, eff;
    int n_stages;
    stage_acc stages[MAX_STAGE_ROWS];
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

/* One step record into a; measured: past the warm-up. Returns NULL, or what
 * is wrong with it. */
static const char *read_record(struct fy_node *root, int measured, acc *a)
{
    double sps, step_ms, bubble, x;
    struct fy_node *stages = fy_node_mapping_lookup_value_by_simple_key(root, "stages", 6);
    if (!stages || !fy_node_is_sequence(stages)) {
        return "no \"stages\" list";
    }
    if (mmp_cli_json_number(root, "samples_per_s", &sps) != 1 || mmp_cli_json_number(root, "step_ms", &step_ms) != 1 ||
        mmp_cli_json_number(root, "bubble", &bubble) != 1) {
        return "no samples_per_s, step_ms or bubble number";
    }
    struct fy_node *bal = fy_node_mapping_lookup_value_by_simple_key(root, "balance", 7);
    if (bal && !fy_node_is_mapping(bal)) {
        bal = NULL;
    }
    if (bal) {
        const char *pl = fy_node_mapping_lookup_scalar0_by_simple_key(bal, "placement", 9);
        if (pl) {
            snprintf(a->placement, sizeof a->placement, "%s", pl);
        }
    }
    double busy_sum = 0;
    int entries = 0;
    void *iter = NULL;
    struct fy_node *item;
    while ((item = fy_node_sequence_iterate(stages, &iter)) != NULL) {
        const char *name = fy_node_is_mapping(item)
                               ? fy_node_mapping_lookup_scalar0_by_simple_key(item, "name", 4)
                               : NULL;
        if (!name) {
            return "a stages entry without a name";
        }
        double replica = 0, busy = 0, idle = 0, peak = 0;
        if (mmp_cli_json_number(item, "replica", &replica) < 0 || mmp_cli_json_number(item, "busy_ms", &busy) < 0 ||
            mmp_cli_json_number(item, "idle_ms", &idle) < 0 || mmp_cli_json_number(item, "peak_mem_bytes", &peak) < 0) {
            return "a stages entry with a field that is not a number";
        }
        char label[48];
        if (replica > 0) {
            snprintf(label, sizeof label, "%s/%d", name, (int)replica);
        } else {
            snprintf(label, sizeof label, "%s", name);
        }
        int k = 0;
        while (k < a->n_stages && strcmp(a->stages[k].label, label) != 0) {
            k++;
        }
        if (k == a->n_stages) {
            if (k == MAX_STAGE_ROWS) {
                return "too many stage entries";
            }
            memset(&a->stages[k], 0, sizeof a->stages[k]);
            snprintf(a->stages[k].label, sizeof a->stages[k].label, "%s", label);
            a->n_stages++;
        }
        stage_acc *s = &a->stages[k];
        s->peak = fmax(s->peak, peak);
        if (measured && (push(&s->busy, busy) || push(&s->idle, idle))) {
            return "out of memory";
        }
        busy_sum += busy;
        entries++;
    }
    if (!measured) {
        return NULL;
    }
    double eff;
    if (mmp_cli_json_number(bal, "efficiency", &x) == 1) {
        eff = x;
    } else {
        eff = entries && step_ms > 0 ? busy_sum / (entries * step_ms) : NAN;
    }
    if (push(&a->sps, sps) || push(&a->step, step_ms) || push(&a->bubble, bubble) ||
        (isfinite(eff) && push(&a->eff, eff))) {
        return "out of memory";
    }
    return NULL;
}

/* Reduces run_dir/metrics.jsonl into r over the steps after warmup.
 * 0 ok, else r->status says what is wrong. */
static int read_metrics(const char *run_dir, int warmup, run *r)
{
    char path[1300];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(r->status, sizeof r->status, "failed: metrics.jsonl: %s", strerror(errno));
        return 1;
    }
    struct fy_diag_cfg dcfg;
    fy_diag_cfg_default(&dcfg);
    dcfg.fp = NULL;
    dcfg.output_fn = mmp_cli_json_quiet;
    dcfg.level = FYET_ERROR;
    struct fy_diag *diag = fy_diag_create(&dcfg);
    static acc a;
    memset(&a, 0, sizeof a);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ret = 1;
    if (!diag) {
        snprintf(r->status, sizeof r->status, "failed: out of memory");
        goto exit;
    }
    for (int lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        while (len > 0 && strchr(" \t\r\n", line[len - 1])) {
            line[--len] = 0;
        }
        if (len == 0) {
            continue;
        }
        struct fy_parse_cfg cfg = {.flags = FYPCF_QUIET | FYPCF_JSON_FORCE, .diag = diag};
        struct fy_document *doc = fy_document_build_from_string(&cfg, line, (size_t)len);
        struct fy_node *root = doc ? fy_document_root(doc) : NULL;
        double step;
        const char *why = NULL;
        if (!root || !fy_node_is_mapping(root)) {
            why = "not a JSON object";
        } else if (mmp_cli_json_number(root, "step", &step) != 1) {
            why = "no step number";
        } else {
            why = read_record(root, step > warmup, &a);
        }
        fy_document_destroy(doc);
        if (why) {
            snprintf(r->status, sizeof r->status, "failed: metrics.jsonl:%d: %s", lineno, why);
            goto exit;
        }
    }
    if (a.sps.n == 0) {
        snprintf(r->status, sizeof r->status,
                 "failed: metrics.jsonl: no step after the %d warm-up steps", warmup);
        goto exit;
    }
    r->sps = median(&a.sps);
    r->step_ms = median(&a.step);
    r->bubble = mean(&a.bubble);
    r->efficiency = median(&a.eff);
    if (a.placement[0]) {
        snprintf(r->placement, sizeof r->placement, "%s", a.placement);
    }
    r->n_stages = a.n_stages;
    size_t used = 0;
    r->peak[0] = 0;
    for (int k = 0; k < a.n_stages; k++) {
        stage_row *s = &r->stages[k];
        snprintf(s->label, sizeof s->label, "%s", a.stages[k].label);
        s->busy_ms = median(&a.stages[k].busy);
        s->idle_ms = median(&a.stages[k].idle);
        s->peak_bytes = a.stages[k].peak;
        int w = snprintf(r->peak + used, sizeof r->peak - used, "%s%s:%.1fMB", k ? " " : "",
                         s->label, s->peak_bytes / 1e6);
        if (w < 0 || (size_t)w >= sizeof r->peak - used) {
            r->peak[used] = 0; /* keep whole entries only */
            break;
        }
        used += (size_t)w;
    }
    ret = 0;
exit:
    acc_fini(&a);
    free(line);
    if (diag) {
        fy_diag_destroy(diag);
    }
    fclose(f);
    return ret;
}

/* The bubble `mmpipe simulate` printed into path ("... bubble 45.8%"), as a
 * fraction; NAN when there is none. */
static double parse_predicted_bubble(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return NAN;
    }
    char line[1024];
    double v = NAN;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, ", bubble ");
        if (strncmp(line, "predicted step time ", 20) == 0 && p) {
            char *end;
            double x = strtod(p + 9, &end);
            if (end != p + 9 && *end == '%' && isfinite(x)) {
                v = x / 100;
            }
        }
    }
    fclose(f);
    return v;
}

/* ---- running ------------------------------------------------------------------------------ */

/* Spawns argv with its output in log and waits. 0 exit status 0; -1 could
 * not start (why says); else the wait status. */
static int run_child(char *const argv[], const char *log, char *why, size_t why_n)
{
    pid_t pid = spawn(argv, log, NULL, 0, why, why_n);
    if (pid < 0) {
        return -1;
    }
    int st = wait_child(pid);
    if (st < 0) {
        snprintf(why, why_n, "waitpid: %s", strerror(errno));
        return -1;
    }
    return st;
}

/* One run: launch, read its metrics, predict its bubble. */
static void do_run(const bench *b, run *r)
{
    char dir[1200], log[1300], sim[1300], why[600];
    char *argv[2 * (RUN_ARGS_MAX + 64) + 12];
    snprintf(dir, sizeof dir, "%s/runs/%s", b->out, r->id);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    snprintf(sim, sizeof sim, "%s/simulate.txt", dir);
    if (mmp_mkdirs(dir) != MMP_OK) {
        r->state = RUN_FAILED;
        snprintf(r->status, sizeof r->status, "failed: %s", mmp_last_error());
        return;
    }
    run_argv(b, r, 0, dir, argv);
    int st = run_child(argv, log, why, sizeof why);
    if (g_signal) {
        r->state = RUN_INTERRUPTED;
        snprintf(r->status, sizeof r->status, "interrupted");
        return;
    }
    if (st != 0) {
        char last[256];
        last_line(log, last, sizeof last);
        r->state = RUN_FAILED;
        if (st == -1) {
            snprintf(r->status, sizeof r->status, "failed: %.300s", why);
        } else if (last[0]) {
            snprintf(r->status, sizeof r->status, "failed: %s", last);
        } else if (WIFSIGNALED(st)) {
            snprintf(r->status, sizeof r->status, "failed: killed by signal %d", WTERMSIG(st));
        } else {
            snprintf(r->status, sizeof r->status, "failed: exit status %d", WEXITSTATUS(st));
        }
        return;
    }
    if (read_metrics(dir, b->warmup, r) != 0) {
        r->state = RUN_FAILED;
        return;
    }
    r->state = RUN_OK;
    snprintf(r->status, sizeof r->status, "ok");
    if (r->single) {
        return; /* nothing to simulate: one process has no pipeline */
    }
    run_argv(b, r, 1, dir, argv);
    st = run_child(argv, sim, why, sizeof why);
    if (g_signal) {
        return;
    }
    r->bubble_pred = st == 0 ? parse_predicted_bubble(sim) : NAN;
    if (isnan(r->bubble_pred)) {
        char last[200];
        last_line(sim, last, sizeof last);
        snprintf(r->pred_note, sizeof r->pred_note, "%.230s",
                 st == -1  ? why
                 : last[0] ? last
                           : "simulate printed no bubble");
    }
}

/* ---- results ------------------------------------------------------------------------------ */

static double baseline_sps(const bench *b)
{
    for (int i = 0; i < b->n_runs; i++) {
        if (b->runs[i].single && b->runs[i].state == RUN_OK) {
            return b->runs[i].sps;
        }
    }
    return NAN;
}

static const char *placement_of(const bench *b, const run *r)
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

static int write_csv(const bench *b, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "mmpipe bench: %s: %s\n", path, strerror(errno));
        return 1;
    }
    fputs("run_id,schedule,microbatches,placement,balance,samples_per_s,ratio_to_single,step_ms,"
          "bubble_measured,bubble_predicted,balance_efficiency,peak_mem,status\n",
          f);
    double base = baseline_sps(b);
    for (int i = 0; i < b->n_runs; i++) {
        const run *r = &b->runs[i];
        char t[9][64];
        snprintf(t[0], sizeof t[0], "%d", r->mb);
        csv_field(f, r->id, 0);
        csv_field(f, SCHED_NAMES[r->sched], 0);
        csv_field(f, t[0], 0);
        csv_field(f, placement_of(b, r), 0);
        csv_field(f, BALANCE_NAMES[r->balance], 0);
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
        fprintf(stderr, "mmpipe bench: %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
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

static void write_md(const bench *b, FILE *f)
{
    double base = baseline_sps(b);
    fprintf(f, "| run | schedule | micro-batches | placement | balance | samples/s | x single | "
               "step ms | bubble | predicted bubble | balance efficiency | peak memory | status |\n"
               "|---|---|--:|---|---|--:|--:|--:|--:|--:|--:|---|---|\n");
    int notes = 0;
    for (int i = 0; i < b->n_runs; i++) {
        const run *r = &b->runs[i];
        char t[64];
        fputs("|", f);
        md_cell(f, r->id);
        md_cell(f, r->single ? "single-process" : SCHED_NAMES[r->sched]);
        snprintf(t, sizeof t, "%d", r->mb);
        md_cell(f, t);
        md_cell(f, placement_of(b, r));
        md_cell(f, r->single ? "" : BALANCE_NAMES[r->balance]);
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
    fprintf(f,
            "\n%d warm-up + %d measured steps per run; medians over the measured steps (bubble: "
            "mean); x single: samples/s over the single-process baseline's.\n",
            b->warmup, b->steps);
}

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

/* throughput.dat: one block per (schedule, placement, balance) series with
 * at least one finished run; the plot command for them goes into gp. */
static int throughput_chart(const bench *b, FILE *dat, FILE *gp)
{
    double base = baseline_sps(b);
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
    for (int s = 0; s < b->n_sched; s++) {
        for (int p = 0; p < b->n_place; p++) {
            for (int k = 0; k < b->n_bal; k++) {
                int points = 0;
                for (int i = 0; i < b->n_runs; i++) {
                    const run *r = &b->runs[i];
                    if (!r->single && r->state == RUN_OK && r->sched == b->sched[s] &&
                        r->place == p && r->balance == b->bal[k]) {
                        if (!points) {
                            fprintf(dat, "%s# %s %s balance=%s\n", block ? "\n\n" : "",
                                    SCHED_NAMES[b->sched[s]], b->place[p].name,
                                    BALANCE_NAMES[b->bal[k]]);
                        }
                        fprintf(dat, "%d %.6g\n", r->mb, r->sps);
                        points++;
                    }
                }
                if (!points) {
                    continue;
                }
                char title[256];
                snprintf(title, sizeof title, "%s, %s, balance %s", SCHED_NAMES[b->sched[s]],
                         b->place[p].name, BALANCE_NAMES[b->bal[k]]);
                fprintf(gp,
                        "%s 'throughput.dat' index %d using 1:2 with linespoints lw 2 pt 7 "
                        "title ",
                        block ? ", \\\n    " : "", block);
                gp_str(gp, title);
                block++;
            }
        }
    }
    if (isfinite(base)) {
        fprintf(gp, "%s %.6g with lines dt 2 lw 2 lc rgb 'black' title 'single process'",
                block ? ", \\\n    " : "", base);
        block++;
    }
    fprintf(gp, "\n");
    return block;
}

/* stages.dat: per placement one block of "stage busy idle" (ms per step) for
 * its run at the first schedule, the most micro-batches, the first balance
 * mode; rowstacked bars, one group per placement. */
static int stages_chart(const bench *b, FILE *dat, FILE *gp)
{
    int hi = b->mb[0];
    for (int i = 1; i < b->n_mb; i++) {
        hi = b->mb[i] > hi ? b->mb[i] : hi;
    }
    int blocks = 0;
    fprintf(gp,
            "set output 'stages.png'\n"
            "set title 'busy and idle time per step (median) of each stage, by placement: %s, %d "
            "micro-batches, balance %s'\n"
            "unset logscale x\nset xrange [*:*]\nset yrange [0:*]\nset xtics auto\n"
            "unset xlabel\nset ylabel 'ms per step'\nset bmargin 5\n"
            "unset grid\nset grid ytics\nset key outside right top\n"
            "set style data histograms\nset style histogram rowstacked title offset 0,-1\n"
            "set style fill solid 0.8 border -1\nset boxwidth 0.75\nset xtics rotate by -30\n"
            "plot",
            SCHED_NAMES[b->sched[0]], hi, BALANCE_NAMES[b->bal[0]]);
    for (int p = 0; p < b->n_place; p++) {
        const run *r = NULL;
        for (int i = 0; i < b->n_runs; i++) {
            const run *c = &b->runs[i];
            if (!c->single && c->state == RUN_OK && c->sched == b->sched[0] && c->mb == hi &&
                c->place == p && c->balance == b->bal[0] && c->n_stages > 0) {
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

/* Where gnuplot is in PATH; 0 when it is not. */
static int have_gnuplot(void)
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

/* Writes the charts' data and script into DIR and runs gnuplot there.
 * 0 ok (or nothing to draw), 1 error (printed). */
static int draw_charts(const bench *b)
{
    char dat1[1200], dat2[1200], gpp[1200], log[1200], why[600];
    snprintf(dat1, sizeof dat1, "%s/throughput.dat", b->out);
    snprintf(dat2, sizeof dat2, "%s/stages.dat", b->out);
    snprintf(gpp, sizeof gpp, "%s/charts.gp", b->out);
    snprintf(log, sizeof log, "%s/gnuplot.log", b->out);
    FILE *t = fopen(dat1, "w"), *s = fopen(dat2, "w"), *gp = fopen(gpp, "w");
    int ret = 1;
    if (!t || !s || !gp) {
        fprintf(stderr, "mmpipe bench: cannot write the chart files in %s: %s\n", b->out,
                strerror(errno));
        goto exit;
    }
    fprintf(gp, "# mmpipe bench charts: run `gnuplot charts.gp` in this directory.\n"
                "set terminal pngcairo noenhanced size 1100,600 font 'sans,10'\n");
    int lines = throughput_chart(b, t, gp);
    if (!lines) {
        fprintf(stderr, "mmpipe bench: no finished run to chart\n");
        goto exit;
    }
    if (!stages_chart(b, s, gp)) {
        fprintf(stderr, "mmpipe bench: stages.png not drawn: no finished run at the first "
                        "schedule, the most micro-batches and the first balance mode\n");
    }
    int bad = fclose(t) | fclose(s) | fclose(gp);
    t = s = gp = NULL;
    if (bad) {
        fprintf(stderr, "mmpipe bench: cannot write the chart files in %s\n", b->out);
        goto exit;
    }
    if (!have_gnuplot()) {
        fprintf(stderr,
                "mmpipe bench: gnuplot not found: install gnuplot-nox (scripts/setup "
                "does); the charts' data and script are in %s\n",
                b->out);
        goto exit;
    }
    char *argv[] = {"gnuplot", "charts.gp", NULL};
    pid_t pid = spawn(argv, log, b->out, 1, why, sizeof why);
    int st = pid < 0 ? -1 : wait_child(pid);
    if (st != 0) {
        char last[256];
        last_line(log, last, sizeof last);
        fprintf(stderr, "mmpipe bench: gnuplot failed (%s): %s\n", log,
                pid < 0   ? why
                : last[0] ? last
                          : "no output");
        goto exit;
    }
    ret = 0;
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

/* results.csv, results.md and the table on stdout. 0 ok, 1 error. */
static int write_results(const bench *b)
{
    char csv[1200], md[1200];
    snprintf(csv, sizeof csv, "%s/results.csv", b->out);
    snprintf(md, sizeof md, "%s/results.md", b->out);
    int ret = write_csv(b, csv);
    FILE *f = fopen(md, "w");
    if (!f) {
        fprintf(stderr, "mmpipe bench: %s: %s\n", md, strerror(errno));
        return 1;
    }
    write_md(b, f);
    if (fclose(f) != 0) {
        ret = 1;
    }
    fputs("\n", stdout);
    write_md(b, stdout);
    fflush(stdout);
    return ret;
}

/* ---- the directory ------------------------------------------------------------------------ */

/* Makes DIR ready: refuses one that holds a bench unless force, then removes
 * only what a bench writes. 0 ok, 1 error (printed). */
static int prepare_out(const bench *b)
{
    char path[1200];
    int held = 0;
    for (size_t i = 0; i < sizeof BENCH_FILES / sizeof BENCH_FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", b->out, BENCH_FILES[i]);
        held |= access(path, F_OK) == 0;
    }
    if (held && !b->force) {
        fprintf(stderr, "mmpipe bench: %s already holds a bench; pass --force to replace it\n",
                b->out);
        return 1;
    }
    for (size_t i = 0; held && i < sizeof BENCH_FILES / sizeof BENCH_FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", b->out, BENCH_FILES[i]);
        if (mmp_fs_rmtree(path) != MMP_OK) {
            fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
            return 1;
        }
    }
    snprintf(path, sizeof path, "%s/runs", b->out);
    if (mmp_mkdirs(path) != MMP_OK) {
        fprintf(stderr, "mmpipe bench: %s\n", mmp_last_error());
        return 1;
    }
    return 0;
}

/* ---- entry ---------------------------------------------------------------------------------- */

static void print_runs(const bench *b)
{
    char *argv[2 * (RUN_ARGS_MAX + 64) + 12];
    char dir[1200], label[400];
    printf("%d run%s into %s/runs/, %d warm-up + %d measured steps each:\n", b->n_runs,
           b->n_runs == 1 ? "" : "s", b->out, b->warmup, b->steps);
    for (int i = 0; i < b->n_runs; i++) {
        const run *r = &b->runs[i];
        snprintf(dir, sizeof dir, "%s/runs/%s", b->out, r->id);
        int n = run_argv(b, r, 0, dir, argv);
        printf("[%d/%d] %s\n  mmpipe", i + 1, b->n_runs, run_label(b, r, label, sizeof label));
        for (int k = 1; k < n; k++) {
            fputc(' ', stdout);
            print_word(stdout, argv[k]);
        }
        fputc('\n', stdout);
    }
}

int mmp_cmd_bench(int argc, char **argv)
{
    static bench b;
    static mmp_plan plan;
    memset(&b, 0, sizeof b);
    b.steps = 10;
    b.warmup = 3;
    const char *schedules = NULL, *mbs = NULL, *balances = NULL;
    int ret = 2;
    b.user_sets = calloc((size_t)argc + 1, sizeof *b.user_sets);
    if (!b.user_sets) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(USAGE, stdout);
            ret = 0;
            goto exit;
        } else if (strcmp(a, "--force") == 0) {
            b.force = 1;
        } else if (strcmp(a, "--dry-run") == 0) {
            b.dry_run = 1;
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
        } else if (v && strcmp(a, "--set") == 0) {
            if (!strchr(argv[++i], '=')) {
                usage_error("--set '%s': expected KEY=VALUE", argv[i]);
                goto exit;
            }
            if (grid_key_option(argv[i])) {
                usage_error("--set '%s': the grid sets this key; use %s", argv[i],
                            grid_key_option(argv[i]));
                goto exit;
            }
            b.user_sets[b.n_user_sets++] = argv[i];
        } else if (v && strcmp(a, "--placement") == 0) {
            if (b.n_place == MAX_PLACEMENTS) {
                usage_error("more than %d placements", MAX_PLACEMENTS);
                goto exit;
            }
            placement *pl = &b.place[b.n_place++];
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
    if (schedules && parse_names("--schedules", schedules, SCHED_NAMES, 2, b.sched, &b.n_sched)) {
        goto exit;
    }
    if (balances && parse_names("--balance", balances, BALANCE_NAMES, 2, b.bal, &b.n_bal)) {
        goto exit;
    }
    if (mbs && parse_counts("--microbatches", mbs, b.mb, &b.n_mb)) {
        goto exit;
    }
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
    if (build_grid(&b, &plan)) {
        goto exit;
    }
    if (b.dry_run) {
        print_runs(&b);
        ret = 0;
        goto exit;
    }
    if (prepare_out(&b)) {
        goto exit;
    }
    if (!have_gnuplot()) {
        fprintf(stderr, "mmpipe bench: warning: gnuplot not found (install gnuplot-nox; "
                        "scripts/setup does): the runs go ahead, the charts will not be drawn\n");
    }
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    fprintf(stderr, "mmpipe bench: %d runs of %d warm-up + %d measured steps into %s\n", b.n_runs,
            b.warmup, b.steps, b.out);
    int failed = 0;
    for (int i = 0; i < b.n_runs && !g_signal; i++) {
        run *r = &b.runs[i];
        char label[400], what[400];
        do_run(&b, r);
        if (r->state == RUN_OK) {
            snprintf(what, sizeof what, "%.1f samples/s (step %.0f ms)", r->sps, r->step_ms);
        } else {
            snprintf(what, sizeof what, "%s", r->status);
        }
        failed |= r->state == RUN_FAILED;
        fprintf(stderr, "[%d/%d] %s: %s\n", i + 1, b.n_runs, run_label(&b, r, label, sizeof label),
                what);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    int bad = write_results(&b);
    if (g_signal) {
        fprintf(stderr, "mmpipe bench: interrupted; the results so far are in %s\n", b.out);
        ret = 128 + g_signal;
        goto exit;
    }
    int no_charts = draw_charts(&b);
    fprintf(stderr, "mmpipe bench: results in %s/: results.csv, results.md%s\n", b.out,
            no_charts ? " (no charts)" : ", throughput.png, stages.png");
    bad |= no_charts;
    ret = failed || bad ? 1 : 0;
exit:
    runs_free(&b);
    for (int k = 0; k < b.n_place; k++) {
        free(b.place[k].buf);
    }
    free(b.user_sets);
    return ret;
}
