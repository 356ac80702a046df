/* Chrome trace events (chrome://tracing, Perfetto).
 *
 * Each process appends its events to its own part file in the run directory
 * (trace.<name>.part, one JSON event per line, buffered), so no process
 * waits on another to record; at the end of a run the coordinator merges the
 * parts into trace.json and removes them. Timestamps are CLOCK_MONOTONIC in
 * µs, shared by every process on a host. */
#ifndef MMP_COMMON_TRACE_H
#define MMP_COMMON_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

typedef struct mmp_trace {
    FILE *f;
    int pid; /* the trace's process id (one per stage process) */
} mmp_trace;

/* Opens <run_dir>/trace.<file_tag>.part; names the process pid `name`.
 * A NULL run_dir gives a trace that records nothing. */
mmp_err mmp_trace_open(mmp_trace *t, const char *run_dir, const char *file_tag, int pid,
                       const char *name);
void mmp_trace_close(mmp_trace *t);

/* Microseconds on the shared clock. */
double mmp_trace_now_us(void);

/* An X span on thread tid with args {step, mb}. */
void mmp_trace_span(mmp_trace *t, const char *name, const char *cat, int tid, double ts_us,
                    double dur_us, int step, int mb);
/* Flow start ('s') at a send / finish ('f') at the matching receive: same id. */
void mmp_trace_flow(mmp_trace *t, char phase, uint64_t id, int tid, double ts_us);
/* An instant event (balance decisions, checkpoints, launches, restarts...)
 * with a note (a JSON string body: escaped by the caller); written through at
 * once, so a process killed right after still leaves it. */
void mmp_trace_instant(mmp_trace *t, const char *name, double ts_us, const char *note);

/* Merges every trace.*.part of run_dir into run_dir/trace.json and removes the
 * parts. Lines that are not complete events (a killed writer) are dropped.
 * The events of an existing trace.json (earlier launches of a resumed run)
 * are kept, before the new ones: the file holds every launch segment. Call it
 * when no process writes a part any more. On a failure (a full disk)
 * MMP_ERR_IO, and trace.json and the parts stay as they were (a later merge,
 * e.g. the resumed run's, takes them). */
mmp_err mmp_trace_merge(const char *run_dir);

#endif
