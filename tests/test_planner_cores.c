/* The planner on CPU cores (coordinator/planner_cores.h): the packing rule
 * (process k on core k % C, whole micro-batches per replica) against hand
 * sums, the demo's measured costs on 2 cores (co-located placement, about
 * twice one process per stage), the search against exhaustive enumeration
 * on small random cases (the best step, or fewer processes within
 * MMP_CORES_PROC_TOLERANCE, in 9 of 10; never worse than the tolerance),
 * many cores, determinism, invalid input. */
#include "coordinator/planner_cores.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/rng.h"
#include "coordinator/placement.h"
#include "tests/harness.h"

#define MAXL 16

typedef struct model {
    double fwd[3][MAXL], bwd[3][MAXL];
    mmp_cores_input ci;
} model;

/* Per-sample forward costs per layer (backward bwd_factor times), li image
 * and lt text layers; batch in m micro-batches on C cores. */
static void make(model *M, int li, const double *fi, int lt, const double *ft, double ff,
                 double bwd_factor, int batch, int m, int C, int batch_loss)
{
    memset(M, 0, sizeof *M);
    const int n[3] = {li, lt, 1};
    const double *f[3] = {fi, ft, &ff};
    mmp_planner_layers *u[3] = {&M->ci.in.branch[0], &M->ci.in.branch[1], &M->ci.in.fusion};
    for (int k = 0; k < 3; k++) {
        for (int l = 0; l < n[k]; l++) {
            M->fwd[k][l] = f[k][l];
            M->bwd[k][l] = bwd_factor * f[k][l];
        }
        u[k]->n = n[k];
        u[k]->fwd_ms = M->fwd[k];
        u[k]->bwd_ms = M->bwd[k];
    }
    M->ci.in.batch = batch;
    M->ci.in.microbatches = m;
    M->ci.in.schedule = MMP_SCHED_1F1B;
    M->ci.in.batch_loss = batch_loss;
    M->ci.cores = C;
}

static mmp_placement flat(const model *M, int ri, int rt, int rf)
{
    mmp_placement pl;
    memset(&pl, 0, sizeof pl);
    const int r[2] = {ri, rt};
    for (int b = 0; b < 2; b++) {
        pl.n_sub[b] = 1;
        pl.sub[b][0] = (mmp_planner_stage){0, M->ci.in.branch[b].n, r[b]};
    }
    pl.fusion_replicas = rf;
    return pl;
}

/* image:2 text:1 fusion:1 on 2 cores: processes 0 (image/0) and 2 (text)
 * on core 0, 1 (image/1) and 3 (fusion) on core 1; m = 5 deals 3 and 2
 * micro-batches to the image replicas. */
static void test_packing_rule(void)
{
    const double fi[2] = {1, 2}, ft[1] = {0.5};
    model M;
    make(&M, 2, fi, 1, ft, 0.25, 2, 20, 5, 2, 0);
    mmp_placement pl = flat(&M, 2, 1, 1);
    mmp_planner_eval e;
    double core[2];
    CHECK_OK(mmp_planner_cores_evaluate(&M.ci, &pl, &e, core));
    /* q0 = 4 samples; image 3 ms/sample fwd + 6 bwd = 9, text 1.5, fusion 0.75 */
    double img_mb = 4 * 9.0, txt_mb = 4 * 1.5, fus_mb = 4 * 0.75;
    CHECK(fabs(core[0] - (3 * img_mb + 5 * txt_mb)) < 1e-9);
    CHECK(fabs(core[1] - (2 * img_mb + 5 * fus_mb)) < 1e-9);
    CHECK(e.step_ms >= core[0] - 1e-9 && e.step_ms >= core[1] - 1e-9);
    CHECK(e.devices_used == 2);
    /* busy is the step's compute, whatever the placement */
    CHECK(fabs(e.busy_ms - 20 * (9 + 1.5 + 0.75)) < 1e-9);
    CHECK(fabs(e.efficiency - e.busy_ms / (2 * e.step_ms)) < 1e-12);
    printf("  image:2 text:1 fusion:1, m=5: cores %.1f / %.1f ms, step %.1f ms\n", core[0], core[1],
           e.step_ms);

    /* batch-wide loss: no backward before the last forward (the flush bound) */
    M.ci.in.batch_loss = 1;
    pl = flat(&M, 1, 1, 1);
    CHECK_OK(mmp_planner_cores_evaluate(&M.ci, &pl, &e, core));
    double f0 = 5 * 4 * 3.0 + 5 * 4 * 0.25, b0 = 5 * 4 * 6.0; /* core 0: image, fusion */
    double f1 = 5 * 4 * 0.5, b1 = 5 * 4 * 1.0, z = 5 * 4 * 0.5;
    CHECK(fabs(core[0] - (f0 + b0 + z)) < 1e-9 && fabs(core[1] - (f1 + b1)) < 1e-9);
    CHECK(e.step_ms >= fmax(f0, f1) + z + fmax(b0, b1) - 1e-9);
}

/* The demo's per-sample costs as its 3-process pipeline measured them
 * (image 0.55 + 1.11 ms, text 0.108 + 0.183 ms, fusion 0.0016 + 0.039 ms;
 * image 6 layers, text 4), batch 64 in 4, batch-wide ITC, on 2 cores. */
/* The demo's measured costs (ms per sample per layer: 6 image layers, 4 text,
 * fusion; backward 2.02 times the forward), batch 64 in 4 micro-batches, on 2
 * cores, batch-wide loss; the text's per-layer cost ft_layer. */
static void demo_model(model *M, double ft_layer)
{
    double fi[6], ft[4];
    for (int l = 0; l < 6; l++) {
        fi[l] = 0.55 / 6;
    }
    for (int l = 0; l < 4; l++) {
        ft[l] = ft_layer;
    }
    make(M, 6, fi, 4, ft, 0.0016, 2.02, 64, 4, 2, 1);
}

static void test_demo_two_cores(void)
{
    model M;
    demo_model(&M, 0.108 / 4);
    M.ci.in.send_ms = 0.05;
    mmp_planner_result r;
    CHECK_OK(mmp_planner_cores_plan(&M.ci, &r));
    mmp_planner_eval one;
    mmp_placement pl1 = flat(&M, 1, 1, 1);
    CHECK_OK(mmp_planner_cores_evaluate(&M.ci, &pl1, &one, NULL));
    char text[256];
    double core[2];
    mmp_planner_eval e;
    CHECK_OK(mmp_planner_cores_evaluate(&M.ci, &r.placement, &e, core));
    printf("  demo on 2 cores: %s: step %.1f ms (cores %.1f / %.1f), efficiency %.3f; "
           "1/1/1: %.1f ms, efficiency %.3f; %d candidates\n",
           mmp_placement_format(&r.placement, text, sizeof text), r.eval.step_ms, core[0], core[1],
           r.eval.efficiency, one.step_ms, one.efficiency, r.candidates);
    CHECK(memcmp(&e, &r.eval, sizeof e) == 0);
    CHECK(mmp_placement_procs(&r.placement) > 3);   /* co-located: more processes than cores */
    CHECK(r.eval.efficiency >= 0.9);                /* predicted */
    CHECK(r.eval.step_ms < 0.65 * one.step_ms);     /* 1/1/1 leaves a core half idle */
    CHECK(fabs(core[0] - core[1]) < 0.1 * core[0]); /* both cores about equally loaded */
    CHECK(r.bound_ms <= r.eval.step_ms);
    /* deterministic */
    mmp_planner_result r2;
    CHECK_OK(mmp_planner_cores_plan(&M.ci, &r2));
    CHECK(memcmp(&r.placement, &r2.placement, sizeof r.placement) == 0);
}

/* Every placement with at most 2 sub-stages per branch, replicas up to 4
 * (fusion 3) and at most max_procs processes; the best score. */
static double brute(const model *M, mmp_placement *best_pl)
{
    double best = INFINITY;
    int li = M->ci.in.branch[0].n, lt = M->ci.in.branch[1].n;
    for (int ci = 0; ci < li; ci++) {     /* image cut (0: none) */
        for (int ct = 0; ct < lt; ct++) { /* text cut (0: none) */
            int ni = ci ? 2 : 1, nt = ct ? 2 : 1;
            for (int code = 0; code < 4 * 4 * 4 * 4 * 3; code++) {
                int c = code, r[5];
                for (int k = 0; k < 4; k++) {
                    r[k] = c % 4 + 1;
                    c /= 4;
                }
                r[4] = c + 1;
                if ((ni == 1 && r[1] != 1) || (nt == 1 && r[3] != 1)) {
                    continue;
                }
                mmp_placement pl;
                memset(&pl, 0, sizeof pl);
                pl.n_sub[0] = ni;
                pl.n_sub[1] = nt;
                pl.sub[0][0] = (mmp_planner_stage){0, ci ? ci : li, r[0]};
                if (ci) {
                    pl.sub[0][1] = (mmp_planner_stage){ci, li, r[1]};
                }
                pl.sub[1][0] = (mmp_planner_stage){0, ct ? ct : lt, r[2]};
                if (ct) {
                    pl.sub[1][1] = (mmp_planner_stage){ct, lt, r[3]};
                }
                pl.fusion_replicas = r[4];
                mmp_planner_eval e;
                if (mmp_planner_cores_evaluate(&M->ci, &pl, &e, NULL) == MMP_OK &&
                    e.step_ms < best) {
                    best = e.step_ms;
                    *best_pl = pl;
                }
            }
        }
    }
    return best;
}

static void test_brute_force(void)
{
    mmp_rng rng;
    mmp_rng_seed(&rng, 17, 0);
    int cases = 0, exact = 0;
    double worst = 1;
    for (int t = 0; t < 60; t++) {
        int li = 2 + (int)(mmp_rng_uniform(&rng) * 4), lt = 1 + (int)(mmp_rng_uniform(&rng) * 3);
        double fi[MAXL], ft[MAXL];
        for (int l = 0; l < li; l++) {
            fi[l] = 0.05 + mmp_rng_uniform(&rng);
        }
        for (int l = 0; l < lt; l++) {
            ft[l] = 0.05 + 0.5 * mmp_rng_uniform(&rng);
        }
        int C = 2 + t % 2, m = 4 + 2 * (t % 3);
        model M;
        make(&M, li, fi, lt, ft, 0.05 * mmp_rng_uniform(&rng), 2, 16 * m, m, C, t % 2);
        M.ci.in.max_sub = 2;
        M.ci.max_procs = 2 * C + 1;
        mmp_planner_result r;
        CHECK_OK(mmp_planner_cores_plan(&M.ci, &r));
        mmp_placement bp;
        double b = brute(&M, &bp);
        double ratio = r.eval.step_ms / b;
        cases++;
        /* the best step, or fewer processes within the tolerance */
        exact +=
            ratio <= 1 + 1e-9 || (mmp_placement_procs(&r.placement) < mmp_placement_procs(&bp) &&
                                  ratio <= 1 + MMP_CORES_PROC_TOLERANCE);
        worst = fmax(worst, ratio);
        CHECK(ratio >= 1 - 1e-9); /* brute force saw every placement the search may return */
        if (ratio > 1.05) {
            char a[256], c[256];
            printf("  case %d: search %s %.3f ms, brute %s %.3f ms\n", t,
                   mmp_placement_format(&r.placement, a, sizeof a), r.eval.step_ms,
                   mmp_placement_format(&bp, c, sizeof c), b);
        }
    }
    printf("  brute force: %d of %d cases exact, worst %.4fx the best step\n", exact, cases, worst);
    CHECK(exact >= cases * 9 / 10);
    CHECK(worst <= 1 + MMP_CORES_PROC_TOLERANCE);
}

/* 64 cores, 4:1:1 over 32 / 8 layers: the search fills the cores. */
static void test_many_cores(void)
{
    double fi[MAXL], ft[MAXL];
    for (int l = 0; l < 16; l++) {
        fi[l] = 4.0 / 16;
    }
    for (int l = 0; l < 8; l++) {
        ft[l] = 1.0 / 8;
    }
    model M;
    make(&M, 16, fi, 8, ft, 1.0, 2, 4096, 64, 32, 0);
    mmp_planner_result r;
    CHECK_OK(mmp_planner_cores_plan(&M.ci, &r));
    char text[512];
    printf("  32 cores: %s: efficiency %.3f, %d processes, %d candidates\n",
           mmp_placement_format(&r.placement, text, sizeof text), r.eval.efficiency,
           mmp_placement_procs(&r.placement), r.candidates);
    CHECK(r.eval.efficiency >= 0.8);
    CHECK(mmp_placement_procs(&r.placement) <= 2 * 32 + 3);
}

static void test_invalid(void)
{
    const double fi[2] = {1, 1}, ft[1] = {1};
    model M;
    make(&M, 2, fi, 1, ft, 1, 2, 16, 4, 2, 1);
    mmp_planner_result r;
    mmp_cores_input ci = M.ci;
    ci.cores = 0;
    CHECK(mmp_planner_cores_plan(&ci, &r) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "0 cores") != NULL);
    ci = M.ci;
    ci.max_procs = 2;
    CHECK(mmp_planner_cores_plan(&ci, &r) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "max_procs 2") != NULL);
    ci = M.ci;
    ci.in.microbatches = 0;
    CHECK(mmp_planner_cores_plan(&ci, &r) == MMP_ERR_INVALID);
    mmp_planner_eval e;
    mmp_placement pl = flat(&M, 4, 2, 2); /* 8 processes, 7 allowed on 2 cores */
    CHECK(mmp_planner_cores_evaluate(&M.ci, &pl, &e, NULL) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "8 processes") != NULL);
}

/* Priorities: on 2 cores, image:2 text:2 fusion:1 (5 processes) puts the
 * image replicas (the big shares) at MMP_CORES_NICE_HEAVY and the rest at 0
 * (with every process as heavy, nobody);
 * on 8 cores the same 5 processes each have a core: all 0; a placement the
 * cores cannot take: -1, untouched. */
static void test_nice(void)
{
    model M;
    demo_model(&M, 0.108 / 4);
    mmp_placement pl = flat(&M, 2, 2, 1);
    int nice[MMP_CORES_MAX_PROCS];
    CHECK(mmp_planner_cores_nice(&M.ci, &pl, nice) == 5);
    const int want[5] = {MMP_CORES_NICE_HEAVY, MMP_CORES_NICE_HEAVY, 0, 0, 0};
    CHECK(memcmp(nice, want, sizeof want) == 0);
    /* text as heavy as image: every branch process is heavy, fusion not */
    demo_model(&M, 0.55 / 4);
    CHECK(mmp_planner_cores_nice(&M.ci, &pl, nice) == 5);
    CHECK(nice[0] > 0 && nice[1] > 0 && nice[2] > 0 && nice[3] > 0 && nice[4] == 0);
    /* fusion as heavy too (its backward under the batch-wide loss counts
     * every micro-batch): nobody light to favour, all 0 */
    M.fwd[2][0] = 0.55 / 4;
    M.bwd[2][0] = 2.02 * 0.55 / 4;
    CHECK(mmp_planner_cores_nice(&M.ci, &pl, nice) == 5);
    for (int k = 0; k < 5; k++) {
        CHECK(nice[k] == 0);
    }
    M.ci.cores = 8;
    CHECK(mmp_planner_cores_nice(&M.ci, &pl, nice) == 5);
    for (int k = 0; k < 5; k++) {
        CHECK(nice[k] == 0);
    }
    M.ci.cores = 2;
    pl = flat(&M, 4, 2, 2); /* 8 processes, 7 allowed on 2 cores */
    nice[0] = 42;
    CHECK(mmp_planner_cores_nice(&M.ci, &pl, nice) == -1 && nice[0] == 42);
}

MMP_TEST_LIST("test_planner_cores", MMP_TEST_CASE(test_packing_rule),
              MMP_TEST_CASE(test_demo_two_cores), MMP_TEST_CASE(test_brute_force),
              MMP_TEST_CASE(test_many_cores), MMP_TEST_CASE(test_invalid), MMP_TEST_CASE(test_nice))
