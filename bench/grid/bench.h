/* `mmpipe bench` as a library: a grid of runs over one plan, each run a
 * `mmpipe launch` child, reduced to one row of results. cli/cmd_bench.c
 * parses the command line into an mmp_bench and calls, in order:
 *
 *   mmp_bench_build_grid    the runs (grid.c)
 *   mmp_bench_prepare_out   the bench directory (supervise.c)
 *   mmp_bench_run_all       every run, supervised, reduced and predicted
 *                           (supervise.c, reduce.c)
 *   mmp_bench_write_results results.csv, results.md, the table on stdout (report.c)
 *   mmp_bench_draw_charts   throughput.png, stages.png through gnuplot (charts.c)
 *   mmp_bench_fini
 *
 * A run is only ever what `mmpipe launch` made of it: the bench reads a
 * run's metrics.jsonl (through common/metrics.h) and never writes into a
 * run's files except log.txt (the child's output) and simulate.txt (the
 * prediction). The predicted bubble comes from the schedule simulator
 * called as a function on the run's own measured costs (coordinator/costs.h,
 * mmp_sched_simulate), never from another command's printed text.
 *
 * Errors are returned as mmp_err with a message (mmp_last_error()); progress
 * (one line per run) and warnings go to stderr, prefixed "mmpipe bench: ". */
#ifndef MMP_BENCH_GRID_BENCH_H
#define MMP_BENCH_GRID_BENCH_H

#include <stddef.h>
#include <stdio.h>

#include "common/config.h"
#include "common/err.h"

#define MMP_BENCH_MAX_LIST                                                                         \
    32 /* values per --schedules / --microbatches / --balance / --precisions */
#define MMP_BENCH_MAX_PLACEMENTS 32
#define MMP_BENCH_MAX_KV 32          /* overrides per placement */
#define MMP_BENCH_MAX_STAGE_ROWS 128 /* stage entries (stage x replica) per run */
#define MMP_BENCH_RUN_SETS (16 + 2 * MMP_BENCH_MAX_KV + 64) /* --set values per run */
/* argv of one run's launch: self, launch, plan, --out DIR --force
 * --single-process, two words per --set, NULL */
#define MMP_BENCH_ARGV_MAX (2 * MMP_BENCH_RUN_SETS + 12)

extern const char *const MMP_BENCH_SCHED_NAMES[3];   /* by mmp_schedule */
extern const char *const MMP_BENCH_BALANCE_NAMES[2]; /* by mmp_balance_mode */
extern const char *const MMP_BENCH_PREC_NAMES[3];    /* by mmp_precision */

/* One --placement: NAME[=KEY=VALUE[,KEY=VALUE]...]. */
typedef struct mmp_bench_placement {
    char *buf; /* the argument, cut in place into name and overrides (owned) */
    const char *name;
    char slug[64]; /* name as a directory name */
    int n_kv;
    const char *kv[MMP_BENCH_MAX_KV];
} mmp_bench_placement;

typedef enum mmp_bench_state {
    MMP_BENCH_NOT_RUN = 0,
    MMP_BENCH_OK,
    MMP_BENCH_FAILED,
    MMP_BENCH_INTERRUPTED
} mmp_bench_state;

typedef struct mmp_bench_stage_row {
    char label[48];          /* name, "/replica" when replica > 0 */
    double busy_ms, idle_ms; /* medians over the measured steps */
    double peak_bytes;       /* largest over all steps */
} mmp_bench_stage_row;

typedef struct mmp_bench_run {
    char id[160];
    int single; /* the --single-process baseline */
    int sched;  /* mmp_schedule */
    int mb;
    int place;   /* index into placements; -1 for the baseline */
    int balance; /* mmp_balance_mode */
    int prec;    /* mmp_precision */
    int n_sets;
    char *sets[MMP_BENCH_RUN_SETS]; /* its --set values, owned where owned[] */
    char owned[MMP_BENCH_RUN_SETS];
    /* results */
    mmp_bench_state state;
    char status[320];
    double sps, step_ms, bubble, bubble_pred, efficiency; /* NAN when unknown */
    char placement[256];
    char peak[1024];
    char pred_note[240]; /* why there is no prediction */
    int n_stages;
    mmp_bench_stage_row stages[MMP_BENCH_MAX_STAGE_ROWS];
} mmp_bench_run;

/* The grid (filled by the CLI) and its runs (by mmp_bench_build_grid). */
typedef struct mmp_bench {
    const char *plan_path, *out, *self; /* self: this executable, for the children */
    int steps, warmup, force, no_single;
    int n_sched, sched[MMP_BENCH_MAX_LIST];
    int n_mb, mb[MMP_BENCH_MAX_LIST];
    int n_bal, bal[MMP_BENCH_MAX_LIST];
    int n_prec, prec[MMP_BENCH_MAX_LIST];
    int prec_axis; /* --precisions was given: run ids and labels name the precision */
    int n_place;
    mmp_bench_placement place[MMP_BENCH_MAX_PLACEMENTS];
    int n_user_sets;
    const char **user_sets; /* the caller's */
    int n_runs;
    mmp_bench_run *runs;
} mmp_bench;

/* Frees the runs and the placements' buffers; NULL-safe, idempotent. */
void mmp_bench_fini(mmp_bench *b);

/* ---- the grid (grid.c) ------------------------------------------------------------- */

/* The option that owns kv's key ("job.steps=..." -> "--steps and --warmup")
 * when the grid sets that key itself, else NULL: an override of it would
 * make a row's labels lie, so the CLI refuses it. */
const char *mmp_bench_grid_key_option(const char *kv);

/* Lays out every run and its overrides in b->runs: per precision (the
 * outermost axis), the --single-process baseline in that precision first
 * (plan's schedule and micro-batches) unless b->no_single, then schedules x
 * micro-batch counts x placements x balance modes, outermost first. Every run
 * sets train.precision. MMP_ERR_NOMEM, MMP_ERR_INVALID (too many overrides). */
mmp_err mmp_bench_build_grid(mmp_bench *b, const mmp_plan *plan);

/* Loads the plan with each run's overrides and checks it runnable, as its
 * launch will: a placement's typo or a value one grid point cannot take is
 * refused before any run (and by --dry-run), not found after the baseline
 * ran. The error names the run. */
mmp_err mmp_bench_check_runs(const mmp_bench *b);

/* Fills argv (MMP_BENCH_ARGV_MAX entries, NULL-terminated) with r's
 * `mmpipe launch PLAN --out run_dir --force [--single-process] --set ...`;
 * returns the count. argv borrows every string. */
int mmp_bench_run_argv(const mmp_bench *b, const mmp_bench_run *r, char *run_dir, char **argv);
/* "gpipe m=4 split balance=off", "single-process m=4" (" bf16" after
 * either with a precision axis); returns buf. */
const char *mmp_bench_run_label(const mmp_bench *b, const mmp_bench_run *r, char *buf, size_t n);
/* What --dry-run prints: every run as a launch command line, shell-quoted. */
void mmp_bench_print_runs(const mmp_bench *b, FILE *f);

/* ---- running (supervise.c) ------------------------------------------------------------- */

/* Makes b->out ready: refuses one that holds a bench unless b->force, then
 * removes only what a bench writes (common/fsutil.h, no shell) and makes
 * runs/. MMP_ERR_INVALID (naming --force), MMP_ERR_IO. */
mmp_err mmp_bench_prepare_out(const mmp_bench *b);

/* Runs every run in order, each in its own process group with its output in
 * runs/ID/log.txt, and fills its results (mmp_bench_reduce,
 * mmp_bench_predict). SIGINT / SIGTERM while it runs are passed to the
 * running child's group and stop the grid (*interrupted gets the signal,
 * else 0); the handlers are restored before it returns. *failed is 1 when a
 * run failed. Blocks for the whole grid. */
void mmp_bench_run_all(mmp_bench *b, int *failed, int *interrupted);

/* Starts argv (argv[0] a path, or searched in PATH when search) in its own
 * process group, stdin /dev/null, stdout and stderr into log_path, in cwd
 * (NULL: ours), and waits. Its wait status (0: exit status 0), or -1 when
 * it could not start or be waited for (why says). A signal that arrives
 * meanwhile is passed to its group. */
int mmp_bench_spawn_wait(char *const argv[], const char *log_path, const char *cwd, int search,
                         char *why, size_t why_n);
/* The last non-blank line of a file (progress lines end in \r or \n), at
 * most n-1 characters; "" when none. */
void mmp_bench_last_line(const char *path, char *line, size_t n);

/* ---- reducing a run (reduce.c) ----------------------------------------------------------- */

/* Reduces run_dir/metrics.jsonl into r over the steps after warmup: median
 * samples/s, step time and balance efficiency (the run's own, else busy /
 * (entries x step)), mean bubble, per stage entry median busy and idle and
 * the largest peak memory, the last placement recorded. MMP_OK, or an error
 * whose message is what r->status should say. */
mmp_err mmp_bench_reduce(const char *run_dir, int warmup, mmp_bench_run *r);

/* The bubble the simulator predicts for run r from its own measured costs
 * (coordinator/costs.h: on the placement of its last step), into
 * r->bubble_pred, with the prediction written to run_dir/simulate.txt; on
 * failure r->bubble_pred stays NAN and r->pred_note says why. */
void mmp_bench_predict(const mmp_bench *b, const char *run_dir, mmp_bench_run *r);

/* ---- results (report.c, charts.c) ----------------------------------------------------------- */

/* results.csv and results.md in b->out, and the Markdown table on stdout.
 * MMP_ERR_IO naming the file. */
mmp_err mmp_bench_write_results(const mmp_bench *b);
/* The Markdown table with its notes. */
void mmp_bench_write_md(const mmp_bench *b, FILE *f);
/* The samples/s of the baseline in precision prec (mmp_precision): the one
 * every run of that precision is compared with; NAN when it did not run. */
double mmp_bench_baseline_sps(const mmp_bench *b, int prec);

/* Whether gnuplot is in PATH. */
int mmp_bench_have_gnuplot(void);
/* throughput.dat, stages.dat and charts.gp in b->out, then gnuplot there
 * (gnuplot.log its output). A missing stages chart is a warning. MMP_OK, or
 * an error (nothing finished to chart, files, no gnuplot, gnuplot failed). */
mmp_err mmp_bench_draw_charts(const mmp_bench *b);

#endif
