/* metrics.jsonl: one JSON object per completed step, {"step":N,...} with the
 * step first (readers: cli/cmd_bench.c, cli/cmd_simulate.c, tests).
 *
 * This module owns how a run opens the file, so that a resumed or restarted
 * run continues the record instead of repeating it: the lines of steps after
 * the checkpoint it resumes from are dropped (their steps are trained again),
 * every earlier line is kept. The writers (coordinator/run.c,
 * stages/single.c) format their own lines. */
#ifndef MMP_COMMON_METRICS_H
#define MMP_COMMON_METRICS_H

#include <stdio.h>

#include "common/err.h"

/* Opens <run_dir>/metrics.jsonl for appending step lines. keep_steps < 0:
 * a new run, the file starts empty. keep_steps >= 0: the lines whose step is
 * <= keep_steps are kept, in order; later steps, and a last line a killed
 * writer left incomplete, are dropped (rewritten through a temporary file
 * and a rename, so a crash leaves either the old or the new file). A missing
 * file is created. *out is the caller's to fclose. */
mmp_err mmp_metrics_open(const char *run_dir, int keep_steps, FILE **out);

/* s as the body of a JSON string (quotes, backslashes and control
 * characters escaped) in buf (n bytes; cut short to fit). Returns buf. */
const char *mmp_json_escape(const char *s, char *buf, size_t n);

/* The step of one metrics line ({"step":N,...}), -1 when it has none. */
long mmp_metrics_line_step(const char *line);

#endif
