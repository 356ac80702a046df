/* Running the grid of `mmpipe bench` (bench/grid/bench.h): the bench
 * directory, each run as a `mmpipe launch` child in its own process group
 * (its output in runs/ID/log.txt), signals passed on to it, and the
 * progress line per run. A run's results come from reduce.c. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/grid/bench.h"
#include "common/ckpt.h"
#include "common/fsutil.h"

extern char **environ;

/* What a bench writes into its directory: all a --force removes. */
static const char *const BENCH_FILES[] = {"results.csv", "results.md",     "throughput.png",
                                          "stages.png",  "throughput.dat", "stages.dat",
                                          "charts.gp",   "gnuplot.log",    "runs"};

/* ---- signals and children ------------------------------------------------------------- */

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

/* Starts argv as mmp_bench_spawn_wait says; its pid, or -1 (why says). */
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

int mmp_bench_spawn_wait(char *const argv[], const char *log_path, const char *cwd, int search,
                         char *why, size_t why_n)
{
    pid_t pid = spawn(argv, log_path, cwd, search, why, why_n);
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

void mmp_bench_last_line(const char *path, char *line, size_t n)
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

/* ---- the directory ---------------------------------------------------------------------- */

mmp_err mmp_bench_prepare_out(const mmp_bench *b)
{
    char path[1200];
    int held = 0;
    for (size_t i = 0; i < sizeof BENCH_FILES / sizeof BENCH_FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", b->out, BENCH_FILES[i]);
        held |= access(path, F_OK) == 0;
    }
    if (held && !b->force) {
        return mmp_errorf(MMP_ERR_INVALID, "%s already holds a bench; pass --force to replace it",
                          b->out);
    }
    for (size_t i = 0; held && i < sizeof BENCH_FILES / sizeof BENCH_FILES[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", b->out, BENCH_FILES[i]);
        MMP_TRY(mmp_fs_rmtree(path));
    }
    snprintf(path, sizeof path, "%s/runs", b->out);
    return mmp_mkdirs(path);
}

/* ---- runs ------------------------------------------------------------------------------- */

/* One run: launch, reduce its metrics, predict its bubble. */
static void do_run(const mmp_bench *b, mmp_bench_run *r)
{
    char dir[1200], log[1300], why[600];
    char *argv[MMP_BENCH_ARGV_MAX];
    snprintf(dir, sizeof dir, "%s/runs/%s", b->out, r->id);
    snprintf(log, sizeof log, "%s/log.txt", dir);
    if (mmp_mkdirs(dir) != MMP_OK) {
        r->state = MMP_BENCH_FAILED;
        snprintf(r->status, sizeof r->status, "failed: %s", mmp_last_error());
        return;
    }
    mmp_bench_run_argv(b, r, dir, argv);
    int st = mmp_bench_spawn_wait(argv, log, NULL, 0, why, sizeof why);
    if (g_signal) {
        r->state = MMP_BENCH_INTERRUPTED;
        snprintf(r->status, sizeof r->status, "interrupted");
        return;
    }
    if (st != 0) {
        char last[256];
        mmp_bench_last_line(log, last, sizeof last);
        r->state = MMP_BENCH_FAILED;
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
    if (mmp_bench_reduce(dir, b->warmup, r) != MMP_OK) {
        r->state = MMP_BENCH_FAILED;
        snprintf(r->status, sizeof r->status, "failed: %s", mmp_last_error());
        return;
    }
    r->state = MMP_BENCH_OK;
    snprintf(r->status, sizeof r->status, "ok");
    if (!r->single) { /* one process has no pipeline to simulate */
        mmp_bench_predict(b, dir, r);
    }
}

void mmp_bench_run_all(mmp_bench *b, int *failed, int *interrupted)
{
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    fprintf(stderr, "mmpipe bench: %d runs of %d warm-up + %d measured steps into %s\n", b->n_runs,
            b->warmup, b->steps, b->out);
    *failed = 0;
    for (int i = 0; i < b->n_runs && !g_signal; i++) {
        mmp_bench_run *r = &b->runs[i];
        char label[400], what[400];
        /* a run takes minutes at seed scale: say what runs, and where its
         * progress goes, before waiting on it */
        fprintf(stderr, "[%d/%d] %s: running (its progress: %s/runs/%s/log.txt)\n", i + 1,
                b->n_runs, mmp_bench_run_label(b, r, label, sizeof label), b->out, r->id);
        do_run(b, r);
        if (r->state == MMP_BENCH_OK) {
            snprintf(what, sizeof what, "%.1f samples/s (step %.0f ms)", r->sps, r->step_ms);
        } else {
            snprintf(what, sizeof what, "%s", r->status);
        }
        *failed |= r->state == MMP_BENCH_FAILED;
        fprintf(stderr, "[%d/%d] %s: %s\n", i + 1, b->n_runs,
                mmp_bench_run_label(b, r, label, sizeof label), what);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    *interrupted = g_signal;
}
