/* The coordinator's internals, shared by its files (internal to
 * coordinator/; the contract users see is coordinator/run.h):
 *   procs.c         starting, reaping and stopping the stage processes;
 *   control_loop.c  the control socket: filing messages, judging stage ends
 *                   and errors, waiting for a condition (with the stall
 *                   watchdog), sending;
 *   steps.c         a launch's assignments and its step loop: start, clip,
 *                   results, evaluation, balancing, metrics, checkpoints;
 *   run.c           launches, re-placements and restarts of one run.
 * One coord per run; every function runs on the coordinator's one thread.
 * A failure is recorded once with coord_fail (the first cause is the one
 * reported) and every caller then unwinds. */
#ifndef MMP_COORDINATOR_COORD_H
#define MMP_COORDINATOR_COORD_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/config.h"
#include "common/loss_scale.h"
#include "common/trace.h"
#include "coordinator/balancer.h"
#include "coordinator/restart.h"
#include "coordinator/schedule.h"
#include "transport/control.h"

#define HELLO_TIMEOUT_S 30.0
/* Start-up: a stage not ready yet that has said nothing (no progress
 * heartbeat, coordinator/control_loop.c coord_wait_ready) for this long is
 * stuck; a load that keeps reporting progress may take as long as it needs.
 * MMP_TEST_READY_SILENCE_S (tests only) may shorten it, never lengthen it. */
#define READY_SILENCE_S 120.0
/* Long start-ups: each stage's progress is shown once the wait is this
 * old, and then at most every READY_SHOW_EVERY_S. */
#define READY_SHOW_S 5.0
#define READY_SHOW_EVERY_S 15.0

typedef struct proc {
    char name[64]; /* "image.0/0" */
    pid_t pid;
    int alive;
    int exit_status;
    int reported;  /* its end has been judged */
    int peer_lost; /* it reported a peer gone: its own plain exit is that echo */
    /* it stopped its step and holds its state as of held_steps steps,
     * waiting for a checkpoint request (worker.c hold) */
    int holding, held_steps;
    double done_at; /* when its StepDone of cur_step came */
    /* Starts sent to it whose StepDone has not come (0: between steps), and
     * the steps its state holds then (its last StepDone's; the launch's
     * first step before one) */
    int in_step, steps;
    double last_seen;
    /* start-up: what it last said it was doing ("manifest /d/train.jsonl:
     * 12.3M of 30.0M lines"), empty before its first progress heartbeat;
     * when that was last shown to the user */
    char doing[400];
    double shown;
    /* tcp control: the write end of its stdin pipe (secrets, then kept open
     * so that its end tells the stage we are gone), plus one; 0 for none */
    int pipe_w1;
    char where[MMP_ADDRESS_MAX +
               160]; /* ", ssh to HOST at ADDRESS" for error messages; "" locally */
    /* per-step inbox */
    int have_norm, have_done, have_ack, have_ready, have_hello;
    char blas[160]; /* its Hello's BLAS kernels (printable ASCII only, cut) */
    /* the checkpoint asked for (coord.ckpt_req) is on disk; the steps of the
     * newest checkpoint whose file it wrote, + 1 (0: none) */
    int have_on_disk, ckpt_written;
    double sumsq;
    uint64_t norm_seq; /* the order the step's gradient norms arrived in */
    /* the next step's norm, come early: it started before this step's
     * results were in (coord.ahead) */
    int have_next_norm;
    double next_sumsq;
    uint64_t next_norm_seq;
    Mmpipe__Envelope
        *done; /* its StepDone, kept (the envelope owns it) until the metrics are written */
} proc;

typedef struct coord {
    const mmp_plan *plan; /* as launched */
    mmp_plan cur;         /* the placement running now (the balancer may change it) */
    const char *out_dir;
    char plan_json[1200];
    mmp_sched sched;
    mmp_balancer bal;
    double speed[MMP_SCHED_MAX_STAGES]; /* the routing's weights */
    int replan;                         /* run_steps stopped for a re-placement */
    int nice[MMP_SCHED_MAX_STAGES];     /* each process's nice at launch (train.priority) */
    mmp_plan next;                      /* ... to this placement */
    char decision[1200];                /* this step's balancer decision, JSON, or empty */
    /* fp16 loss scaling (common/loss_scale.h): the one state every stage
     * obeys, as of the steps done; a launch takes it from its checkpoint */
    mmp_loss_scale ls;
    int step_skipped; /* the step just run skipped its optimizer step */
    int replan_step;  /* steps done when it stopped for one */
    int launch;       /* launches so far (names each one's shm) */
    int cur_step;     /* the step running (0-based), -1 between runs */
    int ahead;        /* step cur_step + 1 is started too (steps.c: chained steps) */
    int step_chained; /* the step running started that way */
    char token[33];
    int tcp;           /* control over tcp with CURVE (mmp_plan_control_tcp) */
    mmp_ctl_keys keys; /* the job's CURVE keys when tcp */
    char endpoint[300];
    char shm_prefix[64];
    char mps_dir[64];  /* the job's MPS daemon's directories (mps.c); empty: none */
    char mps_exe[600]; /* its control binary while the daemon runs */
    mmp_ctl *ctl;
    proc procs[MMP_SCHED_MAX_STAGES];
    int n;
    uint64_t norm_seq; /* gradient norms received, ever: orders them */
    int have_eval;
    float eval_i2t, eval_t2i;
    char failure[2048];
    char stage_error[2048]; /* the first Error a stage sent of its own failure (see settle) */
    char peer_error[2048];  /* the first Error that echoes a peer's end */
    int stage_error_holds;  /* the stage that sent stage_error holds its state */
    /* The running step's start and gradient norm, and the coordinator's CPU
     * time when the last step's line was written: a chained step's line
     * written after a failure (steps.c coord_keep_held) takes them. */
    double step_t0, step_norm, cpu_prev;
    int kept;     /* coord_keep_held checkpointed this many steps; -1: nothing kept */
    int stepping; /* this launch's stages were sent a step (a Start) */
    int stalled;  /* the process the watchdog blamed for this launch's failure, or -1 */
    FILE *metrics;
    off_t line_at; /* where the last step's line starts in metrics (steps.c add_eval) */
    mmp_trace trace;
    /* supervision */
    int fault;            /* the failure is a stage's death or stall: a restart may help */
    int killed;           /* a stage of this launch died by a signal we did not send */
    int in_steps;         /* stages are training (the watchdog and graceful stop apply) */
    double links_checked; /* when the control-connection watch last looked (control_loop.c) */
    int steps_done;       /* steps completed (of the whole run) */
    int ckpt_step;        /* steps the newest checkpoint of this launch holds; -1 none */
    /* Checkpoints asked for and not yet published (ckpt/latest): the newest
     * asked for, and the oldest being written in the background (-1 none);
     * at most two: a stage finishes one before it snapshots the next. */
    int ckpt_req, ckpt_pending;
    /* the loss-scale state after each of those steps: what its train.ckpt
     * holds, written when the step is published (c->ls has moved on by then) */
    mmp_loss_scale ckpt_req_ls, ckpt_pending_ls;
    int stopped; /* run_steps stopped for a signal, after checkpointing */
    mmp_restarts restarts;
} coord;

/* ---- steps.c ---- */
/* Publishes every checkpoint whose files all stages have written: its
 * meta.json, ckpt/latest, the pruning of old ones (control_loop.c calls it
 * as acknowledgements come in). */
void coord_ckpt_publish(coord *c);

/* Records the run's failure (the first one sticks). */
void coord_fail(coord *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- procs.c ---- */
/* Starts every process of c->sched with the plan's launcher
 * (coordinator/launcher.h): over ipc the token in their environment, over
 * tcp the token and CURVE keys on their stdin; never in argv. */
mmp_err coord_spawn_all(coord *c);
/* Reaps children that ended (no judgement: see coord_settle). Returns how many. */
int coord_reap(coord *c);
/* Asks every process to end (Shutdown when graceful, else Abort), kills
 * what is left after a grace period (none after a second signal), and
 * removes the run's shared memory. */
void coord_stop_all(coord *c, int graceful);
/* Whether p ended abruptly: killed by a signal, or, through ssh or srun, an
 * exit status of 128 or more (how they report a killed remote command or a
 * lost connection). */
int coord_abrupt_end(const proc *p);
/* "killed by signal N (NAME)" or "exited with status N" into buf. */
const char *coord_describe_exit(int status, char *buf, size_t n);

/* ---- mps.c ---- */
/* A private CUDA MPS daemon when two of up to n_procs stage processes share
 * a GPU (mmp_procs_share_gpu; see mps.c); never fails the job: without it
 * the stages time-slice, with a warning. */
void coord_mps_start(coord *c, const char *run_id, int n_procs);
/* Quits it and removes its directories; NULL-safe state, idempotent. */
void coord_mps_stop(coord *c);

/* ---- control_loop.c ---- */
typedef int (*done_fn)(coord *c, void *arg);
/* Judges stage ends and errors into c->failure, most telling cause first. */
void coord_settle(coord *c);
/* Serves the control socket until done(c, arg) holds, a failure, or
 * timeout_s (0: none); the watchdog while training. Returns 0 when done
 * with no failure recorded (c->failure), else 1. */
int coord_wait_until(coord *c, done_fn done, void *arg, double timeout_s, const char *what);
/* Takes one control message (waiting up to timeout_ms) and files it.
 * Returns 1 when one was taken. */
int coord_take_one(coord *c, int timeout_ms);
/* Serves the control socket until every process is ready (Ready), a
 * failure, or one not ready yet has been silent for READY_SILENCE_S (it is
 * named, with what it last reported doing); shows the progress of a long
 * start-up. Returns 0 when all are ready. */
int coord_wait_ready(coord *c);
/* done_fn: every process has the int flag at offset arg (ALL(field)) set. */
int coord_all_flag(coord *c, void *arg);
#define ALL(field) ((void *)offsetof(proc, field))
/* done_fn: the evaluation's result arrived. */
int coord_got_eval(coord *c, void *arg);
/* The process that reported stage i's gradient norm first among i's replicas
 * (they hold the same reduced gradients, transport/reduce.h), or -1. */
int coord_stage_norm(const coord *c, int i);
/* done_fn: every stage has a gradient norm (from one of its replicas). */
int coord_stage_norms(coord *c, void *arg);
mmp_err coord_send_to(coord *c, int i, Mmpipe__Envelope *env);
/* Forwards the addresses stage `from` reports for its tcp creator ends to
 * the ends that connect (coordinator/steps.c). 1 when it failed (c->failure). */
int coord_forward_endpoints(coord *c, int from, const Mmpipe__Endpoints *eps);
mmp_err coord_broadcast(coord *c, Mmpipe__Envelope *env);

/* ---- steps.c ---- */
/* Sends every process its assignment: channels, instruction list, files. */
mmp_err coord_assign(coord *c, const char *plan_json, const char *resume_dir);
/* Runs steps from first_step; returns 0 at the end, when the balancer asks
 * for a re-placement (c->replan, after checkpointing) or when a signal asked
 * to stop (c->stopped, after finishing the step in flight and checkpointing
 * it), 1 on a failure. */
int coord_run_steps(coord *c, int first_step);
/* Step `step`'s metrics.jsonl line (0-based) from the stages' results
 * (every process with have_done; a lost replica's missing results are left
 * out), written before the step's checkpoint. 1 after coord_fail. */
int coord_write_metrics(coord *c, int step, double step_ms, double grad_norm, double coord_cpu_ms);
/* Asks every live process for its checkpoint of steps_done (its stage's
 * file written by coord_writer_of; a lost replica's part counted as done).
 * In the background (train.ckpt_async) it waits only for the snapshots;
 * otherwise until the step is published. 1 after coord_fail. */
int coord_checkpoint(coord *c, int steps_done, int background);
/* The replica of process i's stage that writes the stage's checkpoint file:
 * its lowest one alive (replicas hold the same state), -1 when none is. */
int coord_writer_of(const coord *c, int i);

/* ---- keep.c ---- */
/* After a failure that leaves the trained state whole (stages/worker.c
 * hold): a bad sample under data.on_bad_sample: fail, whose stage holds its
 * state, or lost processes that were all replicas of stages with another
 * replica alive (a replica the watchdog blamed for a stall is SIGKILLed
 * first, and so lost). Once every live process holds the same step's state, keeps
 * it: that step's line when it is missing (a chained step whose results all
 * came), and its checkpoint (a lost replica's file written by its lowest
 * sibling alive), with the failure still recorded: a restart then starts
 * from it. Sets c->kept to the steps kept, else -1 (with a warning saying
 * why, once a stage held). */
void coord_keep_held(coord *c);

#endif
