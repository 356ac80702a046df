/* coordinator/placement: the text form metrics.jsonl records reads back into
 * the placement it was written from (compiled schedule -> text -> placement
 * -> plan -> schedule gives the same text); malformed text is an error
 * naming the token; coordinator/costs: the per-layer estimate takes each
 * stage's fastest replica, spread evenly over its layers. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coordinator/costs.h"
#include "coordinator/placement.h"
#include "tests/harness.h"

/* The default model with 64 samples in 8 micro-batches; the image branch
 * has more than 3 layers. */
static void make_plan(mmp_plan *p)
{
    mmp_plan_defaults(p);
    p->train.batch = 64;
    p->train.microbatches = 8;
}

static void test_round_trip(void)
{
    static mmp_plan p, q;
    static mmp_sched s, t;
    make_plan(&p);
    p.stages.image.n_split = 1;
    p.stages.image.split[0] = 3;
    p.stages.image.n_replicas = 2;
    p.stages.image.replicas[0] = 2;
    p.stages.image.replicas[1] = 1;
    p.stages.fusion.n_replicas = 1;
    p.stages.fusion.replicas[0] = 2;
    CHECK_OK(mmp_sched_compile(&s, &p));
    char text[256], again[256];
    mmp_placement_str(&s, text, sizeof text);
    char want[256];
    snprintf(want, sizeof want, "image.0[0:3):2 image.1[3:%d):1 text.0:1 fusion:2",
             mmp_plan_image_layers(&p));
    CHECK(strcmp(text, want) == 0);
    mmp_placement pl;
    CHECK_OK(mmp_placement_parse(text, mmp_plan_image_layers(&p), mmp_plan_text_layers(&p), &pl));
    mmp_placement from_sched;
    mmp_placement_of_sched(&s, &from_sched);
    CHECK(memcmp(&pl, &from_sched, sizeof pl) == 0);
    make_plan(&q);
    mmp_placement_to_plan(&pl, &q);
    CHECK_OK(mmp_sched_compile(&t, &q));
    CHECK(strcmp(mmp_placement_str(&t, again, sizeof again), text) == 0);
    mmp_sched_fini(&s);
    mmp_sched_fini(&t);
}

static void test_bad_text(void)
{
    mmp_placement pl;
    const char *bad[] = {
        "image.0:0 text.0:1 fusion:1",             /* no replicas */
        "image.1:1 text.0:1 fusion:1",             /* sub-stage out of order */
        "image.0[0:3):1 image.1[4:10):1 fusion:1", /* ranges with a gap */
        "image.0:1 text.0:x fusion:1",             /* not a count */
        "video.0:1",                               /* no such branch */
        "image.0[0:3):1 image.1[3:12):1 fusion:1", /* past the branch's 10 layers */
        "image.0[1:3):1 image.1[3:10):1 fusion:1", /* not from layer 0 */
        "image.0:1 text.0:1 fusion:2147483647",    /* more replicas than a schedule holds */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(mmp_placement_parse(bad[i], 10, 6, &pl) == MMP_ERR_DATA);
        CHECK(strstr(mmp_last_error(), "cannot read the placement") != NULL);
    }
}

static void test_per_layer(void)
{
    static mmp_plan p;
    static mmp_sched s;
    static mmp_layer_costs lc;
    make_plan(&p);
    p.stages.text.n_replicas = 1;
    p.stages.text.replicas[0] = 2;
    CHECK_OK(mmp_sched_compile(&s, &p));
    /* processes: image.0, text.0/0, text.0/1, fusion */
    CHECK(s.n_stages == 4);
    double fwd[4] = {10, 6, 3, 1}, bwd[4] = {20, 12, 6, 2};
    CHECK(mmp_costs_per_layer(&s, fwd, bwd, &lc) == 1);
    int il = mmp_plan_image_layers(&p), tl = mmp_plan_text_layers(&p);
    CHECK(fabs(lc.fwd[MMP_PLANNER_IMAGE][0] - 10.0 / il) < 1e-12);
    CHECK(fabs(lc.bwd[MMP_PLANNER_IMAGE][il - 1] - 20.0 / il) < 1e-12);
    CHECK(fabs(lc.fwd[MMP_PLANNER_TEXT][tl - 1] - 3.0 / tl) < 1e-12); /* the faster replica */
    CHECK(lc.fusion_fwd == 1 && lc.fusion_bwd == 2);
    fwd[0] = bwd[0] = NAN;
    CHECK(mmp_costs_per_layer(&s, fwd, bwd, &lc) == 0);
    mmp_sched_fini(&s);
}

/* Which transport an edge gets: nccl only between GPU ends on two hosts. */
static void test_edge_transport(void)
{
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 1, 0, 1), "nccl") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 1, 0, 0), "nccl") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 1, -1, 0), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 1, 0, -1), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 1, -1, -1), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_TCP, 1, 0, 1), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_SHM, 1, 0, 1), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 0, 0, 1), "cuda_ipc") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 0, -1, 1), "shm") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_AUTO, 0, -1, -1), "shm") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_TCP, 0, 0, 1), "tcp") == 0);
    CHECK(strcmp(mmp_edge_transport(MMP_DATA_SHM, 0, 0, 1), "shm") == 0);
}

/* Which transport a stage's replicas' reduce gets: nccl only for GPU
 * replicas on several hosts, auto, in a build with NCCL. */
static void test_reduce_transport(void)
{
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_AUTO, 1, 1, 1), "nccl") == 0);
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_AUTO, 1, 1, 0), "tcp") == 0); /* no NCCL built */
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_AUTO, 1, 0, 1), "tcp") == 0); /* a CPU replica */
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_TCP, 1, 1, 1), "tcp") == 0);
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_SHM, 1, 1, 1), "tcp") == 0);
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_AUTO, 0, 1, 1), "shm") == 0); /* one host */
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_AUTO, 0, 0, 0), "shm") == 0);
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_TCP, 0, 1, 1), "tcp") == 0);
    CHECK(strcmp(mmp_reduce_transport(MMP_DATA_SHM, 0, 1, 1), "shm") == 0);
}

/* nccl only for replicas each on a GPU of its own: NCCL refuses two ranks
 * on one GPU, so two replicas sharing cuda:0 of one host go over tcp. */
static void test_replicas_own_gpus(void)
{
    int h2[] = {0, 1}, d2[] = {0, 0};
    CHECK(mmp_replicas_own_gpus(h2, d2, 2)); /* cuda:0 of two hosts */
    int h3[] = {0, 0, 1}, d3[] = {0, 0, 0};
    CHECK(!mmp_replicas_own_gpus(h3, d3, 3)); /* two on host 0's cuda:0 */
    int d3b[] = {0, 1, 0};
    CHECK(mmp_replicas_own_gpus(h3, d3b, 3));
    int d2c[] = {0, -1};
    CHECK(!mmp_replicas_own_gpus(h2, d2c, 2)); /* a CPU replica */
    int h4[] = {1, 0, 2, 0}, d4[] = {3, 2, 3, 2};
    CHECK(!mmp_replicas_own_gpus(h4, d4, 4)); /* the pair need not be adjacent */
    CHECK(mmp_replicas_own_gpus(h4, d4, 3));
}

/* Sets p's hosts: n_hosts hosts of the given device lists (-1 the CPU). */
static void set_hosts(mmp_plan *p, int n_hosts, const int *n_devices, const int devices[][4])
{
    p->n_hosts = n_hosts;
    for (int h = 0; h < n_hosts; h++) {
        p->hosts[h].n_devices = n_devices[h];
        for (int d = 0; d < n_devices[h]; d++) {
            p->hosts[h].devices[d] = devices[h][d];
        }
    }
}

/* MPS when two processes land on one GPU of one host: two slots naming it,
 * or more processes than slots dealt onto a GPU slot twice; the same
 * ordinal on two hosts is two GPUs. */
static void test_procs_share_gpu(void)
{
    static mmp_plan p;
    make_plan(&p);
    const int one[] = {3}, three_same[][4] = {{0, 0, 0}};
    set_hosts(&p, 1, one, three_same);
    CHECK(mmp_procs_share_gpu(&p, 3));
    CHECK(!mmp_procs_share_gpu(&p, 1));
    const int distinct[][4] = {{0, 1, 2}};
    set_hosts(&p, 1, one, distinct);
    CHECK(!mmp_procs_share_gpu(&p, 3));
    CHECK(mmp_procs_share_gpu(&p, 4)); /* process 3 back on slot 0's cuda:0 */
    const int n1[] = {1}, single[][4] = {{0}};
    set_hosts(&p, 1, n1, single);
    CHECK(!mmp_procs_share_gpu(&p, 1));
    CHECK(mmp_procs_share_gpu(&p, 3)); /* three processes on the one slot */
    const int cpu_gpu[][4] = {{-1, 0}}, n2[] = {2};
    set_hosts(&p, 1, n2, cpu_gpu);
    CHECK(!mmp_procs_share_gpu(&p, 3)); /* the slot dealt twice is the CPU */
    CHECK(mmp_procs_share_gpu(&p, 4));
    const int two_hosts[][4] = {{0}, {0}}, n11[] = {1, 1};
    set_hosts(&p, 2, n11, two_hosts);
    CHECK(!mmp_procs_share_gpu(&p, 2)); /* cuda:0 of two hosts */
    CHECK(mmp_procs_share_gpu(&p, 3));
    const int cpus[][4] = {{-1, -1}}, n0[] = {2};
    set_hosts(&p, 1, n0, cpus);
    CHECK(!mmp_procs_share_gpu(&p, 5));
}

/* The most processes on one device, for the balancer's memory cap: dealt in
 * turn over the slots, a GPU named by several slots counted once (three of
 * four slots on cuda:0: three of four processes there, not an even two). */
static void test_procs_most_on_device(void)
{
    static mmp_plan p;
    make_plan(&p);
    const int four[] = {4}, uneven[][4] = {{0, 0, 0, 1}};
    set_hosts(&p, 1, four, uneven);
    CHECK(mmp_procs_most_on_device(&p, 4) == 3);
    CHECK(mmp_procs_most_on_device(&p, 2) == 2);
    CHECK(mmp_procs_most_on_device(&p, 0) == 1);
    const int distinct[][4] = {{0, 1, 2, 3}};
    set_hosts(&p, 1, four, distinct);
    CHECK(mmp_procs_most_on_device(&p, 4) == 1);
    CHECK(mmp_procs_most_on_device(&p, 9) == 3); /* dealt around twice, then slot 0 again */
    const int cpus[][4] = {{-1, -1, -1}}, three[] = {3};
    set_hosts(&p, 1, three, cpus);
    CHECK(mmp_procs_most_on_device(&p, 3) == 1);
    CHECK(mmp_procs_most_on_device(&p, 4) == 2);
    const int two_hosts[][4] = {{0, 0}, {0, 0}}, n22[] = {2, 2};
    set_hosts(&p, 2, n22, two_hosts);
    CHECK(mmp_procs_most_on_device(&p, 4) == 2); /* cuda:0 of each host: two GPUs */
}

MMP_TEST_LIST("test_placement", MMP_TEST_CASE(test_round_trip), MMP_TEST_CASE(test_bad_text),
              MMP_TEST_CASE(test_per_layer), MMP_TEST_CASE(test_edge_transport),
              MMP_TEST_CASE(test_replicas_own_gpus), MMP_TEST_CASE(test_reduce_transport),
              MMP_TEST_CASE(test_procs_share_gpu), MMP_TEST_CASE(test_procs_most_on_device))
