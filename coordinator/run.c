/* Coordinator: one run of a plan. Launches the stage processes, relaunches
 * them for a re-placement or a restart, and reports how the run ended; the
 * pieces live in procs.c, control_loop.c and steps.c (coordinator/coord.h). */
#include "coordinator/run.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/progress.h"
#include "coordinator/coord.h"
#include "common/ckpt.h"
#include "common/interrupt.h"
#include "common/json.h"
#include "common/metrics.h"
#include "coordinator/placement.h"
#include "transport/rexec.h"

/* Stages whose BLAS picked other kernels than the first stage's compute
 * GEMMs to other bits: the run is still correct but no longer equals
 * --single-process bitwise. Said once per launch, naming each. */
static void warn_blas(const coord *c)
{
    for (int i = 1; i < c->n; i++) {
        if (strcmp(c->procs[i].blas, c->procs[0].blas) != 0) {
            MMP_WARN("stage %s computes with BLAS kernels '%s', stage %s with '%s': their GEMMs "
                     "round differently, so this run will not equal --single-process bitwise "
                     "(give every host the same OPENBLAS_CORETYPE)",
                     c->procs[i].name, c->procs[i].blas, c->procs[0].name, c->procs[0].blas);
        }
    }
}

/* One launch of the current placement: compile, spawn, hello, coord_assign, ready,
 * run; stops the stages. Returns 0 when the run ended or a re-placement is
 * due (c->replan), 1 on a failure. */
static int launch(coord *c, int first_step, const char *resume_dir)
{
    if (mmp_sched_compile(&c->sched, &c->cur) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    c->n = c->sched.n_stages;
    memset(c->procs, 0, sizeof c->procs);
    for (int i = 0; i < c->n; i++) {
        snprintf(c->procs[i].name, sizeof c->procs[i].name, "%s", c->sched.stages[i].proc);
        c->procs[i].steps = first_step;
        c->speed[i] = 1;
    }
    mmp_balancer_reset(&c->bal, &c->cur, &c->sched, c->plan_json);
    c->replan = 0;
    c->stepping = 0;
    c->stalled = -1;
    c->ckpt_step = -1;
    c->ckpt_req = c->ckpt_pending = -1;
    /* the loss scale of the state this launch starts from (a restart rewinds it too) */
    mmp_loss_scale_init(&c->ls, c->plan);
    if (resume_dir && mmp_ckpt_read_loss_scale(resume_dir, c->plan, &c->ls) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    c->killed = 0;
    /* a control connection for each process (ZeroMQ holds one descriptor a
     * peer), its start-up pipe, and the coordinator's own files */
    char what[MMP_PATH_MAX + 64];
    snprintf(what, sizeof what, "%s: %d stage processes", c->plan->path, c->n);
    if (mmp_ctl_reserve_fds(64 + 2L * c->n, what) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    char note[96];
    snprintf(note, sizeof note, "launch %d from step %d", c->launch, first_step);
    mmp_trace_instant(&c->trace, "launch", mmp_trace_now_us(), note);
    if (coord_spawn_all(c) != MMP_OK) {
        coord_fail(c, "%s", mmp_last_error());
        return 1;
    }
    char placement[1024];
    MMP_INFO("%d stage processes (%s), schedule %s, %d micro-batches; run directory %s; shared "
             "memory %s-*",
             c->n, mmp_placement_str(&c->sched, placement, sizeof placement),
             mmp_schedule_name(c->cur.train.schedule), c->cur.train.microbatches, c->out_dir,
             c->shm_prefix);
    if (coord_wait_until(c, coord_all_flag, ALL(have_hello), HELLO_TIMEOUT_S,
                         "stage processes to connect")) {
        return 1;
    }
    warn_blas(c);
    if (coord_assign(c, c->plan_json, resume_dir) != MMP_OK || coord_wait_ready(c) ||
        coord_run_steps(c, first_step) != 0) {
        return 1;
    }
    coord_stop_all(c, 1);
    return 0;
}

static void free_dones(coord *c)
{
    for (int i = 0; i < c->n; i++) {
        if (c->procs[i].done) {
            mmp_ctl_free(c->procs[i].done);
            c->procs[i].done = NULL;
        }
    }
}

/* Whether the failure that ended a launch calls for a restart: a stage died
 * or stalled (not a stage's own reported error, not a signal to us), and
 * restarts are left. */
static int should_restart(const coord *c)
{
    return (c->fault || c->killed) && c->restarts.n < c->plan->train.max_restarts &&
           c->restarts.n < MMP_RESTART_MAX && !mmp_interrupt_signal();
}

/* After a fault: stops what is left of the launch (shared memory removed),
 * drops the control messages its processes left, and rewinds the records to
 * the newest checkpoint (coordinator/restart.h; the trace keeps everything
 * and marks the restart). Sets *first_step and resume_dir (empty: from the
 * start) for the relaunch. Returns 0, or 1 when the run cannot go on
 * (c->failure says why). */
static int prepare_restart(coord *c, int *first_step, char *resume_dir, size_t n)
{
    char cause[sizeof c->failure], esc[1100], note[1300];
    snprintf(cause, sizeof cause, "%s", c->failure);
    coord_stop_all(c, 0);
    Mmpipe__Envelope *env;
    char from_id[MMP_CTL_ID_MAX];
    while (mmp_ctl_recv(c->ctl, 50, &env, from_id, sizeof from_id) == MMP_OK) {
        mmp_ctl_free(env); /* from the stopped processes: stale */
    }
    free_dones(c);
    mmp_sched_fini(&c->sched);
    c->failure[0] = c->stage_error[0] = c->peer_error[0] = 0;
    c->stage_error_holds = c->fault = 0;
    if (mmp_restart_rewind(&c->restarts, c->out_dir, c->steps_done, cause, first_step, resume_dir,
                           n, &c->metrics) != MMP_OK) {
        coord_fail(c, "cannot restart: %s", mmp_last_error());
        return 1;
    }
    MMP_WARN("restart %d of %d after step %d: %s; relaunching every stage from step %d",
             c->restarts.n, c->plan->train.max_restarts, c->steps_done, cause, *first_step);
    snprintf(note, sizeof note, "restart %d from step %d: %s", c->restarts.n, *first_step,
             mmp_json_escape(cause, esc, sizeof esc));
    mmp_trace_instant(&c->trace, "restart", mmp_trace_now_us(), note);
    c->steps_done = *first_step;
    return 0;
}

/* Says how a run stopped by a signal goes on. */
static void say_how_to_resume(const coord *c)
{
    char dir[1200];
    int step;
    if (mmp_ckpt_latest(c->out_dir, dir, sizeof dir, &step) != MMP_OK) {
        MMP_INFO("stopped by %s before any checkpoint: nothing to resume",
                 strsignal(mmp_interrupt_signal()));
        return;
    }
    MMP_INFO("stopped by %s; checkpoint %s (step %d of %d)", strsignal(mmp_interrupt_signal()), dir,
             step, c->plan->job.steps);
    MMP_INFO("resume with: mmpipe launch %s --resume %s", c->plan_json, c->out_dir);
}

/* The control plane over tcp with CURVE (transport/control.h): the job's
 * keys, a bind on every interface, and the endpoint stages connect to
 * (control.address, else this host's name) in c->endpoint. */
static mmp_err open_tcp_control(coord *c)
{
    if (c->plan->launcher == MMP_LAUNCH_SLURM && !getenv("SLURM_JOB_ID")) {
        return mmp_errorf(MMP_ERR_INVALID, "launcher: slurm: not inside a SLURM allocation "
                                           "(SLURM_JOB_ID is not set; use sbatch or salloc)");
    }
    if (c->plan->launcher == MMP_LAUNCH_AGENT) {
        /* every stage's relay reads it: a key it refuses stops the launch here */
        char key[MMP_REXEC_KEY_MAX + 1];
        MMP_TRY(mmp_rexec_key_load(c->plan->agent.key_file, key, sizeof key));
        explicit_bzero(key, sizeof key);
    }
    MMP_TRY(mmp_ctl_new_keys(&c->keys));
    mmp_ctl_opts o = {.curve = &c->keys, .watch_fd = -1};
    MMP_TRY(mmp_ctl_bind_opts(&c->ctl, c->endpoint, c->token, &o));
    char bound[256], host[256];
    MMP_TRY(mmp_ctl_last_endpoint(c->ctl, bound, sizeof bound));
    const char *port = strrchr(bound, ':');
    if (c->plan->control.address[0]) {
        snprintf(host, sizeof host, "%s", c->plan->control.address);
    } else if (gethostname(host, sizeof host) != 0 || !mmp_plan_address_ok(host)) {
        return mmp_errorf(MMP_ERR_INVALID, "control.address: not set, and this host's name is "
                                           "not usable; set it to an address the hosts reach");
    }
    int v6 = strchr(host, ':') != NULL; /* an IPv6 address goes in brackets */
    snprintf(c->endpoint, sizeof c->endpoint, "tcp://%s%s%s%s", v6 ? "[" : "", host, v6 ? "]" : "",
             port ? port : ":0");
    MMP_INFO("control plane: %s (CURVE; bound %s)", c->endpoint, bound);
    return MMP_OK;
}

int mmp_coord_run(const mmp_plan *plan, const char *out_dir, int resume)
{
    static coord c;
    memset(&c, 0, sizeof c);
    mmp_log_set_name("coordinator");
    /* A stage may run in another directory (hosts[].workdir): every path it
     * is given (plan.json, checkpoints, trace parts) starts at the root. */
    static char out_abs[1100];
    char cwd[1024];
    if (out_dir[0] != '/') {
        if (!getcwd(cwd, sizeof cwd) ||
            snprintf(out_abs, sizeof out_abs, "%s/%s", cwd, out_dir) >= (int)sizeof out_abs) {
            MMP_ERROR("%s: the run directory's absolute path is too long", out_dir);
            return 1;
        }
        out_dir = out_abs;
    }
    c.cur_step = -1;
    c.plan = plan;
    c.cur = *plan;
    c.out_dir = out_dir;
    int rc = 1, first_step = 0;
    char resume_dir[1200] = "";
    if (mmp_plan_check_runnable(plan) != MMP_OK || mmp_sched_compile(&c.sched, plan) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        return 1;
    }
    /* The most processes a launch of this run may have, for MPS: this
     * placement's, one a slot (the balancer's limit when there are fewer),
     * and a scripted re-placement's (below). */
    int most_procs =
        c.sched.n_stages > mmp_plan_slots(plan) ? c.sched.n_stages : mmp_plan_slots(plan);
    mmp_sched_fini(&c.sched);
    if (resume) {
        if (mmp_ckpt_latest(out_dir, resume_dir, sizeof resume_dir, &first_step) != MMP_OK) {
            MMP_ERROR("%s", mmp_last_error());
            goto out;
        }
        MMP_INFO("resuming %s at step %d of %d", out_dir, first_step, plan->job.steps);
    }
    if (mmp_ctl_new_token(c.token) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    /* Socket and shm names are public (/proc/net/unix, /dev/shm): they come
     * from a second random id, never from the token. */
    char run_id[33];
    if (mmp_ctl_new_token(run_id) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    c.tcp = mmp_plan_control_tcp(plan);
    snprintf(c.endpoint, sizeof c.endpoint, "ipc://@mmpipe-%d-%.16s", (int)getpid(), run_id);
    if (c.tcp) {
        char port[16] = "*";
        if (plan->control.port > 0) {
            snprintf(port, sizeof port, "%d", plan->control.port);
        }
        snprintf(c.endpoint, sizeof c.endpoint, "tcp://*:%s", port);
    }
    snprintf(c.shm_prefix, sizeof c.shm_prefix, "/mmpipe-%.12s", run_id);
    snprintf(c.plan_json, sizeof c.plan_json, "%s/plan.json", out_dir);
    char trace_path[1200];
    snprintf(trace_path, sizeof trace_path, "%s/trace.json", out_dir);
    if (!resume) {
        unlink(trace_path); /* a new run's trace starts empty; a resumed one appends */
    }
    c.steps_done = first_step;
    c.kept = -1;
    /* One part file per coordinator process: a killed one's part, left for
     * the resumed run to merge, is not overwritten. */
    char coord_tag[48];
    snprintf(coord_tag, sizeof coord_tag, "coordinator.p%d", (int)getpid());
    if (mmp_plan_write_json(plan, c.plan_json) != MMP_OK ||
        mmp_metrics_continue(out_dir, resume ? first_step : -1, &c.metrics) != MMP_OK ||
        mmp_trace_open(&c.trace, out_dir, coord_tag, 0, "coordinator") != MMP_OK ||
        (c.tcp ? open_tcp_control(&c) : mmp_ctl_bind(&c.ctl, c.endpoint, c.token)) != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        goto out;
    }
    if (plan->balance.force.step > 0) {
        /* A scripted re-placement is checked now, not when it is due. */
        if (mmp_balancer_forced_plan(plan, c.plan_json, NULL, 0, &c.next) != MMP_OK ||
            mmp_sched_compile(&c.sched, &c.next) != MMP_OK) {
            MMP_ERROR("%s", mmp_last_error());
            goto out;
        }
        most_procs = c.sched.n_stages > most_procs ? c.sched.n_stages : most_procs;
        mmp_sched_fini(&c.sched);
    }
    mmp_interrupt_install(0);
    coord_mps_start(&c, run_id, most_procs);
    for (;;) {
        c.launch++;
        int bad = launch(&c, first_step, resume_dir[0] ? resume_dir : NULL);
        if (bad) {
            coord_keep_held(&c);
            if (should_restart(&c) &&
                prepare_restart(&c, &first_step, resume_dir, sizeof resume_dir) == 0) {
                continue;
            }
            break;
        }
        if (c.stopped) {
            rc = mmp_interrupt_status();
            say_how_to_resume(&c);
            goto out;
        }
        if (!c.replan) {
            rc = 0;
            char summary[256];
            mmp_metrics_summary(out_dir, summary, sizeof summary);
            MMP_INFO("done: %d steps%s%s; checkpoint %s/ckpt/latest (metrics.jsonl and "
                     "trace.json beside it)",
                     plan->job.steps, summary[0] ? "; " : "", summary, out_dir);
            if (c.restarts.n) {
                MMP_INFO("%d restart%s (see \"restarts\" in metrics.jsonl)", c.restarts.n,
                         c.restarts.n == 1 ? "" : "s");
            }
            goto out;
        }
        /* Re-placement: the stages stopped after checkpointing step
         * replan_step; the new placement resumes from it. */
        free_dones(&c);
        mmp_sched_fini(&c.sched);
        c.cur = c.next;
        first_step = c.replan_step;
        /* plan.json is the plan that runs: the `resume with` command it is
         * named in continues on this placement, not the first one */
        if (mmp_plan_write_json(&c.cur, c.plan_json) != MMP_OK) {
            coord_fail(&c, "%s", mmp_last_error());
            break;
        }
        mmp_ckpt_step_dir(resume_dir, sizeof resume_dir, out_dir, first_step);
    }
    coord_stop_all(&c, 0);
    MMP_ERROR("%s", c.failure[0] ? c.failure : mmp_last_error());
    if (mmp_interrupt_signal()) {
        rc = mmp_interrupt_status();
        say_how_to_resume(&c);
    } else if (c.kept > 0) {
        char dir[1200];
        mmp_ckpt_step_dir(dir, sizeof dir, out_dir, c.kept);
        MMP_ERROR("what was trained is kept: step %d of %d in %s; %sresume with: mmpipe launch %s "
                  "--resume %s",
                  c.kept, plan->job.steps, dir,
                  c.stage_error_holds ? "mend what the error names and " : "", c.plan_json,
                  out_dir);
    }
    if (!mmp_interrupt_signal() && c.restarts.n > 0 && c.restarts.n >= c.plan->train.max_restarts) {
        MMP_ERROR("no restart left: %d of train.max_restarts %d used", c.restarts.n,
                  c.plan->train.max_restarts);
    }
out:
    coord_mps_stop(&c); /* after the stages: they are its clients */
    free_dones(&c);
    mmp_ctl_close(c.ctl);
    explicit_bzero(&c.keys, sizeof c.keys);
    mmp_trace_close(&c.trace);
    if (c.metrics) {
        fclose(c.metrics);
    }
    if (mmp_trace_merge(out_dir) != MMP_OK) {
        MMP_WARN("trace: %s", mmp_last_error());
    }
    mmp_sched_fini(&c.sched);
    return rc;
}
