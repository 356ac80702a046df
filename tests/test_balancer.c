/* The balancer's measured efficiency (coordinator/balancer.h): busy over
 * slots x step time, and where a CPU plan has more processes than cores,
 * each process counted for at most the CPU time it got, so two processes
 * sharing a core cannot both count the core's time. */
#include "coordinator/balancer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/pin.h"

#include "tests/harness.h"

/* The demo's shape on the given cores (train.pin: a list of that many), 1/1/1. */
static void make(mmp_plan *p, mmp_sched *s, int cores)
{
    mmp_plan_defaults(p);
    p->train.pin.mode = MMP_PIN_LIST;
    p->train.pin.n_cores = cores;
    for (int k = 0; k < cores; k++) {
        p->train.pin.cores[k] = k;
    }
    CHECK_OK(mmp_sched_compile(s, p));
}

static void test_shared_cores(void)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_balancer b;
    make(&p, &s, 2);
    mmp_balancer_reset(&b, &p, &s, "{}");
    CHECK(b.cores == 2 && b.slots == 2 && s.n_stages == 3);
    /* 3 processes on 2 cores, a 100 ms step: image computes 90 ms of wall
     * time but got 60 ms of CPU (text held its core 30 ms of that) */
    mmp_bal_proc pr[3] = {{.busy_ms = 90, .cpu_ms = 60},
                          {.busy_ms = 70, .cpu_ms = 70},
                          {.busy_ms = 60, .cpu_ms = 65}};
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (60 + 70 + 60) / 200.0) < 1e-12);
    CHECK(b.efficiency <= 1);
    /* wall-time busy alone would say 1.1 */
    CHECK((90 + 70 + 60) / 200.0 > 1);
    /* a stage that reports no CPU time (0) counts its wall time */
    pr[0].cpu_ms = 0;
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (90 + 70 + 60) / 200.0) < 1e-12);
    mmp_sched_fini(&s);
}

static void test_core_each(void)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_balancer b;
    make(&p, &s, 4); /* a core for each process: wall time is the measure */
    mmp_balancer_reset(&b, &p, &s, "{}");
    CHECK(b.cores == 4 && b.slots == 4);
    mmp_bal_proc pr[3] = {{.busy_ms = 90, .cpu_ms = 60},
                          {.busy_ms = 70, .cpu_ms = 70},
                          {.busy_ms = 60, .cpu_ms = 65}};
    mmp_balancer_observe(&b, pr, 100);
    CHECK(fabs(b.efficiency - (90 + 70 + 60) / 400.0) < 1e-12);
    mmp_sched_fini(&s);
}

/* The live re-planning on hosts with more device slots than a plan can run
 * processes (2 hosts x 64 GPUs: 128 slots; a schedule holds at most
 * MMP_SCHED_MAX_STAGES) and few micro-batches, the image branch far the
 * dearest: the placement it proposes must compile as a plan (it would
 * otherwise stop the run: coordinator/steps.c), no stage over
 * MMP_MAX_REPLICAS, a branch's first sub-stage with no more replicas than
 * micro-batches (common/plan.c refuses those). The old balancer asked the
 * planner for all 128 slots, got a first sub-stage with more replicas than
 * micro-batches, and silently kept the 1/1/1 placement (20x slower here);
 * had it passed that check, a placement over the schedule's limits would
 * have stopped the run. */
static void replan_within_plan_limits(int hosts, int microbatches, int batch, int least_procs,
                                      int most_procs)
{
    static mmp_plan p, next;
    static mmp_sched s, probe;
    static mmp_balancer b;
    mmp_plan_defaults(&p);
    p.n_hosts = hosts;
    for (int h = 0; h < hosts; h++) {
        snprintf(p.hosts[h].name, sizeof p.hosts[h].name, "node%d", h);
        p.hosts[h].n_devices = MMP_MAX_DEVICES;
        for (int d = 0; d < MMP_MAX_DEVICES; d++) {
            p.hosts[h].devices[d] = d;
        }
    }
    p.train.microbatches = microbatches;
    p.train.batch = batch > 0 ? batch : p.train.batch;
    p.balance.mode = MMP_BALANCE_DYNAMIC;
    p.balance.window = 2;
    CHECK_OK(mmp_sched_compile(&s, &p));
    mmp_balancer_reset(&b, &p, &s, "{}");
    CHECK(b.cores == 0 && b.slots == hosts * MMP_MAX_DEVICES && s.n_stages == 3);
    int per_proc = p.train.batch; /* 1/1/1: each process sees every sample */
    mmp_bal_proc pr[3] = {{.fwd_ms = 4000, .bwd_ms = 8000, .samples = per_proc, .busy_ms = 12000},
                          {.fwd_ms = 40, .bwd_ms = 80, .samples = per_proc, .busy_ms = 120},
                          {.fwd_ms = 20, .bwd_ms = 40, .samples = per_proc, .busy_ms = 60}};
    for (int k = 0; k < 3; k++) {
        mmp_balancer_observe(&b, pr, 12500);
    }
    int go = 0;
    char why[1024];
    double gain;
    CHECK_OK(mmp_balancer_replan(&b, 3, &next, &go, why, sizeof why, &gain));
    CHECK(go == 1);
    if (go) {
        printf("  re-placed: %s\n", why);
        mmp_err e = mmp_sched_compile(&probe, &next);
        CHECK_OK(e);
        if (e == MMP_OK) {
            CHECK(probe.n_stages > 3 && probe.n_stages <= MMP_SCHED_MAX_STAGES);
            CHECK(probe.n_stages >= least_procs && probe.n_stages <= most_procs);
            printf("  %d slots, %d micro-batches: %d processes\n", b.slots, microbatches,
                   probe.n_stages);
        }
        mmp_sched_fini(&probe);
        const mmp_stage_cfg *br[2] = {&next.stages.image, &next.stages.text};
        for (int k = 0; k < 2; k++) {
            CHECK(br[k]->n_replicas >= 1 && br[k]->replicas[0] <= p.train.microbatches);
            for (int j = 0; j < br[k]->n_replicas; j++) {
                CHECK(br[k]->replicas[j] >= 1 && br[k]->replicas[j] <= MMP_MAX_REPLICAS);
            }
        }
        CHECK(next.stages.fusion.replicas[0] <= MMP_MAX_REPLICAS);
    }
    mmp_sched_fini(&s);
}

static void test_replan_within_plan_limits(void)
{
    /* few micro-batches: the old balancer dropped the planner's proposal
     * (image.0 with more replicas than micro-batches) and never re-placed */
    replan_within_plan_limits(2, 4, 0, 4, 128);
    /* one sample a micro-batch (the old balancer did not re-place either) */
    static mmp_plan d;
    mmp_plan_defaults(&d);
    replan_within_plan_limits(
        2, d.train.batch < MMP_MAX_MICROBATCHES ? d.train.batch : MMP_MAX_MICROBATCHES, 0, 4, 128);
}

/* A plan's most slots (MMP_MAX_HOSTS x 64 devices: 8192, past the
 * MMP_SCHED_MAX_STAGES processes a schedule holds) and micro-batches enough
 * to feed them: the balancer asks the planner for 1024 (no more) and
 * re-places to far more than the 64 processes a plan held before,
 * a placement that compiles (the old schedule compiler refused anything over
 * 64, so the balancer asked for 64 devices at most). */
static void test_replan_thousand_slots(void)
{
    replan_within_plan_limits(MMP_MAX_HOSTS, 256, 256 * 64, 512, MMP_SCHED_MAX_STAGES);
}

/* ---- memory ------------------------------------------------------------------------ */

#define GIB 1073741824.0
#define IMAGE_STATE_GIB 5.0

/* One host whose slots name the CUDA devices dev[0..n-1], the demo's model,
 * 1/1/1, dynamic; three steps where the image stage is 10x the text's and
 * holds IMAGE_STATE_GIB of parameter arenas (7 GiB at its peak, 2 slots),
 * text 1 GiB, fusion 0.5. cap_gib: balance.device_memory_gib; gpu_gib: the
 * device memory the stages report (0: none). Returns go; *next, why. */
static int mem_replan(const int *dev, int n, double cap_gib, double gpu_gib, mmp_plan *next,
                      char *why, size_t why_n)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_balancer b;
    mmp_plan_defaults(&p);
    if (dev) {
        p.n_hosts = 1;
        snprintf(p.hosts[0].name, sizeof p.hosts[0].name, "node0");
        p.hosts[0].n_devices = n;
        for (int d = 0; d < n; d++) {
            p.hosts[0].devices[d] = dev[d];
        }
    } else { /* a CPU plan on n cores (train.pin's list): the planner on cores */
        p.train.pin.mode = MMP_PIN_LIST;
        p.train.pin.n_cores = n;
        for (int k = 0; k < n; k++) {
            p.train.pin.cores[k] = k;
        }
    }
    p.train.microbatches = 8;
    p.balance.mode = MMP_BALANCE_DYNAMIC;
    p.balance.window = 2;
    p.balance.device_memory_gib = (float)cap_gib;
    CHECK_OK(mmp_sched_compile(&s, &p));
    mmp_balancer_reset(&b, &p, &s, "{}");
    mmp_bal_proc pr[3];
    for (int i = 0; i < 3; i++) {
        int k = s.stages[i].kind;
        double ms = k == MMP_KIND_IMAGE ? 4000 : k == MMP_KIND_TEXT ? 400 : 20;
        double peak = k == MMP_KIND_IMAGE ? 7 : k == MMP_KIND_TEXT ? 1 : 0.5;
        double state = k == MMP_KIND_IMAGE ? IMAGE_STATE_GIB : k == MMP_KIND_TEXT ? 0.5 : 0.1;
        pr[i] = (mmp_bal_proc){.fwd_ms = ms,
                               .bwd_ms = 2 * ms,
                               .samples = p.train.batch,
                               .busy_ms = 3 * ms,
                               .peak_mem_bytes = peak * GIB,
                               .state_bytes = state * GIB,
                               .act_slots = 2,
                               .device_total_bytes = gpu_gib * GIB};
    }
    for (int k = 0; k < 3; k++) {
        mmp_balancer_observe(&b, pr, 12500);
    }
    int go = 0;
    double gain;
    why[0] = 0;
    CHECK(dev || b.cores == n); /* the planner on cores it is */
    CHECK_OK(mmp_balancer_replan(&b, 3, next, &go, why, why_n, &gain));
    mmp_sched_fini(&s);
    return go;
}

/* The most layers an image sub-stage of next holds. */
static int widest_image_stage(const mmp_plan *next)
{
    int n = mmp_plan_image_layers(next), at = 0, most = 0;
    for (int j = 0; j <= next->stages.image.n_split; j++) {
        int end = j < next->stages.image.n_split ? next->stages.image.split[j] : n;
        most = end - at > most ? end - at : most;
        at = end;
    }
    return most;
}

/* Whether every image sub-stage's parameter arenas alone (its share of
 * IMAGE_STATE_GIB: the least it can hold) fit cap_gib. */
static int image_state_fits(const mmp_plan *next, double cap_gib)
{
    return IMAGE_STATE_GIB * widest_image_stage(next) / mmp_plan_image_layers(next) <=
           cap_gib * (1 + 1e-9);
}

/* Re-placement under a memory cap: the planner is given the measured
 * memory and the cap, shared by processes that share a device; a cap no
 * placement fits keeps the current one (no error); a GPU's reported memory
 * is the cap when the plan sets none. Each case checks the state-only
 * bound (independent of the planner's activation model), and the
 * unconstrained choice breaks it, so the cap is what changed the choice. */
static void test_replan_under_memory_cap(void)
{
    static mmp_plan next;
    char why[1024];
    static const int eight[8] = {0, 1, 2, 3, 4, 5, 6, 7}, shared[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    CHECK(mem_replan(eight, 8, 0, 0, &next, why, sizeof why) == 1);
    printf("  no cap: %s\n  image: widest sub-stage %d of %d layers\n", why,
           widest_image_stage(&next), mmp_plan_image_layers(&next));
    CHECK(!image_state_fits(&next, 2.5)); /* the cases below change it */
    CHECK(strstr(why, "memory:") == NULL);

    CHECK(mem_replan(eight, 8, 2.5, 0, &next, why, sizeof why) == 1);
    printf("  cap 2.5 GiB: %s\n  image: widest sub-stage %d\n", why, widest_image_stage(&next));
    CHECK(image_state_fits(&next, 2.5));
    CHECK(strstr(why, "cap 2.50 GiB a device") != NULL);

    /* twice that cap on 8 slots that name 4 GPUs: two processes a GPU */
    CHECK(mem_replan(eight, 8, 5.0, 0, &next, why, sizeof why) == 1);
    int alone = widest_image_stage(&next);
    printf("  cap 5 GiB, 8 GPUs: image: widest sub-stage %d\n", alone);
    CHECK(image_state_fits(&next, 5.0) && !image_state_fits(&next, 2.5)); /* sharing changes it */
    CHECK(mem_replan(shared, 8, 5.0, 0, &next, why, sizeof why) == 1);
    printf("  cap 5 GiB, 4 GPUs in 8 slots: image: widest sub-stage %d\n",
           widest_image_stage(&next));
    CHECK(image_state_fits(&next, 2.5));

    /* a GPU's own memory, less 1 GiB, when the plan sets no cap */
    CHECK(mem_replan(eight, 8, 0, 3.5, &next, why, sizeof why) == 1);
    printf("  3.5 GiB GPUs: %s\n", why);
    CHECK(image_state_fits(&next, 2.5));
    CHECK(strstr(why, "cap 2.50 GiB a device") != NULL);
    /* the plan's cap wins over the GPU's */
    CHECK(mem_replan(eight, 8, 20, 3.5, &next, why, sizeof why) == 1);
    CHECK(strstr(why, "cap 20.00 GiB a device") != NULL);

    /* under every layer's own state: nothing fits, the placement stays */
    CHECK(mem_replan(eight, 8, 0.5, 0, &next, why, sizeof why) == 0);

    /* a CPU plan on 4 cores: the planner on cores knows no memory; its
     * placement is taken under a cap it fits, not under one it breaks */
    CHECK(mem_replan(NULL, 4, 100, 0, &next, why, sizeof why) == 1);
    printf("  4 cores, cap 100 GiB: %s\n", why);
    CHECK(strstr(why, "cap 100.00 GiB a device") != NULL);
    CHECK(mem_replan(NULL, 4, 0.5, 0, &next, why, sizeof why) == 0);
    /* and no cap on a CPU plan unless the plan sets one */
    CHECK(mem_replan(NULL, 4, 0, 0, &next, why, sizeof why) == 1 && !strstr(why, "memory:"));
}

MMP_TEST_LIST("test_balancer", MMP_TEST_CASE(test_shared_cores), MMP_TEST_CASE(test_core_each),
              MMP_TEST_CASE(test_replan_within_plan_limits),
              MMP_TEST_CASE(test_replan_thousand_slots),
              MMP_TEST_CASE(test_replan_under_memory_cap))
