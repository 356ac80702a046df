/* mmpipe simulate: the plan's schedule on paper. Compiles and checks the
 * schedule, then predicts one step with the discrete-event simulator
 * (coordinator/schedule.h): per-stage busy and idle time, step time,
 * throughput and bubble, from a nominal cost model or from the per-micro-batch
 * costs a run measured (its metrics.jsonl). With --plan-devices it also asks
 * the planner (coordinator/planner.h) for the best placement on that many
 * devices, from the same costs per layer. Reads files only; it never
 * launches or touches a stage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/config.h"
#include "common/progress.h"
#include "coordinator/costs.h"
#include "common/pin.h"
#include "coordinator/placement.h"
#include "coordinator/planner.h"
#include "coordinator/planner_cores.h"
#include "coordinator/schedule.h"

static const char USAGE[] =
    "usage: mmpipe simulate PLAN.yaml [--costs FILE] [--set KEY=VALUE]... [--dump]\n"
    "                       [--plan-devices N|all [--device-memory SIZE]]\n"
    "                       [--plan-cores N|all]\n"
    "\n"
    "Compiles the plan's schedule (train.schedule: gpipe, 1f1b or zb-h1;\n"
    "train.microbatches, the stages' splits, model.fusion.itc_scope: under\n"
    "batch, the default, the fusion's backwards wait for the step's last\n"
    "forward, so every stage runs all its forwards first), checks it\n"
    "(matching sends and receives, F before B, no deadlock, in-flight memory\n"
    "bound) and simulates one training step: per stage busy and idle time,\n"
    "then step time, samples/s and bubble (idle share). zb-h1 splits each\n"
    "backward into B (input gradients) and W (the linear/conv weight\n"
    "gradients, deferred into the bubbles); without a measured split W costs\n"
    "half the backward.\n"
    "\n"
    "options:\n"
    "  --costs FILE     costs a run measured: its metrics.jsonl, or the run\n"
    "                   directory. Uses the median over steps (the first, warm-up,\n"
    "                   left out) of each stage's fwd_ms, bwd_ms (of a zb-h1 run\n"
    "                   also wgt_ms, its weight passes' part) and load_ms per\n"
    "                   micro-batch, on the placement of the run's last step,\n"
    "                   its replicas' micro-batches dealt as they were then\n"
    "                   (weighted routing); send and step overhead are not\n"
    "                   measured (0). Shows the\n"
    "                   measured step time beside the prediction.\n"
    "                   Without it: nominal costs, forward 0.1 ms per layer per\n"
    "                   sample, backward twice that, load/send/overhead free\n"
    "                   (a compute: simulated plan: its own sim.* costs).\n"
    "  --set KEY=VALUE  override a plan key (repeatable), e.g.\n"
    "                   --set train.schedule=gpipe --set train.microbatches=16\n"
    "  --dump           print every stage's instruction list: L load, Ra/Sa\n"
    "                   receive/send activations, F forward, Rg/Sg receive/send\n"
    "                   gradients, B backward (zb-h1: Bi input-gradient pass, W\n"
    "                   weight-gradient pass; each with its micro-batch), NORM\n"
    "                   grad-norm barrier, OPT optimizer step; :eK names the edge\n"
    "                   where a stage has several in one role\n"
    "  --plan-devices N|all\n"
    "                   also choose a placement for N devices ('all': every device\n"
    "                   in the plan's hosts) with the planner: where to cut each\n"
    "                   branch into sub-stages and how many replicas each sub-stage\n"
    "                   and fusion get, minimising the bottleneck stage. It uses the\n"
    "                   costs above per layer and per sample (measured ones spread\n"
    "                   evenly over each stage's layers) and prints the placement,\n"
    "                   its predicted step time, samples/s and balance efficiency\n"
    "                   (busy time / (devices x step time)), and the time planning\n"
    "                   took\n"
    "  --device-memory SIZE\n"
    "                   with --plan-devices and --costs: no device may hold more\n"
    "                   than SIZE bytes (suffix K, M, G or T: powers of 1024, e.g.\n"
    "                   80G). A stage's memory is the most the run measured for it\n"
    "                   (peak_mem_bytes: device memory on GPU stages, RSS on CPU\n"
    "                   ones): its parameter arenas (state_bytes) spread evenly\n"
    "                   over its layers, the rest per activation slot (act_slots)\n"
    "                   and sample, charged for the micro-batches the placement's\n"
    "                   schedule lets it hold (a run without those two fields: the\n"
    "                   whole peak spread over the layers). The balancer plans the\n"
    "                   same way under balance.device_memory_gib. Prints each\n"
    "                   stage's memory beside its time\n"
    "  --plan-cores N|all\n"
    "                   also choose a placement for N CPU cores where stage\n"
    "                   processes may share cores (what stages: auto does on a\n"
    "                   CPU plan; 'all': the cores mmpipe may run on, or\n"
    "                   train.pin's list): process k on core k % N, whole\n"
    "                   micro-batches per replica; prints the placement, each\n"
    "                   core's load per step, the predicted step time, samples/s\n"
    "                   and balance efficiency (busy / (cores x step))\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0 ok, 1 a plan, costs or schedule error, 2 usage error.\n";

static void dump(const mmp_sched *s)
{
    printf("\nedges:\n");
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        printf("  e%d %s -> %s, %s, %d slot%s\n", e, s->stages[E->from].proc, s->stages[E->to].proc,
               E->grad ? "gradients" : "activations", E->slots, E->slots == 1 ? "" : "s");
    }
    printf("instruction lists:\n");
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        printf("%s:", g->n_replicas > 1 ? g->proc : g->name);
        for (int pc = 0; pc < g->n_prog; pc++) {
            char tok[32];
            printf(" %s", mmp_instr_compact(s, st, &g->prog[pc], tok, sizeof tok));
        }
        printf("\n");
    }
}

/* Plans a placement for devices with the planner and prints it. 0 ok, 1 error
 * (printed). */
/* SIZE: digits with an optional K, M, G or T (powers of 1024), > 0. */
static int parse_size(const char *text, double *out)
{
    char *end;
    double v = strtod(text, &end);
    static const char units[] = "KMGT";
    const char *u = *end ? strchr(units, *end) : NULL;
    if (end == text || !(v > 0) || (*end && (!u || end[1]))) {
        return -1;
    }
    for (const char *k = units; u && k <= u; k++) {
        v *= 1024;
    }
    *out = v;
    return 0;
}

/* A --plan-devices or --plan-cores value: a count of `what`s from 1 to
 * MMP_PLANNER_MAX_DEVICES, or "all" (and no flag at all) for 0. 0 ok, -1 a
 * usage error (printed). */
static int parse_count(const char *arg, const char *flag, const char *what, int *out)
{
    *out = 0;
    if (!arg || strcmp(arg, "all") == 0) {
        return 0;
    }
    char *end;
    long v = strtol(arg, &end, 10);
    if (*end || end == arg || v < 1 || v > MMP_PLANNER_MAX_DEVICES) {
        fprintf(stderr, "mmpipe simulate: %s '%s': expected a %s count (1 to %d) or 'all'\n", flag,
                arg, what, MMP_PLANNER_MAX_DEVICES);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The planner's per-layer, per-sample costs from c into *lc. */
static void layer_costs(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                        mmp_layer_costs *lc)
{
    double fwd[MMP_SCHED_MAX_STAGES], bwd[MMP_SCHED_MAX_STAGES];
    double samples = (double)p->train.batch / p->train.microbatches;
    for (int st = 0; st < s->n_stages; st++) {
        fwd[st] = c->fwd_ms[st] / samples;
        bwd[st] = c->bwd_ms[st] / samples;
    }
    mmp_costs_per_layer(s, fwd, bwd, lc);
}

/* Plans a placement on `cores` CPU cores (coordinator/planner_cores.h) and
 * prints it. 0 ok, 1 error (printed). */
/* Where the planner's per-layer costs come from, for its report line. */
static const char *costs_word(const mmp_plan *p, int measured)
{
    return measured                              ? "measured"
           : p->compute == MMP_COMPUTE_SIMULATED ? "the plan's sim.*"
                                                 : "nominal";
}

static int plan_cores(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c, int measured,
                      int cores)
{
    static mmp_layer_costs lc;
    layer_costs(p, s, c, &lc);
    mmp_cores_input ci = {.cores = cores};
    mmp_costs_planner_input(p, &lc, &ci.in);
    ci.in.batch = p->train.batch;
    ci.in.send_ms = c->send_ms;
    ci.in.step_overhead_ms = c->step_overhead_ms;
    mmp_planner_result r;
    double t0 = mmp_now();
    mmp_err e = mmp_planner_cores_plan(&ci, &r);
    double took = mmp_now() - t0;
    static double core_ms[MMP_PLANNER_MAX_DEVICES];
    if (e == MMP_OK) {
        e = mmp_planner_cores_evaluate(&ci, &r.placement, &r.eval, core_ms);
    }
    if (e != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: --plan-cores %d: %s\n", cores, mmp_last_error());
        return 1;
    }
    char text[1100];
    const mmp_planner_eval *v = &r.eval;
    printf("\nplanner on cores: %d cores, %s per-layer costs, planned in %.1f ms (%d candidates)\n"
           "placement %s (process k on core k %% %d)\ncore loads per step (ms):",
           cores, costs_word(p, measured), 1000 * took, r.candidates,
           mmp_placement_format(&r.placement, text, sizeof text), cores);
    for (int k = 0; k < cores && k < MMP_CORES_MAX_PROCS; k++) {
        printf(" %.1f", core_ms[k]);
    }
    printf("\npredicted step time %.3f ms, %.1f samples/s, balance efficiency %.1f%% (busy / (%d "
           "cores x step)); %d of %d cores used\n",
           v->step_ms, v->samples_per_s, 100 * v->efficiency, cores, v->devices_used, cores);
    return 0;
}

/* Micro-batches the busiest of r replicas takes a step: the runtime deals
 * them whole and in turn. */
static int rounds(const mmp_plan *p, int r)
{
    return (p->train.microbatches + r - 1) / r;
}

/* A memory figure: GiB from 1 GiB up, else MiB (a small model's stages hold
 * tens of MB: "0.07 GiB" would hide what a cap compares). */
static void print_bytes(double b)
{
    if (b >= (double)(1 << 30)) {
        printf("%8.3f GiB", b / (1 << 30));
    } else {
        printf("%8.1f MiB", b / (1 << 20));
    }
}

static int plan_placement(const mmp_plan *p, const mmp_sched *s, const mmp_sim_costs *c,
                          int measured, int devices, double mem_cap)
{
    /* the planner's per-layer costs: per process, per sample */
    static mmp_layer_costs lc;
    layer_costs(p, s, c, &lc);
    if (mem_cap > 0) {
        mmp_costs_per_layer_mem(
            s, c->mem_bytes, c->state_bytes, c->act_slots,
            (p->train.batch + p->train.microbatches - 1) / p->train.microbatches, &lc);
        if (!lc.have_mem) {
            fprintf(stderr, "mmpipe simulate: --device-memory: the run recorded no peak_mem_bytes "
                            "for some stage\n");
            return 1;
        }
    }
    mmp_planner_input in;
    mmp_costs_planner_input(p, &lc, &in);
    in.mem_cap_bytes = mem_cap;
    in.devices = devices;
    in.batch = p->train.batch;
    in.send_ms = c->send_ms;
    in.step_overhead_ms = c->step_overhead_ms;
    mmp_planner_result r;
    double t0 = mmp_now();
    mmp_err e = mmp_planner_plan(&in, &r);
    double took = mmp_now() - t0;
    if (e != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: --plan-devices %d: %s\n", devices, mmp_last_error());
        return 1;
    }
    const mmp_planner_eval *v = &r.eval;
    printf("\nplanner: %d devices, %s per-layer costs, %d micro-batches of %d samples at most; "
           "planned in %.1f ms (%d candidates, %d simulated)\n",
           devices, costs_word(p, measured), p->train.microbatches,
           (p->train.batch + p->train.microbatches - 1) / p->train.microbatches, 1000 * took,
           r.candidates, r.simulated);
    printf("%-10s %-9s %8s %12s %10s %10s\n", "stage", "layers", "replicas", "ms/mb/repl", "busy",
           mem_cap > 0 ? "memory" : "");
    static const char *const names[2] = {"image", "text"};
    for (int b = 0; b < 2; b++) {
        for (int j = 0; j < r.placement.n_sub[b]; j++) {
            const mmp_planner_stage *g = &r.placement.sub[b][j];
            char name[32], layers[32];
            snprintf(name, sizeof name, "%s.%d", names[b], j);
            snprintf(layers, sizeof layers, "[%d,%d)", g->first, g->last);
            printf("%-10s %-9s %8d %12.3f %9.1f%% ", name, layers, g->replicas, v->stage_ms[b][j],
                   100 * rounds(p, g->replicas) * v->stage_ms[b][j] / v->step_ms);
            if (mem_cap > 0) {
                print_bytes(v->stage_bytes[b][j]);
            }
            printf("\n");
        }
    }
    printf("%-10s %-9s %8d %12.3f %9.1f%% ", "fusion", "[0,1)", r.placement.fusion_replicas,
           v->fusion_ms, 100 * rounds(p, r.placement.fusion_replicas) * v->fusion_ms / v->step_ms);
    if (mem_cap > 0) {
        print_bytes(v->fusion_bytes);
        printf(" (cap ");
        print_bytes(mem_cap);
        printf(" per device)");
    }
    printf("\n");
    printf("(ms/mb/repl: one replica's forward + backward per micro-batch; busy: its busiest "
           "replica's share of the step)\nas plan keys:");
    for (int b = 0; b < 2; b++) {
        printf(" stages.%s.split: [", names[b]);
        for (int j = 1; j < r.placement.n_sub[b]; j++) {
            printf("%s%d", j > 1 ? ", " : "", r.placement.sub[b][j].first);
        }
        printf("], stages.%s.replicas: [", names[b]);
        for (int j = 0; j < r.placement.n_sub[b]; j++) {
            printf("%s%d", j ? ", " : "", r.placement.sub[b][j].replicas);
        }
        printf("],");
    }
    printf(" stages.fusion.replicas: %d\n", r.placement.fusion_replicas);
    /* The planner scales to any device count; one plan holds at most
     * MMP_SCHED_MAX_STAGES processes and MMP_SCHED_MAX_EDGES channels: say
     * when these keys would be refused (what a launch of them would say). */
    static mmp_plan keyed;
    static mmp_sched probe;
    keyed = *p;
    keyed.stages_auto = 0;
    mmp_placement_to_plan(&r.placement, &keyed);
    static mmp_sim_result keyed_sim;
    int have_keyed_sim = 0;
    if (mmp_sched_compile(&probe, &keyed) != MMP_OK) {
        printf("(not one plan: %s; a job this large needs a smaller --plan-devices)\n",
               mmp_last_error());
    } else if (!measured) {
        /* The keys' own schedule, simulated with the same costs, is what a
         * launch would do; the planner's figure should agree with it (both
         * deal whole micro-batches to a stage's replicas), and is flagged
         * where it does not. */
        static mmp_sim_costs kc;
        mmp_costs_nominal(&keyed, &probe, &kc);
        have_keyed_sim = mmp_sched_simulate(&probe, &kc, &keyed_sim) == MMP_OK;
    }
    mmp_sched_fini(&probe);
    printf("\npredicted step time %.3f ms (%s; closed form %.3f ms), %.1f samples/s, balance "
           "efficiency %.1f%% (busy / (%d devices x step)); %d of %d devices used; queueing at "
           "the bottleneck %.3f ms a step (the least any placement reaches: %.3f)\n",
           v->step_ms, mmp_planner_method_name(v->method), v->closed_form_ms, v->samples_per_s,
           100 * v->efficiency, devices, v->devices_used, devices, v->bottleneck_ms, r.bound_ms);
    if (have_keyed_sim) {
        double off = v->step_ms > 0 ? keyed_sim.step_ms / v->step_ms : 0;
        printf("these keys' own schedule simulates to %.3f ms a step (the schedule a launch of "
               "them compiles, with the same costs)%s\n",
               keyed_sim.step_ms,
               off > 1.1 ? ": the planner's figure is optimistic here, trust this one" : "");
    }
    return 0;
}

int mmp_cmd_simulate(int argc, char **argv)
{
    const char *costs_arg = NULL, *plan_devices = NULL, *device_memory = NULL,
               *plan_cores_arg = NULL;
    int want_dump = 0;
    static mmp_plan plan;
    static mmp_sched sched;
    memset(&sched, 0, sizeof sched);
    const mmp_cli_opt opts[] = {
        {"--dump", MMP_CLI_FLAG, &want_dump},
        {"--plan-devices", MMP_CLI_VALUE, &plan_devices},
        {"--plan-cores", MMP_CLI_VALUE, &plan_cores_arg},
        {"--device-memory", MMP_CLI_VALUE, &device_memory},
        {"--costs", MMP_CLI_VALUE, &costs_arg},
        {"--set", MMP_CLI_SET, NULL},
    };
    mmp_cli_args args;
    int ret = mmp_cli_parse("simulate", USAGE, opts, (int)(sizeof opts / sizeof opts[0]), argc,
                            argv, &args);
    if (ret != MMP_CLI_GO) {
        goto exit;
    }
    const char *plan_path = args.plan;
    ret = 1;
    int devices = 0, cores = 0;
    if (parse_count(plan_devices, "--plan-devices", "device", &devices) != 0 ||
        parse_count(plan_cores_arg, "--plan-cores", "core", &cores) != 0) {
        ret = 2;
        goto exit;
    }
    double mem_cap = 0;
    if (device_memory) {
        if (!plan_devices || !costs_arg) {
            fprintf(stderr, "mmpipe simulate: --device-memory needs --plan-devices and --costs RUN "
                            "(the run's measured memory per stage)\n");
            ret = 2;
            goto exit;
        }
        if (parse_size(device_memory, &mem_cap) != 0) {
            fprintf(stderr,
                    "mmpipe simulate: --device-memory '%s': expected a byte count, optionally with "
                    "K, M, G or T (powers of 1024), e.g. 80G\n",
                    device_memory);
            ret = 2;
            goto exit;
        }
    }
    if (mmp_plan_load(&plan, plan_path, args.sets, args.n_sets) != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
        goto exit;
    }
    mmp_sim_costs costs;
    mmp_costs_run run;
    memset(&run, 0, sizeof run);
    if (costs_arg) {
        if (mmp_costs_measure(costs_arg, &plan, &sched, &costs, &run) != MMP_OK) {
            fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
            goto exit;
        }
    } else {
        if (mmp_sched_compile(&sched, &plan) != MMP_OK) {
            fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
            goto exit;
        }
        mmp_costs_nominal(&plan, &sched, &costs);
    }
    mmp_sim_result r;
    if (mmp_sched_simulate(&sched, &costs, &r) != MMP_OK) {
        fprintf(stderr, "mmpipe simulate: %s\n", mmp_last_error());
        goto exit;
    }
    printf("plan %s: schedule %s, %d micro-batches of %.4g samples (batch %d), %d stages\n",
           plan_path, mmp_schedule_name(sched.kind), sched.microbatches,
           (double)plan.train.batch / sched.microbatches, plan.train.batch, sched.n_stages);
    if (costs_arg) {
        printf("costs: measured, medians over %d step%s of %s (first step left out as warm-up); "
               "send and step overhead not measured (0 ms)\n",
               run.n_steps, run.n_steps == 1 ? "" : "s", run.path);
        printf("placement: %s (the run's last)\n", run.placement[0] ? run.placement : "the plan's");
        if (run.routing[0]) {
            printf("routing: the run's last step's, %s micro-batches\n", run.routing);
        }
        printf("\n");
    } else if (plan.compute == MMP_COMPUTE_SIMULATED) {
        printf("costs: the plan's sim.* (compute: simulated), per device slot's slowdown; "
               "load/send/step overhead free\n\n");
    } else {
        printf("nominal costs (not measured): forward %.2g ms per layer per sample, backward 2x "
               "forward, load/send/step overhead free\n\n",
               MMP_COSTS_NOMINAL_FWD_MS);
    }
    mmp_costs_report(stdout, &plan, &sched, &costs, &r);
    if (costs_arg) {
        printf("measured step time %.3f ms (median of %d step%s), prediction error %+.1f%%\n",
               run.step_ms, run.n_steps, run.n_steps == 1 ? "" : "s",
               run.step_ms > 0 ? 100 * (r.step_ms - run.step_ms) / run.step_ms : 0.0);
    }
    if (want_dump) {
        dump(&sched);
    }
    if (plan_devices) {
        if (devices == 0) { /* all */
            for (int h = 0; h < plan.n_hosts; h++) {
                devices += plan.hosts[h].n_devices;
            }
        }
        if (plan_placement(&plan, &sched, &costs, costs_arg != NULL, devices, mem_cap) != 0) {
            goto exit;
        }
    }
    if (plan_cores_arg) {
        if (cores == 0) { /* all */
            static int list[MMP_PIN_MAX_CORES];
            cores = plan.train.pin.mode != MMP_PIN_OFF ? mmp_pin_list(&plan, list)
                                                       : mmp_pin_allowed(list, MMP_PIN_MAX_CORES);
        }
        if (plan_cores(&plan, &sched, &costs, costs_arg != NULL, cores) != 0) {
            goto exit;
        }
    }
    ret = 0;
exit:
    mmp_sched_fini(&sched);
    mmp_cli_args_fini(&args);
    return ret;
}
