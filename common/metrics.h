/* metrics.jsonl: the one module that knows its schema. A run directory's
 * metrics.jsonl holds one JSON object per line, one line per training step,
 * written by the coordinator (pipeline runs) and the single-process trainer;
 * `mmpipe simulate --costs` and `mmpipe bench` read it back through this
 * reader, never by scraping lines.
 *
 * The schema (times in milliseconds; "-" marks a field the single-process
 * trainer does not write):
 *
 *   step             int     steps completed (1 for the first)
 *   loss, itc_loss, itm_loss, lr, grad_norm
 *                    number  the step's loss (ITC + ITM), learning rate, gradient norm
 *   samples_per_s    number  batch / step time
 *   step_ms          number  wall time of the step
 *   data_ms          number  the longest data loading of any process
 *   skipped_samples  int     bad samples left out (data.on_bad_sample: skip)
 *   bubble           number  idle share of the stages' wall time (0 single-process)
 *   loss_scale       number  the loss scale after the step (common/loss_scale.h):
 *                            what the next step multiplies the loss gradient by
 *                            (halved on a skipped step, doubled after
 *                            train.loss_scale_window clean ones; 1 unless fp16)
 *   step_skipped     int     1 when the optimizer step was skipped (an inf/nan
 *                            gradient under fp16: every stage skipped it), else 0
 *   cpu_ms           number  CPU time over the step of all processes (pipeline
 *                            runs: the stages' and the coordinator's)
 *   chained          int     -  pipeline runs: 1 when the step started right
 *                            behind the last one's clip, before its results were
 *                            in (coordinator/steps.c), 0 when it waited for them
 *   stages           list, one object per process:
 *     name           string  "image.0", "text.0", "fusion" ("single" single-process)
 *     replica        int     0 .. replicas - 1
 *     microbatches   int     -  micro-batches this process handled
 *     busy_ms        number  compute, loads and optimizer
 *     idle_ms        number  waiting on peers
 *     wall_ms        number  -  the process's step wall time
 *     data_wait_ms   number  -  waiting on its loader
 *     fwd_ms, bwd_ms number  -  forward, backward per micro-batch (mean over its own)
 *     wgt_ms         number  -  zb-h1: the weight-gradient passes' part of bwd_ms
 *     load_ms        number  -  data_wait_ms per micro-batch: waiting on the loader,
 *                            not its decoding (that runs ahead, on its workers)
 *     max_inflight   int     -  most micro-batches held between F and B (zb-h1: W)
 *     peak_mem_bytes int     peak resident memory (GPU stages: device memory)
 *     cpu_ms         number  CPU time (user + system, all its threads) the process
 *                            used over the step (getrusage: what load does not
 *                            inflate the way it does wall time)
 *     state_bytes    number  -  its parameter arenas (values, gradients, AdamW
 *                            moments, the step accumulator)
 *     act_slots      int     -  the micro-batches whose activations it has room for
 *   balance          object  -  {efficiency: number, placement: string
 *                               ("image.0[0:3):2 image.1[3:6):1 text.0:1 fusion:1",
 *                               coordinator/placement.h), decision: object or null}
 *                               decision (coordinator/steps.c): {action: "replace",
 *                               to: placement, predicted_gain: step now / after - 1,
 *                               reason} or {action: "route", reason}
 *   val_i2t_r1, val_t2i_r1
 *                    number  validation recall@1, on evaluation steps only
 *   restarts         list    -  pipeline runs, on the first step line after a restart
 *                               (the last line for one after it):
 *                               [{n, after_step, from_step, cause}] (coordinator/restart.h)
 *
 * No field carries the hand-off latency between stages or the step's
 * grad-norm + optimizer overhead as such: a reader that needs them must
 * assume them (mmpipe simulate assumes zero). */
#ifndef MMP_COMMON_METRICS_H
#define MMP_COMMON_METRICS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/err.h"

#define MMP_METRICS_MAX_STAGES 1024    /* process entries per step (MMP_SCHED_MAX_STAGES) */
#define MMP_METRICS_PLACEMENT_MAX 1024 /* the placement string, NUL included */

/* Every number is NAN (ints: -1) when its field is absent. */
typedef struct mmp_metrics_stage {
    char name[48];
    int replica;
    int microbatches;
    double busy_ms, idle_ms, wall_ms, data_wait_ms, fwd_ms, bwd_ms, load_ms;
    double wgt_ms; /* zb-h1: the weight passes' part of bwd_ms; NAN when fused */
    int max_inflight;
    double peak_mem_bytes;
    double cpu_ms;      /* CPU time of the process over the step; NAN when absent */
    double state_bytes; /* its parameter arenas (values, gradients, moments); NAN when absent */
    int act_slots;      /* micro-batches' activations it keeps room for; -1 when absent */
} mmp_metrics_stage;

typedef struct mmp_metrics_step {
    int step;
    double loss, itc_loss, itm_loss, lr, grad_norm;
    double samples_per_s, step_ms, data_ms;
    int skipped_samples;
    double bubble;
    double loss_scale; /* NAN when absent (lines written before loss scaling) */
    double cpu_ms;     /* every process's CPU time over the step, the coordinator's included */
    int step_skipped;  /* -1 when absent */
    int chained;       /* -1 when absent (single-process runs, older lines) */
    int has_stages;    /* the line has a "stages" list (every step record does) */
    int n_stages;
    mmp_metrics_stage stages[MMP_METRICS_MAX_STAGES];
    int has_balance;
    double efficiency;
    char placement[MMP_METRICS_PLACEMENT_MAX]; /* "" when absent */
    const char *decision; /* writer only: a JSON object's text, or NULL (null) */
    int has_eval;
    double val_i2t_r1, val_t2i_r1;
    const char *restarts; /* writer only: the "restarts" JSON array's text, or NULL (left out) */
} mmp_metrics_step;

/* Sets every field of m, every stages[] entry included, to "absent" (NAN,
 * -1, 0 flags, ""). */
void mmp_metrics_step_clear(mmp_metrics_step *m);

/* CPU time (user + system, every thread) this process has used so far, in
 * ms (getrusage RUSAGE_SELF); a step's is the difference of two calls. */
double mmp_metrics_cpu_ms(void);

/* ---- reading -------------------------------------------------------------------- */

typedef struct mmp_metrics_reader {
    FILE *f;
    char path[1100];
    char *line;
    size_t cap;
    int lineno; /* of the record last returned */
    struct fy_diag *diag;
} mmp_metrics_reader;

/* Opens path: a metrics.jsonl, or a run directory holding one. MMP_ERR_IO
 * naming the file; mmp_metrics_close is valid after a failure. */
mmp_err mmp_metrics_open(mmp_metrics_reader *r, const char *path);
/* The next record into *m (blank lines skipped): *got 1, or 0 at the end of
 * the file. MMP_ERR_DATA "PATH:LINE[:COLUMN]: why" for a line that is not a
 * record (mmp_metrics_parse). Blocks on file reads only. */
mmp_err mmp_metrics_next(mmp_metrics_reader *r, mmp_metrics_step *m, int *got);
/* NULL-safe, idempotent. */
void mmp_metrics_close(mmp_metrics_reader *r);

/* One line (len bytes, no newline needed) into *m. MMP_ERR_DATA when it is
 * malformed JSON or not an object, when "stages" is not a list of objects
 * with a name, "balance" not an object, or a field is not a finite number
 * (the loss-like fields -- loss, itc_loss, itm_loss, lr, grad_norm, val_* --
 * are then NAN instead: a diverged step is still a record), or an int field
 * is not an integer in int's range. Absent fields, and fields whose value is
 * null (what the writer puts for a number that is not finite), stay absent
 * (see mmp_metrics_step). */
mmp_err mmp_metrics_parse(const char *line, size_t len, mmp_metrics_step *m);

/* ---- writing -------------------------------------------------------------------- */

/* Appends m as one line to f in the order of the schema above and flushes.
 * Absent stage fields (NAN / -1) are left out; balance only when
 * has_balance, val_* only when has_eval. MMP_ERR_IO when the write fails;
 * then the part written is cut off again: the file holds whole lines. */
mmp_err mmp_metrics_write(FILE *f, const mmp_metrics_step *m);
/* Whether f's last line (a run's metrics.jsonl, open for appending) is
 * step's and holds no evaluation: *at is where it starts, else -1 (no line,
 * another step's, or evaluated). MMP_ERR_IO, or the parser's error. */
mmp_err mmp_metrics_eval_pending(FILE *f, int step, off_t *at);
/* Puts an evaluation's recall into f's last line, which starts at `at`
 * (mmp_metrics_eval_pending) and has none, as its writer would have placed them;
 * every other byte of the line stays (the reader keeps not all of them). */
mmp_err mmp_metrics_add_eval(FILE *f, off_t at, double i2t, double t2i);
/* Adds restart records (array: a JSON array, mmp_restart_field's) to f's
 * last line: into its "restarts" when it has one, else as that field. For
 * restarts no later step line will carry (one during the final evaluation,
 * after the last step's line). */
mmp_err mmp_metrics_add_restarts(FILE *f, const char *array);
/* MMP_OK when f is still <run_dir>/metrics.jsonl; else (the run directory
 * removed, or the file replaced) MMP_ERR_IO saying so: a run checks it each
 * step, so it stops rather than write on into a file nobody can see. */
mmp_err mmp_metrics_same_file(FILE *f, const char *run_dir);

/* ---- continuing a run's file ---------------------------------------------
 * How a run opens its metrics.jsonl, so that a resumed or restarted run
 * continues the record instead of repeating it: the lines of steps after
 * the checkpoint it resumes from are dropped (their steps are trained
 * again), every earlier line is kept, never reordered or edited. */

/* Opens <run_dir>/metrics.jsonl for appending step lines. keep_steps < 0:
 * a new run, the file starts empty. keep_steps >= 0: the lines whose step is
 * <= keep_steps are kept, in order; later steps, and a last line a killed
 * writer left incomplete, are dropped (rewritten through mmp_atomic_file,
 * durably, so a crash leaves either the old or the new file). A missing
 * file is created. *out is the caller's to fclose; it reads too
 * (mmp_metrics_last). */
mmp_err mmp_metrics_continue(const char *run_dir, int keep_steps, FILE **out);

/* The step of one metrics line ({"step":N,...}), -1 when it has none. */
long mmp_metrics_line_step(const char *line);

/* What a finished run says last: from run_dir's metrics.jsonl, the median
 * samples/s over every step but the first (it warms up) and the last
 * evaluation's recall, as "median 594 samples/s (steps 2-400); val recall@1
 * image->text 0.805, text->image 0.809 (step 400)". Writes "" into out when
 * the file has no step to tell of or cannot be read (the run's own outcome
 * does not depend on it). */
void mmp_metrics_summary(const char *run_dir, char *out, size_t n);

#endif
