/* Stage worker: interprets the coordinator's instruction list for one stage
 * process. Owns the stage's part of the model, its data channels and (for
 * the first sub-stage of a branch) its data set. Holds one `acts` per
 * micro-batch in flight, as many as its compiled list needs. Never touches
 * the coordinator's decisions: it only checks that what arrives is what the
 * list says should arrive. This file: the control plane and the serve loop
 * (the rest: stages/worker_internal.h). */
#include "stages/worker.h"

#include "stages/worker_internal.h"
#include "common/test_hooks.h"

/* The loader's tensor memory on a GPU stage: the backend's pinned memory. */
static void *loader_host_alloc(void *ctx, size_t bytes)
{
    return mmp_backend_host_alloc(ctx, bytes);
}

static void loader_host_free(void *ctx, void *p)
{
    mmp_backend_host_free(ctx, p);
}

/* ---- control-plane helpers ---------------------------------------------------- */

mmp_err worker_send_env(worker *w, Mmpipe__Envelope *env)
{
    return mmp_ctl_send(w->ctl, NULL, env);
}

/* peer_lost: the error is the echo of a peer's end (a broken channel), not
 * this stage's own failure; the coordinator ranks it after a peer's exit. */
static void send_error(worker *w, const char *msg, int peer_lost)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Error e = MMPIPE__ERROR__INIT;
    char buf[2300];
    snprintf(buf, sizeof buf, "%s: %s", w->name, msg);
    e.message = buf;
    e.peer_lost = peer_lost;
    env.body_case = MMPIPE__ENVELOPE__BODY_ERROR;
    env.error = &e;
    worker_send_env(w, &env);
}

void worker_heartbeat(worker *w, int step, int instr)
{
    double now = mmp_now();
    if (now - w->last_beat < 1.0) {
        return;
    }
    w->last_beat = now;
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Heartbeat hb = MMPIPE__HEARTBEAT__INIT;
    hb.step = step;
    hb.instr = instr;
    env.body_case = MMPIPE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    worker_send_env(w, &env);
}

void worker_startup(worker *w, const char *phase, int64_t done, int64_t total, const char *unit)
{
    double now = mmp_now();
    int same = strcmp(phase, w->startup_phase) == 0;
    if (same && now - w->last_beat < 1.0) {
        return;
    }
    if (!same) {
        /* shown to the user: no control characters (a file name may hold any) */
        size_t i = 0;
        for (; phase[i] && i + 1 < sizeof w->startup_phase; i++) {
            unsigned char ch = (unsigned char)phase[i];
            w->startup_phase[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
        }
        w->startup_phase[i] = 0;
    }
    w->last_beat = now;
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Heartbeat hb = MMPIPE__HEARTBEAT__INIT;
    hb.phase = w->startup_phase; /* cut at 255 bytes, as the receiver wants */
    hb.done = done > 0 ? (uint64_t)done : 0;
    hb.total = total > 0 ? (uint64_t)total : 0;
    hb.total = hb.total && hb.total < hb.done ? hb.done : hb.total;
    hb.unit = (char *)unit;
    env.body_case = MMPIPE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    worker_send_env(w, &env);
}

void worker_load_progress(void *ctx, const char *unit, int64_t done, int64_t total)
{
    worker *w = ctx;
    worker_startup(w, w->startup_phase, done, total, unit); /* the phase set before the open */
    if (w->test_slow_start_ms > 0) {
        mmp_sleep_ms(w->test_slow_start_ms);
    }
}

/* The next control message; wakes every second to check that the
 * coordinator is still there (PR_SET_PDEATHSIG covers its death too).
 * until > 0: MMP_ERR_TIMEOUT once mmp_now() passes it. */
static mmp_err next_message_until(worker *w, Mmpipe__Envelope **env, double until)
{
    for (;;) {
        if (until > 0 && mmp_now() >= until) {
            return MMP_ERR_TIMEOUT;
        }
        char from[MMP_CTL_ID_MAX];
        /* short waits while a checkpoint is written: its ack goes out soon
         * after the file is on disk, not at the next message */
        mmp_err e = mmp_ctl_recv(w->ctl, worker_ckpt_busy(w) ? 20 : 1000, env, from, sizeof from);
        if (e != MMP_ERR_TIMEOUT) {
            return e;
        }
        MMP_TRY(worker_ckpt_settle(w, 0));
        if (getppid() == 1) {
            w->ended_by_coordinator = 1;
            return mmp_errorf(MMP_ERR_PEER, "the coordinator is gone");
        }
    }
}

static mmp_err next_message(worker *w, Mmpipe__Envelope **env)
{
    return next_message_until(w, env, 0);
}

/* Waits for a message of body `want`; Abort and Shutdown end the wait with
 * MMP_ERR_PEER (the caller exits). Other bodies are protocol errors. */
mmp_err worker_wait_for(worker *w, Mmpipe__Envelope__BodyCase want, Mmpipe__Envelope **out)
{
    for (;;) {
        Mmpipe__Envelope *env = NULL;
        MMP_TRY(next_message(w, &env));
        if (env->body_case == want) {
            *out = env;
            return MMP_OK;
        }
        Mmpipe__Envelope__BodyCase got = env->body_case;
        mmp_ctl_free(env);
        if (got == MMPIPE__ENVELOPE__BODY_ABORT || got == MMPIPE__ENVELOPE__BODY_SHUTDOWN) {
            w->ended_by_coordinator = 1;
            return mmp_errorf(MMP_ERR_PEER, "stopped by the coordinator");
        }
        return mmp_errorf(MMP_ERR_PROTO, "coordinator sent message %d while %d was expected",
                          (int)got, (int)want);
    }
}

/* ---- a step cut short ----------------------------------------------------------------------- */

/* How long a holding stage waits for the coordinator's word. */
#define HOLD_WAIT_S 60.0

/* Whether the failure e of a step leaves this process's state whole, so it
 * can hold it: a bad sample its loader met (data.on_bad_sample: fail), or a
 * peer's channel or reduce that closed under it (a peer holding, or gone).
 * Not when the coordinator ended the step, nor after a device error. */
static int can_hold(const worker *w, mmp_err e)
{
    if (w->ended_by_coordinator || w->steps_done < 0 || !w->params ||
        (w->be && mmp_backend_error(w->be) != MMP_OK)) {
        return 0;
    }
    return e == MMP_ERR_PEER ||
           ((e == MMP_ERR_DATA || e == MMP_ERR_IO) && w->fault_op == MMPIPE__OP__LOAD);
}

/* Step `step` failed with e (can_hold): the state goes back to the end of
 * the last finished step (nothing but the batch-norm running statistics
 * moved before the optimizer step; after it, the step is finished), the
 * coordinator hears the error and what the state holds, and the data plane
 * closes, so every peer's step ends too (each then holds the same way). The
 * stage then waits for a CheckpointRequest of those steps (the run keeps
 * what it trained: coordinator/keep.c coord_keep_held), or Abort /
 * Shutdown. Returns the error the process ends with. */
static mmp_err hold(worker *w, int step, mmp_err e)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", mmp_last_error());
    int held = w->opt_ran ? step + 1 : step;
    if (!w->opt_ran) {
        mmp_params_buffers_rewind(w->params);
    }
    MMP_ERROR("%s", msg);
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Error er = MMPIPE__ERROR__INIT;
    char buf[2300];
    snprintf(buf, sizeof buf, "%s: %s", w->name, msg);
    er.message = buf;
    er.peer_lost = e == MMP_ERR_PEER;
    er.holding = 1;
    er.held_steps = held;
    env.body_case = MMPIPE__ENVELOPE__BODY_ERROR;
    env.error = &er;
    /* the cause goes out before the channels close: the coordinator hears
     * it before the peers' echoes */
    MMP_TRY(worker_send_env(w, &env));
    w->error_sent = 1;
    worker_close_data_plane(w);
    double until = mmp_now() + HOLD_WAIT_S;
    for (;;) {
        Mmpipe__Envelope *m = NULL;
        mmp_err r = next_message_until(w, &m, until);
        if (r == MMP_ERR_TIMEOUT) {
            return mmp_errorf(e, "held the state of step %d for %.0f s and nobody asked for it",
                              held, HOLD_WAIT_S);
        }
        MMP_TRY(r);
        Mmpipe__Envelope__BodyCase got = m->body_case;
        if (got == MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST &&
            m->checkpoint_request->step == held) {
            r = worker_run_checkpoint(w, m->checkpoint_request);
            mmp_ctl_free(m);
            MMP_TRY(r);
            MMP_TRY(worker_ckpt_settle(w, 1));
            until = mmp_now() + HOLD_WAIT_S; /* however long the file took */
            continue;
        }
        int step_asked =
            got == MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST ? m->checkpoint_request->step : -1;
        int call_off = got == MMPIPE__ENVELOPE__BODY_CLIP && m->clip->call_off;
        mmp_ctl_free(m);
        if (call_off) {
            continue; /* sent to every stage not known to hold yet */
        }
        if (got == MMPIPE__ENVELOPE__BODY_ABORT || got == MMPIPE__ENVELOPE__BODY_SHUTDOWN) {
            w->ended_by_coordinator = 1;
            return mmp_errorf(e, "%s", msg);
        }
        w->error_sent = 0; /* this one is news */
        return step_asked >= 0 ? mmp_errorf(MMP_ERR_PROTO,
                                            "asked for a checkpoint of step %d while holding "
                                            "the state of step %d",
                                            step_asked, held)
                               : mmp_errorf(MMP_ERR_PROTO,
                                            "coordinator sent message %d while this stage "
                                            "holds the state of step %d",
                                            (int)got, held);
    }
}

/* ---- main loop ------------------------------------------------------------------------------ */

static mmp_err serve(worker *w)
{
    for (;;) {
        Mmpipe__Envelope *env = NULL;
        MMP_TRY(next_message(w, &env));
        mmp_err e = MMP_OK;
        switch (env->body_case) {
        case MMPIPE__ENVELOPE__BODY_START:
            if (env->start->first_step < 0 || env->start->steps < 0 ||
                env->start->first_step > w->plan.job.steps - env->start->steps) {
                e = mmp_errorf(MMP_ERR_PROTO,
                               "start: fields first_step = %d, steps = %d, outside the plan's %d "
                               "steps",
                               env->start->first_step, env->start->steps, w->plan.job.steps);
                break;
            }
            /* the scale the coordinator keeps; it sends one step per Start */
            w->loss_scale = env->start->loss_scale > 0 ? env->start->loss_scale : 1.0f;
            if (w->train && !w->loader) {
                /* Prefetching starts with the first step this process runs. */
                mmp_loader_cfg lc = {.ds = w->train,
                                     .plan = &w->plan,
                                     .images = w->kind == MMP_BRANCH_IMAGE,
                                     .text = w->kind == MMP_BRANCH_TEXT,
                                     .first_step = env->start->first_step,
                                     .last_step = w->plan.job.steps,
                                     .owns = w->owns,
                                     .depth = w->plan.train.microbatches + 1,
                                     /* GPU: page-locked, so uploads run asynchronously */
                                     .host_alloc = w->gpu >= 0 ? loader_host_alloc : NULL,
                                     .host_free = w->gpu >= 0 ? loader_host_free : NULL,
                                     .alloc_ctx = w->be};
                e = mmp_loader_create(&w->loader, &lc);
            }
            w->steps_done = env->start->first_step;
            for (int s = env->start->first_step;
                 e == MMP_OK && s < env->start->first_step + env->start->steps; s++) {
                e = worker_run_step(w, s);
                if (e == MMP_OK) {
                    w->steps_done = s + 1;
                } else if (can_hold(w, e)) {
                    e = hold(w, s, e);
                }
            }
            break;
        case MMPIPE__ENVELOPE__BODY_PROGRAM:
            /* A new routing: a new list, and a loader for its micro-batches
             * (made again at the next Start). */
            e = worker_set_program(w, env->program->program, env->program->n_program);
            if (e == MMP_OK) {
                mmp_ctl_free(w->prog_env);
                w->prog_env = env;
                env = NULL;
                worker_release_uploaded(w);
                mmp_loader_destroy(w->loader);
                w->loader = NULL;
            }
            break;
        case MMPIPE__ENVELOPE__BODY_EVAL_REQUEST:
            e = worker_run_eval(w, env->eval_request->step);
            break;
        case MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST:
            e = worker_run_checkpoint(w, env->checkpoint_request);
            break;
        case MMPIPE__ENVELOPE__BODY_CLIP:
            if (!env->clip->call_off) {
                MMP_WARN("ignoring a clip coefficient between steps");
            } /* a call-off finds this process between steps: nothing to hold */
            break;
        case MMPIPE__ENVELOPE__BODY_SHUTDOWN:
            mmp_ctl_free(env);
            return MMP_OK;
        case MMPIPE__ENVELOPE__BODY_ABORT:
            w->ended_by_coordinator = 1;
            e = mmp_errorf(MMP_ERR_PEER, "aborted by the coordinator: %s", env->abort->reason);
            mmp_ctl_free(env);
            return e;
        default:
            MMP_WARN("ignoring control message %d between steps", (int)env->body_case);
        }
        mmp_ctl_free(env);
        MMP_TRY(e);
        MMP_TRY(worker_ckpt_settle(w, 0));
    }
}

static char lost_shm_prefix[64];

/* The control plane's helper thread says the coordinator is gone (its link
 * went silent, or the launcher's pipe closed: ssh or the coordinator died).
 * Nobody will stop this stage any more: it removes the job's shared memory
 * on this host and exits at once (the other stages here do the same). */
static void on_coordinator_lost(const char *why, void *arg)
{
    (void)arg;
    MMP_ERROR("%s: stopping", why);
    if (lost_shm_prefix[0]) {
        mmp_shm_unlink_prefix(lost_shm_prefix);
    }
    _exit(3);
}

/* The death signal of a local stage (PR_SET_PDEATHSIG): its coordinator
 * died, maybe SIGKILLed during start-up, when segments this stage made
 * still have their names. They go (system calls only: this may have
 * interrupted malloc), then the stage. */
static void on_parent_death(int sig)
{
    (void)sig;
    if (lost_shm_prefix[0]) {
        mmp_shm_unlink_prefix_signal_safe(lost_shm_prefix);
    }
    _exit(3);
}

/* 1 when the coordinator that spawned this stage is gone already: the
 * parent is not the pid it left in MMP_PARENT_PID (a subreaper or init
 * took the stage), or, without it, init. */
static int orphaned(void)
{
    const char *e = getenv(MMP_CTL_PARENT_ENV);
    char *end;
    long want = e ? strtol(e, &end, 10) : 0;
    if (e && (end == e || *end || want <= 0)) {
        want = 0;
    }
    return want > 0 ? getppid() != (pid_t)want : getppid() == 1;
}

int mmp_worker_main(const mmp_worker_args *args)
{
    if (args->shm_prefix && strncmp(args->shm_prefix, "/mmpipe-", 8) == 0) {
        snprintf(lost_shm_prefix, sizeof lost_shm_prefix, "%s", args->shm_prefix);
    }
    /* Die with the coordinator: a SIGKILLed coordinator must not leave us,
     * nor the job's shared memory (on_parent_death). A stage with a watched
     * pipe (tcp control: maybe another host, where the parent is sshd or
     * slurmstepd) learns it from the pipe's end instead, and removes the
     * job's shared memory there before exiting. */
    if (args->watch_fd < 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_parent_death;
        sigfillset(&sa.sa_mask);
        sigaction(SIGUSR2, &sa, NULL);
        prctl(PR_SET_PDEATHSIG, SIGUSR2);
        if (orphaned()) {
            const char *was = getenv(MMP_CTL_PARENT_ENV);
            MMP_ERROR("the coordinator that started this stage (pid %s) is gone; its parent is "
                      "now pid %ld: exiting",
                      was ? was : "?", (long)getppid());
            return 1;
        }
    }
    static worker w;
    memset(&w, 0, sizeof w);
    mmp_ckpt_bg_init(&w.ckpt);
    w.loaded_mb = w.out_mb = w.steps_done = -1;
    /* Test hook (tests/cli_startup.sh): a manifest open that pauses this
     * long at each progress report, a slow load that still makes progress. */
    w.test_slow_start_ms = mmp_test_hook_value(MMP_HOOK_SLOW_START_MS);
    w.pin_index = args->pin_index;
    w.nice = args->nice;
    w.token = args->token;
    snprintf(w.name, sizeof w.name, "%s/%d", args->stage, args->replica);
    mmp_log_set_name(w.name);
    mmp_ctl_opts opts = {
        .curve = args->curve, .watch_fd = args->watch_fd, .lost = on_coordinator_lost};
    mmp_err e = mmp_ctl_connect_opts(&w.ctl, args->endpoint, w.name, args->token,
                                     args->curve ? &opts : NULL);
    if (e != MMP_OK) {
        MMP_ERROR("%s", mmp_last_error());
        return 1;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    hello.name = w.name;
    hello.pid = getpid();
    hello.blas = (char *)mmp_cpu_blas_kernels();
    env.body_case = MMPIPE__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    e = worker_send_env(&w, &env);
    if (e == MMP_OK) {
        e = worker_wait_for(&w, MMPIPE__ENVELOPE__BODY_ASSIGNMENT, &w.asg_env);
    }
    if (e == MMP_OK) {
        w.asg = w.asg_env->assignment;
        e = mmp_peer_check_assignment(w.asg); /* before its fields name anything */
    }
    if (e == MMP_OK) {
        /* One part file per process (a re-placement starts new ones); one
         * trace row per stage replica. */
        char tag[96];
        snprintf(tag, sizeof tag, "%s.%d.p%d", args->stage, args->replica, (int)getpid());
        int row = 1 + 1000 * (int)w.asg->kind + 100 * w.asg->sub + args->replica;
        e = mmp_trace_open(&w.trace, w.asg->run_dir, tag, row, w.name);
    }
    if (e == MMP_OK) {
        e = worker_build(&w);
    }
    if (e == MMP_OK) {
        Mmpipe__Envelope r = MMPIPE__ENVELOPE__INIT;
        Mmpipe__Ready ready = MMPIPE__READY__INIT;
        r.body_case = MMPIPE__ENVELOPE__BODY_READY;
        r.ready = &ready;
        e = worker_send_env(&w, &r);
    }
    if (e == MMP_OK) {
        e = serve(&w);
    }
    int rc = 0;
    if (e != MMP_OK) {
        rc = 1;
        if (!w.ended_by_coordinator && !w.error_sent) {
            MMP_ERROR("%s", mmp_last_error());
            send_error(&w, mmp_last_error(), e == MMP_ERR_PEER);
        }
    }
    worker_teardown(&w);
    return rc;
}
