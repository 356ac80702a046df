/* Schedules: every plan shape compiles and validates under both schedules;
 * exact lists for a small case; memory bounds; ascending backward order;
 * hand-broken schedules are rejected with their exact message; and the
 * simulator reproduces step times derived by hand (the GPipe textbook
 * formula, two branches running side by side) and stays fast at 30 stages
 * and 1024 micro-batches. */
#include "coordinator/schedule.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/progress.h"
#include "tests/harness.h"

/* A plan with image layers 10 (stem, 8 blocks, projection), text layers 6
 * (embedding, 4 layers, norm), and the given splits; the loss per
 * micro-batch (model.fusion.itc_scope: microbatch): test_batch_loss covers
 * the default. */
static void make_plan(mmp_plan *p, mmp_schedule kind, int m, int n_is, const int *is, int n_ts,
                      const int *ts)
{
    mmp_plan_defaults(p);
    p->model.image.n_stages = 4;
    for (int i = 0; i < 4; i++) {
        p->model.image.blocks[i] = 2;
    }
    p->model.text.layers = 4;
    p->train.batch = 64;
    p->train.microbatches = m;
    p->train.schedule = kind;
    p->model.fusion.itc_scope = MMP_ITC_MICROBATCH;
    p->stages.image.n_split = n_is;
    for (int i = 0; i < n_is; i++) {
        p->stages.image.split[i] = is[i];
    }
    p->stages.text.n_split = n_ts;
    for (int i = 0; i < n_ts; i++) {
        p->stages.text.split[i] = ts[i];
    }
}

/* Stage st's list in compact form; only FWD/BWD when fb_only. */
static const char *listing(const mmp_sched *s, int st, int fb_only)
{
    static char buf[8192];
    size_t len = 0;
    buf[0] = 0;
    for (int pc = 0; pc < s->stages[st].n_prog; pc++) {
        const mmp_instr *in = &s->stages[st].prog[pc];
        if (fb_only && in->op != MMP_OP_FWD && in->op != MMP_OP_BWD) {
            continue;
        }
        char tok[32];
        mmp_instr_compact(s, st, in, tok, sizeof tok);
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? " " : "", tok);
    }
    return buf;
}

static void check_list(const mmp_sched *s, const char *stage, int fb_only, const char *want)
{
    int st = mmp_sched_find(s, stage);
    CHECK(st >= 0);
    if (st < 0) {
        return;
    }
    const char *got = listing(s, st, fb_only);
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "  %s:\n    got:  %s\n    want: %s\n", stage, got, want);
    }
    CHECK(strcmp(got, want) == 0);
}

/* A deep copy whose lists tests may break. */
static void clone(mmp_sched *dst, const mmp_sched *src)
{
    *dst = *src;
    dst->edges = malloc(((size_t)src->n_edges + 1) * sizeof *dst->edges);
    memcpy(dst->edges, src->edges, (size_t)src->n_edges * sizeof *dst->edges);
    for (int i = 0; i < src->n_stages; i++) {
        size_t bytes = (size_t)src->stages[i].n_prog * sizeof(mmp_instr);
        dst->stages[i].prog = malloc(bytes);
        memcpy(dst->stages[i].prog, src->stages[i].prog, bytes);
        if (src->stages[i].owns) {
            dst->stages[i].owns = malloc((size_t)src->microbatches);
            memcpy(dst->stages[i].owns, src->stages[i].owns, (size_t)src->microbatches);
        }
    }
}

/* Index of stage st's instruction (op, mb, edge); -1 if absent. */
static int find_instr(const mmp_sched *s, int st, mmp_op op, int mb, int edge)
{
    for (int pc = 0; pc < s->stages[st].n_prog; pc++) {
        const mmp_instr *in = &s->stages[st].prog[pc];
        if (in->op == op && in->mb == mb && in->edge == edge) {
            return pc;
        }
    }
    return -1;
}

static void remove_instr(mmp_sched *s, int st, int pc)
{
    mmp_sched_stage *g = &s->stages[st];
    memmove(&g->prog[pc], &g->prog[pc + 1], (size_t)(g->n_prog - pc - 1) * sizeof *g->prog);
    g->n_prog--;
}

static void expect_reject(const mmp_sched *s, const char *want)
{
    mmp_err e = mmp_sched_validate(s);
    CHECK(e == MMP_ERR_INTERNAL);
    if (strcmp(mmp_last_error(), want) != 0) {
        fprintf(stderr, "  got:  %s\n  want: %s\n", mmp_last_error(), want);
    }
    CHECK(strcmp(mmp_last_error(), want) == 0);
}

/* expect_reject, then frees s. */
static void reject_and_free(mmp_sched *s, const char *want)
{
    expect_reject(s, want);
    mmp_sched_fini(s);
}

/* A hand-written stage of one sub-stage, one micro-batch in flight. */
static mmp_sched_stage hand_stage(const char *name, mmp_stage_kind kind, int depth, mmp_instr *prog,
                                  int n_prog)
{
    mmp_sched_stage st = {.kind = kind,
                          .n_sub = 1,
                          .depth = depth,
                          .inflight_bound = 1,
                          .prog = prog,
                          .n_prog = n_prog};
    snprintf(st.name, sizeof st.name, "%s", name);
    return st;
}

/* ---- every shape compiles ----------------------------------------------------------- */

static void check_shape(const mmp_sched *s, mmp_schedule kind, int m, int n_image, int n_text)
{
    CHECK(s->n_stages == n_image + n_text + 1);
    CHECK(s->n_edges == 2 * (n_image + n_text));
    CHECK(s->microbatches == m && s->kind == kind);
    for (int st = 0; st < s->n_stages; st++) {
        const mmp_sched_stage *g = &s->stages[st];
        int fusion = g->kind == MMP_KIND_FUSION;
        CHECK(fusion == (st == s->n_stages - 1));
        CHECK(g->depth == (fusion ? 1 : g->n_sub - g->sub + 1));
        int want_bound = kind == MMP_SCHED_GPIPE ? m : (g->depth < m ? g->depth : m);
        CHECK(g->inflight_bound == want_bound);
        CHECK(g->max_inflight <= g->inflight_bound);
        if (fusion) {
            CHECK(g->max_inflight == 1);
        } else {
            CHECK(g->max_inflight == (kind == MMP_SCHED_GPIPE ? m : want_bound));
        }
        /* Backward in ascending order: bit-identical to the single process. */
        int next_b = 0;
        for (int pc = 0; pc < g->n_prog; pc++) {
            if (g->prog[pc].op == MMP_OP_BWD) {
                CHECK(g->prog[pc].mb == next_b);
                next_b++;
            }
        }
        CHECK(next_b == m);
        CHECK(g->prog[g->n_prog - 2].op == MMP_OP_GRAD_NORM);
        CHECK(g->prog[g->n_prog - 1].op == MMP_OP_OPT_STEP);
    }
    for (int e = 0; e < s->n_edges; e++) {
        const mmp_sched_edge *E = &s->edges[e];
        int producer = E->grad ? E->to : E->from;
        CHECK(E->slots == s->stages[producer].inflight_bound);
    }
}

static void test_all_shapes(void)
{
    static const int ms[] = {1, 2, 3, 4, 8, 13};
    static const int one[] = {4}, two[] = {3, 7}, text[] = {2};
    for (int k = 0; k < 2; k++) {
        mmp_schedule kind = k ? MMP_SCHED_1F1B : MMP_SCHED_GPIPE;
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            mmp_plan p;
            mmp_sched s;
            make_plan(&p, kind, ms[i], 0, NULL, 0, NULL);
            CHECK_OK(mmp_sched_compile(&s, &p));
            check_shape(&s, kind, ms[i], 1, 1);
            mmp_sched_fini(&s);

            make_plan(&p, kind, ms[i], 1, one, 0, NULL);
            CHECK_OK(mmp_sched_compile(&s, &p));
            check_shape(&s, kind, ms[i], 2, 1);
            CHECK(s.stages[0].layer_first == 0 && s.stages[0].layer_last == 4);
            CHECK(s.stages[1].layer_first == 4 && s.stages[1].layer_last == 10);
            mmp_sched_fini(&s);

            make_plan(&p, kind, ms[i], 2, two, 1, text);
            CHECK_OK(mmp_sched_compile(&s, &p));
            check_shape(&s, kind, ms[i], 3, 2);
            CHECK(strcmp(s.stages[2].name, "image.2") == 0 && s.stages[2].layer_first == 7 &&
                  s.stages[2].layer_last == 10);
            CHECK(strcmp(s.stages[4].name, "text.1") == 0 && s.stages[4].layer_first == 2 &&
                  s.stages[4].layer_last == 6);
            CHECK(mmp_sched_find(&s, "fusion") == 5 && mmp_sched_find(&s, "image.3") == -1);
            CHECK_OK(mmp_sched_validate(&s));
            mmp_sched_fini(&s);
            mmp_sched_fini(&s); /* idempotent */
        }
    }
    mmp_sched_fini(NULL);
}

/* ---- exact lists --------------------------------------------------------------------- */

static void test_exact_lists(void)
{
    static const int one[] = {4};
    mmp_plan p;
    mmp_sched s;
    make_plan(&p, MMP_SCHED_1F1B, 4, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&s, &p));
    /* e0/e1 image.0 <-> image.1, e2/e3 image.1 <-> fusion, e4/e5 text.0 <-> fusion */
    CHECK(s.edges[0].from == 0 && s.edges[0].to == 1 && !s.edges[0].grad);
    CHECK(s.edges[3].from == 3 && s.edges[3].to == 1 && s.edges[3].grad);
    CHECK(s.edges[4].from == 2 && s.edges[4].to == 3 && !s.edges[4].grad);
    CHECK(s.edges[0].slots == 3 && s.edges[2].slots == 2 && s.edges[5].slots == 2);
    check_list(&s, "image.0", 1, "F0 F1 F2 B0 F3 B1 B2 B3");
    check_list(&s, "image.0", 0,
               "L0 F0 Sa0 L1 F1 Sa1 L2 F2 Sa2 Rg0 B0 L3 F3 Sa3 Rg1 B1 Rg2 B2 Rg3 B3 NORM OPT");
    check_list(&s, "image.1", 0,
               "Ra0 F0 Sa0 Ra1 F1 Sa1 Rg0 B0 Sg0 Ra2 F2 Sa2 Rg1 B1 Sg1 Ra3 F3 Sa3 Rg2 B2 Sg2 "
               "Rg3 B3 Sg3 NORM OPT");
    check_list(&s, "text.0", 1, "F0 F1 B0 F2 B1 F3 B2 B3");
    check_list(&s, "fusion", 0,
               "Ra0:e2 Ra0:e4 F0 B0 Sg0:e3 Sg0:e5 Ra1:e2 Ra1:e4 F1 B1 Sg1:e3 Sg1:e5 "
               "Ra2:e2 Ra2:e4 F2 B2 Sg2:e3 Sg2:e5 Ra3:e2 Ra3:e4 F3 B3 Sg3:e3 Sg3:e5 NORM OPT");
    CHECK(s.stages[0].max_inflight == 3 && s.stages[1].max_inflight == 2);
    mmp_sched_fini(&s);

    make_plan(&p, MMP_SCHED_GPIPE, 4, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&s, &p));
    check_list(&s, "image.0", 0,
               "L0 F0 Sa0 L1 F1 Sa1 L2 F2 Sa2 L3 F3 Sa3 Rg0 B0 Rg1 B1 Rg2 B2 Rg3 B3 NORM OPT");
    check_list(&s, "fusion", 1, "F0 B0 F1 B1 F2 B2 F3 B3");
    CHECK(s.stages[0].max_inflight == 4 && s.edges[0].slots == 4);
    mmp_sched_fini(&s);

    /* m below the depth: 1F1B degenerates to all F then all B. */
    make_plan(&p, MMP_SCHED_1F1B, 2, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&s, &p));
    check_list(&s, "image.0", 1, "F0 F1 B0 B1");
    CHECK(s.stages[0].inflight_bound == 2 && s.stages[0].max_inflight == 2);
    mmp_sched_fini(&s);

    char buf[64];
    mmp_instr in = {.op = MMP_OP_RECV_GRAD, .mb = 2, .edge = 3};
    CHECK(strcmp(mmp_instr_str(&in, buf, sizeof buf), "RECV_GRAD e3 mb2") == 0);
    CHECK(strcmp(mmp_op_name(MMP_OP_OPT_STEP), "OPT_STEP") == 0);
    CHECK(strcmp(mmp_op_name((mmp_op)42), "?") == 0);
}

/* ---- broken schedules ------------------------------------------------------------------- */

static void test_rejects(void)
{
    mmp_plan p;
    mmp_sched base, s;
    char want[512];
    /* image.0 (e0 act to fusion, e1 grad back), text.0 (e2, e3), fusion */
    make_plan(&p, MMP_SCHED_GPIPE, 4, 0, NULL, 0, NULL);
    CHECK_OK(mmp_sched_compile(&base, &p));

    /* replicas near INT_MAX (a placement read from a run's metrics.jsonl):
     * the process count bound must not overflow */
    const mmp_stage_cfg fusion = p.stages.fusion;
    p.stages.fusion.n_replicas = 1;
    p.stages.fusion.replicas[0] = INT_MAX;
    CHECK(mmp_sched_compile(&s, &p) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "more than the 1024 processes") != NULL);
    mmp_sched_fini(&s);
    p.stages.fusion = fusion;
    /* the bound itself: 1024 processes compile (1022 image replicas, text,
     * fusion), 1025 do not */
    const mmp_stage_cfg image = p.stages.image;
    p.train.microbatches = 64;
    p.stages.image.n_replicas = 1;
    p.stages.image.replicas[0] = 1022;
    CHECK_OK(mmp_sched_compile(&s, &p));
    CHECK(s.n_stages == 1024 && s.n_stages == MMP_SCHED_MAX_STAGES);
    CHECK(s.n_edges == 2 * (1022 + 1));
    mmp_sched_fini(&s);
    p.stages.image.replicas[0] = 1023;
    CHECK(mmp_sched_compile(&s, &p) == MMP_ERR_CONFIG);
    CHECK(strstr(mmp_last_error(), "the 1024 processes a schedule may have") != NULL);
    mmp_sched_fini(&s);
    p.stages.image.replicas[0] = 1;
    p.stages.fusion.replicas[0] = 1023;
    CHECK(mmp_sched_compile(&s, &p) == MMP_ERR_CONFIG);
    CHECK(strcmp(mmp_last_error(), "stages.fusion.replicas: 1023 replicas of fusion make more "
                                   "than the 1024 processes a schedule may have") == 0);
    mmp_sched_fini(&s);
    p.stages.fusion = fusion;
    p.stages.image = image;
    p.train.microbatches = 4;

    /* a missing send, a missing receive: the error names the other end's instr */
    static const struct {
        int st;
        mmp_op op;
        int mb, edge; /* the instr removed */
        int peer_st;
        mmp_op peer_op; /* its other end (same mb and edge), named by pc */
        const char *want;
    } missing[] = {
        {0, MMP_OP_SEND_ACT, 2, 0, 2, MMP_OP_RECV_ACT,
         "schedule gpipe: stage fusion instr %d (RECV_ACT e0 mb2): no matching send: image.0 "
         "never sends mb2 on e0"},
        {2, MMP_OP_RECV_ACT, 1, 2, 1, MMP_OP_SEND_ACT,
         "schedule gpipe: stage text.0 instr %d (SEND_ACT e2 mb1): no matching receive: "
         "fusion never receives mb1 on e2"},
    };
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        clone(&s, &base);
        remove_instr(&s, missing[i].st,
                     find_instr(&s, missing[i].st, missing[i].op, missing[i].mb, missing[i].edge));
        snprintf(
            want, sizeof want, missing[i].want,
            find_instr(&s, missing[i].peer_st, missing[i].peer_op, missing[i].mb, missing[i].edge));
        reject_and_free(&s, want);
    }

    /* micro-batches sent in another order than received */
    clone(&s, &base);
    int s1 = find_instr(&s, 0, MMP_OP_SEND_ACT, 1, 0),
        s2 = find_instr(&s, 0, MMP_OP_SEND_ACT, 2, 0);
    s.stages[0].prog[s1].mb = 2;
    s.stages[0].prog[s2].mb = 1;
    snprintf(want, sizeof want,
             "schedule gpipe: stage fusion instr %d (RECV_ACT e0 mb1): order differs on e0: "
             "receive #1 expects mb1 but send #1 from image.0 (instr %d) carries mb2",
             find_instr(&s, 2, MMP_OP_RECV_ACT, 1, 0), s1);
    reject_and_free(&s, want);

    /* B before F */
    clone(&s, &base);
    CHECK(s.stages[2].prog[2].op == MMP_OP_FWD && s.stages[2].prog[3].op == MMP_OP_BWD);
    s.stages[2].prog[2].op = MMP_OP_BWD;
    s.stages[2].prog[3].op = MMP_OP_FWD;
    reject_and_free(&s, "schedule gpipe: stage fusion instr 2 (BWD mb0): mb0's backward comes "
                        "before its forward (instr 3)");

    /* a send after the compute it must precede... */
    clone(&s, &base);
    mmp_instr *pg = s.stages[0].prog;
    CHECK(pg[0].op == MMP_OP_LOAD && pg[1].op == MMP_OP_FWD && pg[2].op == MMP_OP_SEND_ACT);
    pg[1] = (mmp_instr){MMP_OP_SEND_ACT, 0, 0};
    pg[2] = (mmp_instr){MMP_OP_FWD, 0, -1};
    reject_and_free(&s, "schedule gpipe: stage image.0 instr 1 (SEND_ACT e0 mb0): must come after "
                        "FWD mb0 (instr 2)");

    /* ...and an edge used the wrong way */
    clone(&s, &base);
    s.stages[0].prog[2].edge = 1;
    reject_and_free(&s, "schedule gpipe: stage image.0 instr 2 (SEND_ACT e1 mb0): e1 carries "
                        "gradients");

    /* too few slots: with one slot each way between image.0 and fusion,
     * image.0 cannot send mb3 until fusion's F2, and fusion cannot send mb1's
     * gradient until image.0's B0, which comes after all of its F. */
    clone(&s, &base);
    s.edges[0].slots = 1;
    s.edges[1].slots = 1;
    snprintf(want, sizeof want,
             "schedule gpipe: deadlock, a cycle of waits: stage image.0 instr %d (SEND_ACT e0 mb3) "
             "waits for a free slot: all 1 slots of e0 hold messages fusion has not released; "
             "stage fusion instr %d (SEND_GRAD e1 mb1) waits for a free slot: all 1 slots of e1 "
             "hold messages image.0 has not released",
             find_instr(&s, 0, MMP_OP_SEND_ACT, 3, 0), find_instr(&s, 2, MMP_OP_SEND_GRAD, 1, 1));
    expect_reject(&s, want);
    s.edges[0].slots = 2; /* fusion gets as far as mb2's F: enough */
    CHECK_OK(mmp_sched_validate(&s));
    mmp_sched_fini(&s);

    /* a received message holds its slot until the compute after the RECV
     * (zero-copy): fusion taking image mb1 before running F0 needs two */
    clone(&s, &base);
    s.edges[0].slots = 1;
    CHECK_OK(mmp_sched_validate(&s));
    mmp_sched_stage *fu = &s.stages[2];
    int r1 = find_instr(&s, 2, MMP_OP_RECV_ACT, 1, 0);
    remove_instr(&s, 2, r1);
    memmove(&fu->prog[3], &fu->prog[2], (size_t)(fu->n_prog - 2) * sizeof *fu->prog);
    fu->prog[2] = (mmp_instr){MMP_OP_RECV_ACT, 1, 0};
    fu->n_prog++;
    CHECK(strncmp(listing(&s, 2, 0), "Ra0:e0 Ra0:e2 Ra1:e0 F0 B0 Sg0:e1 Sg0:e3 Ra1:e2 F1", 50) ==
          0);
    snprintf(want, sizeof want,
             "schedule gpipe: deadlock, a cycle of waits: stage image.0 instr %d (SEND_ACT e0 mb1) "
             "waits for a free slot: all 1 slots of e0 hold messages fusion has not released; "
             "stage fusion instr 2 (RECV_ACT e0 mb1) waits for image.0 to send it",
             find_instr(&s, 0, MMP_OP_SEND_ACT, 1, 0));
    expect_reject(&s, want);
    s.edges[0].slots = 2;
    CHECK_OK(mmp_sched_validate(&s));
    mmp_sched_fini(&s);

    /* in-flight bound */
    clone(&s, &base);
    s.stages[0].inflight_bound = 2;
    reject_and_free(&s, "schedule gpipe: stage image.0 instr 7 (FWD mb2): 3 micro-batches in "
                        "flight, more than the bound 2");

    /* a list that does not end the step */
    clone(&s, &base);
    s.stages[1].n_prog--;
    reject_and_free(&s, "schedule gpipe: stage text.0: the list must end with GRAD_NORM, OPT_STEP");
    mmp_sched_fini(&base);

    /* two stages each waiting to receive from the other first */
    static mmp_instr a[] = {{MMP_OP_LOAD, 0, -1},     {MMP_OP_FWD, 0, -1},
                            {MMP_OP_RECV_GRAD, 0, 1}, {MMP_OP_BWD, 0, -1},
                            {MMP_OP_SEND_ACT, 0, 0},  {MMP_OP_GRAD_NORM, -1, -1},
                            {MMP_OP_OPT_STEP, -1, -1}};
    static mmp_instr f[] = {{MMP_OP_RECV_ACT, 0, 0},    {MMP_OP_FWD, 0, -1},
                            {MMP_OP_BWD, 0, -1},        {MMP_OP_SEND_GRAD, 0, 1},
                            {MMP_OP_GRAD_NORM, -1, -1}, {MMP_OP_OPT_STEP, -1, -1}};
    memset(&s, 0, sizeof s);
    s.kind = MMP_SCHED_1F1B;
    s.microbatches = 1;
    s.n_stages = 2;
    s.n_edges = 2;
    static mmp_sched_edge hand_edges[2]; /* never freed: s is not fini'd */
    s.edges = hand_edges;
    s.stages[0] = hand_stage("image.0", MMP_KIND_IMAGE, 2, a, 7);
    s.stages[1] = hand_stage("fusion", MMP_KIND_FUSION, 1, f, 6);
    s.edges[0] = (mmp_sched_edge){.from = 0, .to = 1, .grad = 0, .slots = 1};
    s.edges[1] = (mmp_sched_edge){.from = 1, .to = 0, .grad = 1, .slots = 1};
    expect_reject(&s, "schedule 1f1b: deadlock, a cycle of waits: stage image.0 instr 2 "
                      "(RECV_GRAD e1 mb0) waits for fusion to send it; stage fusion instr 0 "
                      "(RECV_ACT e0 mb0) waits for image.0 to send it");
    /* the same two stages in the right order run */
    a[2] = (mmp_instr){MMP_OP_SEND_ACT, 0, 0};
    a[3] = (mmp_instr){MMP_OP_RECV_GRAD, 0, 1};
    a[4] = (mmp_instr){MMP_OP_BWD, 0, -1};
    CHECK_OK(mmp_sched_validate(&s));

    /* graphs compile refuses */
    memset(&s, 0, sizeof s);
    s.n_stages = 1;
    snprintf(s.stages[0].name, sizeof s.stages[0].name, "image.0");
    s.stages[0].n_sub = 1;
    CHECK(mmp_sched_compile_stages(&s, MMP_SCHED_1F1B, 4) == MMP_ERR_CONFIG);
    CHECK(strcmp(mmp_last_error(), "schedule: no fusion stage") == 0);
    mmp_sched_fini(&s);
    static const int bad[] = {0};
    make_plan(&p, MMP_SCHED_1F1B, 4, 1, bad, 0, NULL);
    CHECK(mmp_sched_compile(&s, &p) == MMP_ERR_CONFIG);
    CHECK(strcmp(mmp_last_error(), "stages.image.split: sub-stage image.0 would hold no layers "
                                   "(range [0, 0) of the branch's 10)") == 0);
    mmp_sched_fini(&s);
}

/* ---- simulation ------------------------------------------------------------------------ */

/* A branch of n_image sub-stages (and n_text, 0 for none) feeding fusion. */
static mmp_err compile_graph(mmp_sched *s, mmp_schedule kind, int m, int n_image, int n_text)
{
    memset(s, 0, sizeof *s);
    for (int b = 0; b < 2; b++) {
        int n = b ? n_text : n_image;
        for (int k = 0; k < n; k++) {
            mmp_sched_stage *g = &s->stages[s->n_stages++];
            snprintf(g->name, sizeof g->name, "%s.%d", b ? "text" : "image", k);
            g->kind = b ? MMP_KIND_TEXT : MMP_KIND_IMAGE;
            g->sub = k;
            g->n_sub = n;
            g->layer_first = k;
            g->layer_last = k + 1;
        }
    }
    mmp_sched_stage *g = &s->stages[s->n_stages++];
    snprintf(g->name, sizeof g->name, "fusion");
    g->kind = MMP_KIND_FUSION;
    g->n_sub = 1;
    g->layer_last = 1;
    return mmp_sched_compile_stages(s, kind, m);
}

static int near(double a, double b)
{
    return fabs(a - b) <= 1e-9 * (1 + fabs(b));
}

/* F = 1 ms and B = 2 ms on every stage of s, free messages. */
static mmp_sim_costs uniform_costs(const mmp_sched *s)
{
    mmp_sim_costs c = {0};
    for (int st = 0; st < s->n_stages; st++) {
        c.fwd_ms[st] = 1;
        c.bwd_ms[st] = 2;
    }
    return c;
}

static void test_sim_textbook(void)
{
    /* p = 2: image.0 -> fusion, F = 1, B = 2 everywhere, free messages.
     * GPipe: (m + p - 1)(F + B), bubble (p - 1)/(m + p - 1); 1F1B the same. */
    static const int ms[] = {1, 2, 4, 8, 13};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            int m = ms[i], p = 2;
            mmp_sched s;
            CHECK_OK(compile_graph(&s, k ? MMP_SCHED_1F1B : MMP_SCHED_GPIPE, m, 1, 0));
            mmp_sim_costs c = uniform_costs(&s);
            mmp_sim_result r;
            CHECK_OK(mmp_sched_simulate(&s, &c, &r));
            double want = (m + p - 1) * 3.0;
            if (!near(r.step_ms, want)) {
                fprintf(stderr, "  %s m=%d: step %g ms, want %g\n", k ? "1f1b" : "gpipe", m,
                        r.step_ms, want);
            }
            CHECK(near(r.step_ms, want));
            CHECK(near(r.bubble, (p - 1.0) / (m + p - 1)));
            CHECK(near(r.busy_ms[0], 3.0 * m) && near(r.idle_ms[0], want - 3.0 * m));

            /* 0.25 ms per message. GPipe: fusion is the bottleneck and turns
             * every micro-batch around in F + B, so the step grows by the
             * first activation's and the last gradient's flight, 2 x 0.25.
             * 1F1B at m = 4 loses more: image.0 holds back F2 until B0, whose
             * gradient comes 4.5 ms in (F0 1, flight, fusion F+B 3, flight),
             * which starves fusion: F0 F1 [0,2] B0 [4.5,6.5] F2 B1 [7.5,9.5]
             * F3 B2 [11,13] B3 [14,16]. */
            c.send_ms = 0.25;
            CHECK_OK(mmp_sched_simulate(&s, &c, &r));
            if (k == 0) {
                CHECK(near(r.step_ms, want + 0.5));
            } else if (m == 4) {
                CHECK(near(r.step_ms, 16));
            }
            mmp_sched_fini(&s);
        }
    }
}

static void test_sim_branches(void)
{
    /* image F=4 B=8, text F=1 B=2, fusion F=1 B=1, m=8, one sub-stage each.
     * 1F1B, image.0 (depth 2): F0 [0,4] F1 [4,8]; fusion turns mb i around
     * 2 ms after image's F_i ends, before image.0 needs it (after F_{i+1}),
     * so image.0 never waits: B0 F2 B1 ... F7 B6 B7 back to back, ending at
     * 8 * 12 = 96. Text and fusion finish earlier (84, 82) and wait at the
     * barrier. Run one after the other the branches would take 96 + 24 + 16. */
    for (int k = 0; k < 2; k++) {
        mmp_sched s;
        CHECK_OK(compile_graph(&s, k ? MMP_SCHED_1F1B : MMP_SCHED_GPIPE, 8, 1, 1));
        mmp_sim_costs c = {0};
        c.fwd_ms[0] = 4, c.bwd_ms[0] = 8;
        c.fwd_ms[1] = 1, c.bwd_ms[1] = 2;
        c.fwd_ms[2] = 1, c.bwd_ms[2] = 1;
        mmp_sim_result r;
        CHECK_OK(mmp_sched_simulate(&s, &c, &r));
        CHECK(near(r.step_ms, 96));
        CHECK(near(r.busy_ms[0], 96) && near(r.busy_ms[1], 24) && near(r.busy_ms[2], 16));
        CHECK(near(r.idle_ms[1], 72) && near(r.idle_ms[2], 80));
        CHECK(near(r.bubble, (0 + 72 + 80) / (3 * 96.0)));

        /* 0.5 ms per message: every hand-off still lands before image.0
         * needs it (fusion's F7 starts at 80.5, its gradient is back at 83,
         * image.0's B7 starts at 88); the 3 ms step overhead follows the
         * barrier at 96 and counts as busy. */
        c.send_ms = 0.5;
        c.step_overhead_ms = 3;
        CHECK_OK(mmp_sched_simulate(&s, &c, &r));
        CHECK(near(r.step_ms, 99));
        CHECK(near(r.busy_ms[0], 99) && near(r.busy_ms[1], 27));

        c.bwd_ms[1] = -1;
        CHECK(mmp_sched_simulate(&s, &c, &r) == MMP_ERR_INVALID);
        c.bwd_ms[1] = NAN;
        CHECK(mmp_sched_simulate(&s, &c, &r) == MMP_ERR_INVALID);
        mmp_sched_fini(&s);
    }
}

static void test_sim_large(void)
{
    /* 15 image sub-stages, 14 text, fusion: 30 stages, 58 edges, m = 1024. */
    for (int k = 0; k < 2; k++) {
        mmp_schedule kind = k ? MMP_SCHED_1F1B : MMP_SCHED_GPIPE;
        double t0 = mmp_test_now_s();
        mmp_sched s;
        CHECK_OK(compile_graph(&s, kind, 1024, 15, 14));
        CHECK(s.n_stages == 30 && s.n_edges == 58);
        mmp_sim_costs c = uniform_costs(&s);
        mmp_sim_result r;
        CHECK_OK(mmp_sched_simulate(&s, &c, &r));
        double dt = mmp_test_now_s() - t0;
        printf("30 stages, m=1024, %s: compile + simulate %.3f s, step %.0f ms, bubble %.4f\n",
               mmp_schedule_name(kind), dt, r.step_ms, r.bubble);
        /* dt is printed, not judged: speed is a bench figure (the README's
         * planner row), and this test shares a loaded CI machine. */
        /* The image chain (15 + fusion = 16 deep) is the critical path:
         * (m + p - 1)(F + B) with p = 16. */
        CHECK(near(r.step_ms, (1024 + 16 - 1) * 3.0));
        CHECK(s.stages[0].max_inflight == (k ? 16 : 1024));
        mmp_sched_fini(&s);
    }
}

/* ---- replicas and routing ----------------------------------------------------------- */

static void test_route(void)
{
    int owner[12];
    double equal[3] = {1, 1, 1}, half[2] = {1, 0.5};
    mmp_sched_route(equal, 3, 7, owner);
    int want_rr[7] = {0, 1, 2, 0, 1, 2, 0};
    CHECK(memcmp(owner, want_rr, sizeof want_rr) == 0);
    mmp_sched_route(half, 2, 12, owner);
    int n1 = 0;
    for (int i = 0; i < 12; i++) {
        n1 += owner[i];
    }
    CHECK(n1 == 4); /* half as fast: a third of them */

    /* However slow a replica was measured, it keeps one micro-batch. */
    double crawl[3] = {1, 0.01, 1};
    mmp_sched_route(crawl, 3, 4, owner);
    int want_crawl[4] = {0, 2, 0, 1};
    CHECK(memcmp(owner, want_crawl, sizeof want_crawl) == 0);
    mmp_sched_route(crawl, 3, 2, owner); /* fewer micro-batches than replicas */
    CHECK(owner[0] == 0 && owner[1] == 1);
}

static void test_replicas(void)
{
    static const int is[1] = {5};
    for (int kind = 0; kind < 2; kind++) {
        for (int m = 1; m <= 9; m += 4) {
            mmp_plan p;
            make_plan(&p, (mmp_schedule)kind, m, 1, is, 0, NULL);
            p.stages.image.n_replicas = 2; /* image.0 x2, image.1 x3 */
            p.stages.image.replicas[0] = 2;
            p.stages.image.replicas[1] = 3;
            p.stages.text.n_replicas = 1;
            p.stages.text.replicas[0] = 2;
            p.stages.fusion.n_replicas = 1;
            p.stages.fusion.replicas[0] = 2;
            double speed[MMP_SCHED_MAX_STAGES];
            for (int i = 0; i < MMP_SCHED_MAX_STAGES; i++) {
                speed[i] = 1 + (i % 3 == 1); /* uneven: some replicas twice as fast */
            }
            for (int routed = 0; routed < 2; routed++) {
                mmp_sched s;
                mmp_err e = mmp_sched_compile_routed(&s, &p, routed ? speed : NULL);
                if (e != MMP_OK) {
                    fprintf(stderr, "  %s m=%d: %s\n", kind ? "1f1b" : "gpipe", m,
                            mmp_last_error());
                }
                CHECK_OK(e);
                CHECK(s.n_stages == 2 + 3 + 2 + 2);
                /* every replica pair of consecutive stages: 2x3 + 3x2 + 2x2 pairs, two edges each
                 */
                CHECK(s.n_edges == 2 * (6 + 6 + 4));
                CHECK(strcmp(s.stages[3].proc, "image.1/1") == 0 && s.stages[3].replica == 1);
                CHECK(mmp_sched_find(&s, "text.0/1") == 6 && mmp_sched_find(&s, "fusion") == 7);
                /* each micro-batch forwarded once per stage, by the replica it is routed to */
                for (int st = 0; st < s.n_stages; st += s.stages[st].n_replicas) {
                    for (int mb = 0; mb < m; mb++) {
                        int n = 0;
                        for (int r = 0; r < s.stages[st].n_replicas; r++) {
                            int f = find_instr(&s, st + r, MMP_OP_FWD, mb, -1) >= 0;
                            CHECK(f == s.stages[st + r].owns[mb]);
                            n += f;
                        }
                        CHECK(n == 1);
                    }
                }
                /* a broken routing is caught by the checker */
                if (m > 1) {
                    mmp_sched bad;
                    clone(&bad, &s);
                    bad.stages[7].owns[0] = !bad.stages[7].owns[0];
                    CHECK(mmp_sched_validate(&bad) == MMP_ERR_INTERNAL);
                    CHECK(strstr(mmp_last_error(), "is routed to") != NULL);
                    mmp_sched_fini(&bad);
                }
                mmp_sim_costs c = {0};
                for (int i = 0; i < s.n_stages; i++) {
                    c.fwd_ms[i] = 1;
                    c.bwd_ms[i] = 2;
                }
                mmp_sim_result r;
                CHECK_OK(mmp_sched_simulate(&s, &c, &r));
                mmp_sched_fini(&s);
            }
        }
    }
    /* two replicas halve the bottleneck stage's share of the step */
    mmp_plan p;
    make_plan(&p, MMP_SCHED_1F1B, 16, 0, NULL, 0, NULL);
    mmp_sched one, two;
    CHECK_OK(mmp_sched_compile(&one, &p));
    p.stages.image.replicas[0] = 2;
    CHECK_OK(mmp_sched_compile(&two, &p));
    mmp_sim_costs c1 = {0}, c2 = {0};
    c1.fwd_ms[0] = 4, c1.bwd_ms[0] = 8, c1.fwd_ms[1] = 1, c1.bwd_ms[1] = 2, c1.fwd_ms[2] = 1,
    c1.bwd_ms[2] = 2;
    c2.fwd_ms[0] = c2.fwd_ms[1] = 4, c2.bwd_ms[0] = c2.bwd_ms[1] = 8, c2.fwd_ms[2] = 1,
    c2.bwd_ms[2] = 2, c2.fwd_ms[3] = 1, c2.bwd_ms[3] = 2;
    mmp_sim_result r1, r2;
    CHECK_OK(mmp_sched_simulate(&one, &c1, &r1));
    CHECK_OK(mmp_sched_simulate(&two, &c2, &r2));
    CHECK(r2.step_ms < 0.6 * r1.step_ms);
    mmp_sched_fini(&one);
    mmp_sched_fini(&two);
}

/* ---- batch-wide loss (model.fusion.itc_scope: batch) ----------------------------- */

static void test_batch_loss(void)
{
    static const int one[] = {4};
    mmp_plan p;
    mmp_sched s, mbs;
    /* the default scope */
    make_plan(&p, MMP_SCHED_1F1B, 4, 1, one, 0, NULL);
    p.model.fusion.itc_scope = MMP_ITC_BATCH;
    mmp_plan q;
    mmp_plan_defaults(&q);
    CHECK(q.model.fusion.itc_scope == MMP_ITC_BATCH);
    CHECK_OK(mmp_sched_compile(&s, &p));
    CHECK(s.batch_loss == 1);
    /* every stage warms up with all m forwards: 1F1B's branch order
     * F0 F1 B0 ... would wait for B0's gradient while fusion waits for F2 */
    check_list(&s, "image.0", 1, "F0 F1 F2 F3 B0 B1 B2 B3");
    check_list(&s, "image.1", 1, "F0 F1 F2 F3 B0 B1 B2 B3");
    check_list(&s, "text.0", 1, "F0 F1 F2 F3 B0 B1 B2 B3");
    check_list(&s, "fusion", 0,
               "Ra0:e2 Ra0:e4 F0 Ra1:e2 Ra1:e4 F1 Ra2:e2 Ra2:e4 F2 Ra3:e2 Ra3:e4 F3 B0 Sg0:e3 "
               "Sg0:e5 B1 Sg1:e3 Sg1:e5 B2 Sg2:e3 Sg2:e5 B3 Sg3:e3 Sg3:e5 NORM OPT");
    for (int st = 0; st < s.n_stages; st++) {
        CHECK(s.stages[st].inflight_bound == 4 && s.stages[st].max_inflight == 4);
    }
    for (int e = 0; e < s.n_edges; e++) {
        CHECK(s.edges[e].slots == 4);
    }

    /* the checker: a fusion list with a backward before its last forward */
    make_plan(&p, MMP_SCHED_1F1B, 4, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&mbs, &p));
    mmp_sched t;
    clone(&t, &mbs);
    t.batch_loss = 1;
    char want[512];
    snprintf(want, sizeof want,
             "schedule 1f1b: stage fusion instr %d (BWD mb0): the batch-wide loss "
             "(model.fusion.itc_scope: batch) needs the step's last forward (instr %d) before any "
             "backward",
             find_instr(&t, 3, MMP_OP_BWD, 0, -1), find_instr(&t, 3, MMP_OP_FWD, 3, -1));
    expect_reject(&t, want);
    mmp_sched_fini(&t);

    /* the trap: fusion right, a branch (image.0 -> fusion) in 1F1B order
     * F0 F1 B0 ... deadlocks */
    mmp_sched s0, m0;
    make_plan(&p, MMP_SCHED_1F1B, 4, 0, NULL, 0, NULL);
    CHECK_OK(mmp_sched_compile(&m0, &p));
    p.model.fusion.itc_scope = MMP_ITC_BATCH;
    CHECK_OK(mmp_sched_compile(&s0, &p));
    check_list(&m0, "image.0", 1, "F0 F1 B0 F2 B1 F3 B2 B3");
    clone(&t, &s0);
    int img = mmp_sched_find(&t, "image.0");
    free(t.stages[img].prog);
    size_t bytes = (size_t)m0.stages[img].n_prog * sizeof(mmp_instr);
    t.stages[img].prog = malloc(bytes);
    memcpy(t.stages[img].prog, m0.stages[img].prog, bytes);
    t.stages[img].n_prog = m0.stages[img].n_prog;
    CHECK(mmp_sched_validate(&t) == MMP_ERR_INTERNAL);
    const char *got = mmp_last_error();
    if (!strstr(got, "deadlock, a cycle of waits")) {
        fprintf(stderr, "  got: %s\n", got);
    }
    CHECK(strstr(got, "deadlock, a cycle of waits") != NULL);
    CHECK(strstr(got, "stage image.0 instr 6 (RECV_GRAD e1 mb0) waits for fusion to send it") !=
          NULL);
    CHECK(strstr(got, "stage fusion instr 6 (RECV_ACT e0 mb2) waits for image.0 to send it") !=
          NULL);
    mmp_sched_fini(&t);
    /* the same lists are fine when the loss is per micro-batch */
    clone(&t, &s0);
    t.batch_loss = 0;
    CHECK_OK(mmp_sched_validate(&t));
    mmp_sched_fini(&t);

    /* GPipe and 1F1B give the same lists; the simulator holds fusion's
     * first backward until its last forward: image F 4 B 8, text 1 / 2,
     * fusion F 1 B 1, m = 4, one image stage. */
    make_plan(&p, MMP_SCHED_GPIPE, 4, 0, NULL, 0, NULL);
    p.model.fusion.itc_scope = MMP_ITC_BATCH;
    mmp_sched g, b1;
    CHECK_OK(mmp_sched_compile(&g, &p));
    p.train.schedule = MMP_SCHED_1F1B;
    CHECK_OK(mmp_sched_compile(&b1, &p));
    for (int st = 0; st < g.n_stages; st++) {
        CHECK(strcmp(listing(&g, st, 0), listing(&b1, st, 0)) == 0);
    }
    mmp_sim_costs c = {0};
    c.fwd_ms[0] = 4, c.bwd_ms[0] = 8, c.fwd_ms[1] = 1, c.bwd_ms[1] = 2, c.fwd_ms[2] = 1;
    c.bwd_ms[2] = 1;
    mmp_sim_result r;
    CHECK_OK(mmp_sched_simulate(&b1, &c, &r));
    /* image F0..F3 end at 16, fusion F3 at 17, B0..B3 to 21; image B0 starts
     * at 18 (fusion's B0 ends at 18) and B0..B3 take 32: 50 */
    if (!near(r.step_ms, 50)) {
        fprintf(stderr, "  batch loss: step %g ms, want 50\n", r.step_ms);
    }
    CHECK(near(r.step_ms, 50));
    /* per micro-batch the same costs pipeline better (1F1B, image depth 2) */
    p.model.fusion.itc_scope = MMP_ITC_MICROBATCH;
    mmp_sched m1;
    CHECK_OK(mmp_sched_compile(&m1, &p));
    mmp_sim_result rm;
    CHECK_OK(mmp_sched_simulate(&m1, &c, &rm));
    CHECK(rm.step_ms < r.step_ms);

    /* replicated fusion: each replica's backwards wait for the other's
     * forwards too (the gather of the step's features) */
    p.model.fusion.itc_scope = MMP_ITC_BATCH;
    p.stages.fusion.replicas[0] = 2;
    mmp_sched fr;
    CHECK_OK(mmp_sched_compile(&fr, &p));
    int f0 = mmp_sched_find(&fr, "fusion");
    CHECK(fr.stages[f0].n_replicas == 2);
    mmp_sim_costs cf = {0};
    cf.fwd_ms[0] = 4, cf.bwd_ms[0] = 8, cf.fwd_ms[1] = 1, cf.bwd_ms[1] = 2;
    cf.fwd_ms[f0] = cf.fwd_ms[f0 + 1] = 1, cf.bwd_ms[f0] = cf.bwd_ms[f0 + 1] = 1;
    CHECK_OK(mmp_sched_simulate(&fr, &cf, &r));
    /* fusion/0 owns mb 0 and 2, fusion/1 mb 1 and 3: fusion/0's B0 starts
     * only after fusion/1's F3 (image F3 ends at 16, fusion F3 at 17) */
    CHECK(r.step_ms >= 17 + 1 + 8 * 4 - 1e-9);
    /* and image.0 in the order F0 F1 F2 B0 F3 ... deadlocks through the
     * gather: fusion/0 (mb 0, 2) holds its B0 until fusion/1 has forwarded
     * mb3, which image.0 sends only after B0 */
    clone(&t, &fr);
    img = mmp_sched_find(&t, "image.0");
    int l3 = find_instr(&t, img, MMP_OP_LOAD, 3, -1), b0 = find_instr(&t, img, MMP_OP_BWD, 0, -1);
    mmp_instr moved[3];
    memcpy(moved, &t.stages[img].prog[l3], sizeof moved); /* L3 F3 Sa3 */
    memmove(&t.stages[img].prog[l3], &t.stages[img].prog[l3 + 3],
            (size_t)(b0 - l3 - 2) * sizeof(mmp_instr));
    memcpy(&t.stages[img].prog[b0 - 2], moved, sizeof moved);
    check_list(&t, "image.0", 1, "F0 F1 F2 B0 F3 B1 B2 B3");
    CHECK(mmp_sched_validate(&t) == MMP_ERR_INTERNAL);
    got = mmp_last_error();
    if (!strstr(got, "fusion/1 has run 1 of its 2 FWDs")) {
        fprintf(stderr, "  got: %s\n", got);
    }
    CHECK(strstr(got, "(BWD mb0) waits for the step's last forward (model.fusion.itc_scope: "
                      "batch): fusion/1 has run 1 of its 2 FWDs") != NULL);
    mmp_sched_fini(&t);
    mmp_sched_fini(&m0);
    mmp_sched_fini(&fr);
    mmp_sched_fini(&m1);
    mmp_sched_fini(&g);
    mmp_sched_fini(&b1);
    mmp_sched_fini(&mbs);
    mmp_sched_fini(&s);
    mmp_sched_fini(&s0);
    mmp_sched_fini(&m0);
}

/* ---- zero bubble (zb-h1) ------------------------------------------------------------- */

/* Swaps instructions a and b of stage st. */
static void swap_instr(mmp_sched *s, int st, int a, int b)
{
    mmp_instr t = s->stages[st].prog[a];
    s->stages[st].prog[a] = s->stages[st].prog[b];
    s->stages[st].prog[b] = t;
}

/* A copy of s with stage st's (a_op, a_mb) and (b_op, b_mb) swapped must be
 * rejected with fmt, given where the swap put the first, then the second. */
static void reject_swapped(const mmp_sched *s, int st, mmp_op a_op, int a_mb, mmp_op b_op, int b_mb,
                           const char *fmt) __attribute__((format(printf, 7, 0)));
static void reject_swapped(const mmp_sched *s, int st, mmp_op a_op, int a_mb, mmp_op b_op, int b_mb,
                           const char *fmt)
{
    mmp_sched t;
    clone(&t, s);
    int a = find_instr(&t, st, a_op, a_mb, -1);
    int b = find_instr(&t, st, b_op, b_mb, -1);
    swap_instr(&t, st, a, b);
    char want[512];
    snprintf(want, sizeof want, fmt, b, a);
    reject_and_free(&t, want);
}

static void test_zb_h1(void)
{
    static const int one[] = {4}, two[] = {3, 7}, text[] = {2};
    mmp_plan p;
    mmp_sched s, b1;
    /* image.0 -> image.1 -> fusion <- text.0, m = 4, the loss per micro-batch:
     * 1F1B's F and B order (B split: Bi), image.0 (1F1B's peak, 3) defers no
     * W, image.1, text.0 (bound 2) one, fusion (bound 1) two: each stage
     * holds at most 3 micro-batches from F to W, 1F1B's peak. */
    make_plan(&p, MMP_SCHED_ZB_H1, 4, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&s, &p));
    check_list(
        &s, "image.0", 0,
        "L0 F0 Sa0 L1 F1 Sa1 L2 F2 Sa2 Rg0 Bi0 W0 L3 F3 Sa3 Rg1 Bi1 W1 Rg2 Bi2 W2 Rg3 Bi3 W3 "
        "NORM OPT");
    check_list(&s, "image.1", 0,
               "Ra0 F0 Sa0 Ra1 F1 Sa1 Rg0 Bi0 Sg0 Ra2 F2 Sa2 Rg1 Bi1 Sg1 W0 Ra3 F3 Sa3 Rg2 Bi2 Sg2 "
               "W1 Rg3 Bi3 Sg3 W2 W3 NORM OPT");
    check_list(
        &s, "text.0", 0,
        "L0 F0 Sa0 L1 F1 Sa1 Rg0 Bi0 L2 F2 Sa2 Rg1 Bi1 W0 L3 F3 Sa3 Rg2 Bi2 W1 Rg3 Bi3 W2 W3 "
        "NORM OPT");
    check_list(
        &s, "fusion", 0,
        "Ra0:e2 Ra0:e4 F0 Bi0 Sg0:e3 Sg0:e5 Ra1:e2 Ra1:e4 F1 Bi1 Sg1:e3 Sg1:e5 Ra2:e2 "
        "Ra2:e4 F2 Bi2 Sg2:e3 Sg2:e5 W0 Ra3:e2 Ra3:e4 F3 Bi3 Sg3:e3 Sg3:e5 W1 W2 W3 NORM OPT");
    for (int st = 0; st < s.n_stages; st++) {
        CHECK(s.stages[st].inflight_bound == 3 && s.stages[st].max_inflight == 3);
        CHECK(s.stages[st].defer == 3 - (st == 0 ? 3 : st == 3 ? 1 : 2));
    }
    /* the same channels (slots) as 1F1B's */
    make_plan(&p, MMP_SCHED_1F1B, 4, 1, one, 0, NULL);
    CHECK_OK(mmp_sched_compile(&b1, &p));
    CHECK(b1.n_edges == s.n_edges);
    for (int e = 0; e < s.n_edges; e++) {
        CHECK(b1.edges[e].slots == s.edges[e].slots);
    }
    mmp_sched_fini(&b1);
    char buf[64];
    mmp_instr in = {.op = MMP_OP_BWD_WEIGHT, .mb = 2, .edge = -1};
    CHECK(strcmp(mmp_instr_str(&in, buf, sizeof buf), "BWD_WEIGHT mb2") == 0);

    /* the checker: W before its B */
    char want[512];
    mmp_sched t;
    int st = mmp_sched_find(&s, "image.1");
    reject_swapped(&s, st, MMP_OP_BWD_WEIGHT, 0, MMP_OP_BWD_INPUT, 0,
                   "schedule zb-h1: stage image.1 instr %d (BWD_WEIGHT mb0): mb0's weight pass "
                   "comes before its BWD_INPUT (instr %d)");
    /* a W missing */
    clone(&t, &s);
    remove_instr(&t, st, find_instr(&t, st, MMP_OP_BWD_WEIGHT, 3, -1));
    snprintf(want, sizeof want,
             "schedule zb-h1: stage image.1 instr %d (BWD_INPUT mb3): mb3 has no BWD_WEIGHT "
             "before GRAD_NORM",
             find_instr(&t, st, MMP_OP_BWD_INPUT, 3, -1));
    reject_and_free(&t, want);
    /* W's out of micro-batch order (the gradient sums' order) */
    reject_swapped(&s, st, MMP_OP_BWD_WEIGHT, 2, MMP_OP_BWD_WEIGHT, 3,
                   "schedule zb-h1: stage image.1 instr %d (BWD_WEIGHT mb2): weight passes must "
                   "run in ascending micro-batch order (the order the gradient sums add them in), "
                   "but mb3's came first (instr %d)");
    /* a W after a fused BWD */
    clone(&t, &s);
    int w0 = find_instr(&t, st, MMP_OP_BWD_WEIGHT, 0, -1);
    t.stages[st].prog[find_instr(&t, st, MMP_OP_BWD_INPUT, 0, -1)].op = MMP_OP_BWD;
    snprintf(want, sizeof want,
             "schedule zb-h1: stage image.1 instr %d (BWD_WEIGHT mb0): mb0 has no BWD_INPUT to "
             "take the weight pass of",
             w0);
    reject_and_free(&t, want);
    /* W0 deferred past F3 holds 4 (the W's stay ascending) */
    clone(&t, &s);
    int w = find_instr(&t, 0, MMP_OP_BWD_WEIGHT, 0, -1);
    mmp_instr keep = t.stages[0].prog[w];
    remove_instr(&t, 0, w);
    int sa3 = find_instr(&t, 0, MMP_OP_SEND_ACT, 3, 0) + 1;
    memmove(&t.stages[0].prog[sa3 + 1], &t.stages[0].prog[sa3],
            (size_t)(t.stages[0].n_prog - sa3) * sizeof *t.stages[0].prog);
    t.stages[0].prog[sa3] = keep;
    t.stages[0].n_prog++;
    snprintf(want, sizeof want,
             "schedule zb-h1: stage image.0 instr %d (FWD mb3): 4 micro-batches in flight, more "
             "than the bound 3",
             find_instr(&t, 0, MMP_OP_FWD, 3, -1));
    expect_reject(&t, want);
    /* only the bound broke */
    t.stages[0].inflight_bound = 4;
    CHECK_OK(mmp_sched_validate(&t));
    mmp_sched_fini(&t);
    /* a split backward in a 1f1b schedule */
    clone(&t, &s);
    t.kind = MMP_SCHED_1F1B;
    snprintf(want, sizeof want,
             "schedule 1f1b: stage image.0 instr %d (BWD_INPUT mb0): only zb-h1 splits the "
             "backward (1f1b runs BWD)",
             find_instr(&t, 0, MMP_OP_BWD_INPUT, 0, -1));
    reject_and_free(&t, want);
    mmp_sched_fini(&s);

    /* Every shape compiles and holds at most 1F1B's peak on every stage. */
    static const int ms[] = {1, 2, 3, 4, 8, 13};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        make_plan(&p, MMP_SCHED_ZB_H1, ms[i], 2, two, 1, text);
        CHECK_OK(mmp_sched_compile(&s, &p));
        make_plan(&p, MMP_SCHED_1F1B, ms[i], 2, two, 1, text);
        CHECK_OK(mmp_sched_compile(&b1, &p));
        int peak = 0;
        for (int k = 0; k < b1.n_stages; k++) {
            peak = b1.stages[k].max_inflight > peak ? b1.stages[k].max_inflight : peak;
        }
        for (int k = 0; k < s.n_stages; k++) {
            CHECK(s.stages[k].max_inflight <= peak);
        }
        mmp_sched_fini(&b1);
        mmp_sched_fini(&s);
    }

    /* Simulated, p = 5 (image.0 .. image.3, fusion), m = 8, F = 1, B + W = 2
     * (W half): 1F1B (m + p - 1)(F + B + W) = 36; zb-h1 m(F + B + W) +
     * (p - 1)(F + B - W) = 28, its idle a third of 1F1B's (20 vs 60 ms). */
    mmp_sim_result r[3];
    for (int k = 1; k <= 2; k++) {
        CHECK_OK(compile_graph(&s, (mmp_schedule)k, 8, 4, 0));
        mmp_sim_costs c = {0};
        for (int j = 0; j < s.n_stages; j++) {
            c.fwd_ms[j] = 1;
            c.bwd_ms[j] = 2;
        }
        CHECK_OK(mmp_sched_simulate(&s, &c, &r[k]));
        if (k == 2) {
            /* W's share given: 0.5 of 2 ms is the default; W = 0 makes B
             * the whole backward and W free: m(F + B) + (p - 1)(F + B) */
            for (int j = 0; j < s.n_stages; j++) {
                c.wgt_ms[j] = 1;
            }
            CHECK_OK(mmp_sched_simulate(&s, &c, &r[0]));
            CHECK(near(r[0].step_ms, r[2].step_ms));
            c.wgt_ms[0] = -1;
            CHECK(mmp_sched_simulate(&s, &c, &r[0]) == MMP_ERR_INVALID);
        }
        mmp_sched_fini(&s);
    }
    CHECK(near(r[1].step_ms, 36) && near(r[2].step_ms, 28));
    CHECK(near(r[1].bubble, 60.0 / (5 * 36)) && near(r[2].bubble, 20.0 / (5 * 28)));

    /* Under the batch-wide loss: all m forwards first everywhere (bound m),
     * a branch's W right after its B (defer 0: the W's still run while it
     * waits for its next gradient); the fusion splits too and defers every
     * W to the end (its B's send all the gradients first, the W's fill the
     * drain). */
    make_plan(&p, MMP_SCHED_ZB_H1, 4, 1, one, 0, NULL);
    p.model.fusion.itc_scope = MMP_ITC_BATCH;
    CHECK_OK(mmp_sched_compile(&s, &p));
    check_list(&s, "image.1", 0,
               "Ra0 F0 Sa0 Ra1 F1 Sa1 Ra2 F2 Sa2 Ra3 F3 Sa3 Rg0 Bi0 Sg0 W0 Rg1 Bi1 Sg1 W1 Rg2 Bi2 "
               "Sg2 W2 Rg3 Bi3 Sg3 W3 NORM OPT");
    check_list(&s, "fusion", 0,
               "Ra0:e2 Ra0:e4 F0 Ra1:e2 Ra1:e4 F1 Ra2:e2 Ra2:e4 F2 Ra3:e2 Ra3:e4 F3 Bi0 Sg0:e3 "
               "Sg0:e5 Bi1 Sg1:e3 Sg1:e5 Bi2 Sg2:e3 Sg2:e5 Bi3 Sg3:e3 Sg3:e5 W0 W1 W2 W3 NORM OPT");
    st = mmp_sched_find(&s, "fusion");
    CHECK(s.stages[st].defer == 4 && s.stages[st].inflight_bound == 4 &&
          s.stages[st].max_inflight == 4);
    /* the checker holds the fusion to the same rules: W before its B, */
    reject_swapped(&s, st, MMP_OP_BWD_WEIGHT, 0, MMP_OP_BWD_INPUT, 0,
                   "schedule zb-h1: stage fusion instr %d (BWD_WEIGHT mb0): mb0's weight pass "
                   "comes before its BWD_INPUT (instr %d)");
    /* W's out of micro-batch order, */
    reject_swapped(&s, st, MMP_OP_BWD_WEIGHT, 1, MMP_OP_BWD_WEIGHT, 2,
                   "schedule zb-h1: stage fusion instr %d (BWD_WEIGHT mb1): weight passes must "
                   "run in ascending micro-batch order (the order the gradient sums add them in), "
                   "but mb2's came first (instr %d)");
    /* a W missing, */
    clone(&t, &s);
    remove_instr(&t, st, find_instr(&t, st, MMP_OP_BWD_WEIGHT, 2, -1));
    snprintf(want, sizeof want,
             "schedule zb-h1: stage fusion instr %d (BWD_INPUT mb2): mb2 has no BWD_WEIGHT "
             "before GRAD_NORM",
             find_instr(&t, st, MMP_OP_BWD_INPUT, 2, -1));
    reject_and_free(&t, want);
    /* a B before the step's last forward (the batch-wide loss needs them all) */
    reject_swapped(&s, st, MMP_OP_BWD_INPUT, 0, MMP_OP_FWD, 3,
                   "schedule zb-h1: stage fusion instr %d (BWD_INPUT mb0): the batch-wide loss "
                   "(model.fusion.itc_scope: batch) needs the step's last forward (instr %d) "
                   "before any backward");
    /* ... and accepts the fused BWD's (what the lists were before) and each W
     * right after its B (the worker runs the batch's at the first W) */
    clone(&t, &s);
    for (int pc = 0, out = 0; pc <= t.stages[st].n_prog; pc++) {
        mmp_instr *in = &t.stages[st].prog[pc < t.stages[st].n_prog ? pc : 0];
        if (pc == t.stages[st].n_prog) {
            t.stages[st].n_prog = out;
            break;
        }
        if (in->op == MMP_OP_BWD_WEIGHT) {
            continue;
        }
        if (in->op == MMP_OP_BWD_INPUT) {
            in->op = MMP_OP_BWD;
        }
        t.stages[st].prog[out++] = *in;
    }
    check_list(&t, "fusion", 1, "F0 F1 F2 F3 B0 B1 B2 B3");
    CHECK_OK(mmp_sched_validate(&t));
    mmp_sched_fini(&t);
    clone(&t, &s);
    for (int mb = 0; mb < 3; mb++) {
        int wpc = find_instr(&t, st, MMP_OP_BWD_WEIGHT, mb, -1);
        int to = find_instr(&t, st, MMP_OP_SEND_GRAD, mb, 5) + 1;
        mmp_instr wi = t.stages[st].prog[wpc];
        memmove(&t.stages[st].prog[to + 1], &t.stages[st].prog[to], (size_t)(wpc - to) * sizeof wi);
        t.stages[st].prog[to] = wi;
    }
    check_list(&t, "fusion", 0,
               "Ra0:e2 Ra0:e4 F0 Ra1:e2 Ra1:e4 F1 Ra2:e2 Ra2:e4 F2 Ra3:e2 Ra3:e4 F3 Bi0 Sg0:e3 "
               "Sg0:e5 W0 Bi1 Sg1:e3 Sg1:e5 W1 Bi2 Sg2:e3 Sg2:e5 W2 Bi3 Sg3:e3 Sg3:e5 W3 NORM OPT");
    CHECK_OK(mmp_sched_validate(&t));
    mmp_sched_fini(&t);
    mmp_sched_fini(&s);
    for (int k = 1; k <= 2; k++) {
        mmp_sched g; /* compile_graph's, with the batch-wide loss */
        memset(&g, 0, sizeof g);
        for (int j = 0; j < 4; j++) {
            mmp_sched_stage *h = &g.stages[g.n_stages++];
            snprintf(h->name, sizeof h->name, "image.%d", j);
            h->kind = MMP_KIND_IMAGE;
            h->sub = j;
            h->n_sub = 4;
            h->layer_first = j;
            h->layer_last = j + 1;
        }
        mmp_sched_stage *h = &g.stages[g.n_stages++];
        snprintf(h->name, sizeof h->name, "fusion");
        h->kind = MMP_KIND_FUSION;
        h->n_sub = 1;
        h->layer_last = 1;
        g.batch_loss = 1;
        CHECK_OK(mmp_sched_compile_stages(&g, (mmp_schedule)k, 8));
        mmp_sim_costs c = {0};
        for (int j = 0; j < g.n_stages; j++) {
            c.fwd_ms[j] = 1;
            c.bwd_ms[j] = 2;
        }
        CHECK_OK(mmp_sched_simulate(&g, &c, &r[k]));
        mmp_sched_fini(&g);
    }
    /* 1F1B (= GPipe here) 36 ms, zb-h1 33: the last gradients climb the
     * chain by B alone, each W runs while its stage waits for the next. */
    /* 1F1B (= GPipe here) 36 ms, zb-h1 32: fusion's F's end at 12 either
     * way; its B's then send each gradient after Bi (1 ms, not B + W = 2),
     * so image.3 starts at 13, not 14, and the last gradients climb the
     * chain by B alone, each W running while its stage waits for the next:
     * image.0 ends 16 ms (8 x (B + W)) after its first gradient at 16. */
    CHECK(near(r[1].step_ms, 36) && near(r[2].step_ms, 32));
    CHECK(r[2].bubble < r[1].bubble);

    /* configs/sim-uneven.yaml re-placed (image.0 x4, text.0, fusion; batch
     * 192, ms per sample F/B: image 4/8, text and fusion 1/2). m = 96 (2
     * samples a micro-batch): every replica's F's end at 24 x 8 = 192,
     * fusion's (keeping pace) at 200. 1F1B: fusion's B's (4 ms) reach image
     * replica k at 204 + 4k, the last ends 216 + 24 x 16 = 600. zb-h1:
     * fusion's Bi's (2 ms) at 202 + 2k, the last ends 208 + 384 = 592,
     * fusion's W's (192 ms) from 392 to 584, inside that drain. m = 192 (the
     * config's): fill and drain halve, 1F1B 204 + 384 = 588, zb-h1 200 +
     * 384 = 584. */
    static const int sim_m[] = {96, 192};
    static const double want_1f1b[] = {600, 588}, want_zb[] = {592, 584};
    for (int i = 0; i < 2; i++) {
        int m = sim_m[i], spm = 192 / m; /* samples a micro-batch */
        for (int k = 1; k <= 2; k++) {
            make_plan(&p, (mmp_schedule)k, m, 0, NULL, 0, NULL);
            p.model.fusion.itc_scope = MMP_ITC_BATCH;
            p.train.batch = 192;
            p.stages.image.n_replicas = 1;
            p.stages.image.replicas[0] = 4;
            CHECK_OK(mmp_sched_compile(&s, &p));
            mmp_sim_costs c = {0};
            for (int j = 0; j < s.n_stages; j++) {
                int img = s.stages[j].kind == MMP_KIND_IMAGE;
                c.fwd_ms[j] = (img ? 4 : 1) * spm;
                c.bwd_ms[j] = (img ? 8 : 2) * spm;
            }
            CHECK_OK(mmp_sched_simulate(&s, &c, &r[k]));
            if (k == 2) {
                int f = mmp_sched_find(&s, "fusion");
                int w0 = find_instr(&s, f, MMP_OP_BWD_WEIGHT, 0, -1);
                CHECK(w0 > find_instr(&s, f, MMP_OP_BWD_INPUT, m - 1, -1));
                CHECK(near(r[2].busy_ms[f], 576));
            }
            mmp_sched_fini(&s);
        }
        CHECK(near(r[1].step_ms, want_1f1b[i]) && near(r[2].step_ms, want_zb[i]));
    }
}

/* ---- a thousand processes ---------------------------------------------------------------- */

/* The most processes a plan holds (MMP_SCHED_MAX_STAGES = 1024), spread as a
 * large cluster would: image cut in 3 sub-stages of 256, 256 and 200
 * replicas, text in 2 of 100, fusion 112. Every replica pair of consecutive
 * stages has its edge pair (320672 edges), the routing deals each
 * micro-batch to one replica of every stage, backwards stay in ascending
 * order on every process, and one step simulates; 1025 processes are
 * refused. */
static void test_thousand_processes(void)
{
    static const int is[2] = {3, 6}, ts[1] = {2};
    static const int reps[6] = {256, 256, 200, 100, 100, 112};
    static const mmp_schedule kinds[3] = {MMP_SCHED_1F1B, MMP_SCHED_ZB_H1, MMP_SCHED_GPIPE};
    for (int k = 0; k < 3; k++) {
        int m = k == 2 ? 64 : 256;
        mmp_plan p;
        make_plan(&p, kinds[k], m, 2, is, 1, ts);
        p.train.batch = 1024;
        p.stages.image.n_replicas = 3;
        p.stages.text.n_replicas = 2;
        p.stages.fusion.n_replicas = 1;
        for (int j = 0; j < 3; j++) {
            p.stages.image.replicas[j] = reps[j];
        }
        p.stages.text.replicas[0] = reps[3];
        p.stages.text.replicas[1] = reps[4];
        p.stages.fusion.replicas[0] = reps[5];
        static mmp_sched s;
        double t0 = mmp_now();
        mmp_err e = mmp_sched_compile(&s, &p);
        double t1 = mmp_now();
        if (e != MMP_OK) {
            fprintf(stderr, "  %s: %s\n", mmp_schedule_name(kinds[k]), mmp_last_error());
        }
        CHECK_OK(e);
        CHECK(s.n_stages == 1024);
        CHECK(s.n_edges == 2 * (256 * 256 + 256 * 200 + 200 * 112 + 100 * 100 + 100 * 112));
        CHECK(s.n_edges <= MMP_SCHED_MAX_EDGES);
        CHECK(strcmp(s.stages[1023].proc, "fusion/111") == 0);
        CHECK(mmp_sched_find(&s, "image.2/199") == 256 + 256 + 199);
        CHECK(mmp_sched_find(&s, "text.1/0") == 812 && mmp_sched_find(&s, "fusion") == 912);
        /* each micro-batch forwarded and backwarded once per stage, by the
         * replica it is routed to, backwards ascending, lists ending the step */
        for (int st = 0; st < s.n_stages; st += s.stages[st].n_replicas) {
            for (int mb = 0; mb < m; mb++) {
                int n = 0;
                for (int r = 0; r < s.stages[st].n_replicas; r++) {
                    n += s.stages[st + r].owns[mb];
                }
                CHECK(n == 1);
            }
        }
        long fwds = 0, bwds = 0;
        for (int st = 0; st < s.n_stages; st++) {
            const mmp_sched_stage *g = &s.stages[st];
            int last_b = -1;
            for (int pc = 0; pc < g->n_prog; pc++) {
                const mmp_instr *in = &g->prog[pc];
                if (in->op == MMP_OP_FWD) {
                    CHECK(g->owns[in->mb]);
                    fwds++;
                }
                if (in->op == MMP_OP_BWD || in->op == MMP_OP_BWD_INPUT) {
                    CHECK(g->owns[in->mb] && in->mb > last_b);
                    last_b = in->mb;
                    bwds++;
                }
            }
            CHECK(g->max_inflight <= g->inflight_bound);
            CHECK(g->n_prog >= 2 && g->prog[g->n_prog - 2].op == MMP_OP_GRAD_NORM &&
                  g->prog[g->n_prog - 1].op == MMP_OP_OPT_STEP);
        }
        CHECK(fwds == 6L * m && bwds == 6L * m);
        for (int e = 0; e < s.n_edges; e++) {
            const mmp_sched_edge *E = &s.edges[e];
            CHECK(E->slots == s.stages[E->grad ? E->to : E->from].stage_bound ||
                  kinds[k] == MMP_SCHED_ZB_H1);
        }
        static mmp_sim_costs c;
        for (int i = 0; i < s.n_stages; i++) {
            c.fwd_ms[i] = 1;
            c.bwd_ms[i] = 2;
        }
        static mmp_sim_result r;
        CHECK_OK(mmp_sched_simulate(&s, &c, &r));
        CHECK(r.step_ms > 0 && r.bubble >= 0 && r.bubble < 1);
        printf("1024 processes, %d edges, m=%d, %s: compile %.3f s, simulate %.3f s\n", s.n_edges,
               m, mmp_schedule_name(kinds[k]), t1 - t0, mmp_now() - t1);
        mmp_sched_fini(&s);
        /* one more is refused, naming the limit */
        p.stages.fusion.replicas[0] = reps[5] + 1;
        CHECK(mmp_sched_compile(&s, &p) == MMP_ERR_CONFIG);
        CHECK(strcmp(mmp_last_error(), "stages.fusion.replicas: 113 replicas of fusion make more "
                                       "than the 1024 processes a schedule may have") == 0);
        mmp_sched_fini(&s);
    }
}

MMP_TEST_LIST("test_schedule", MMP_TEST_CASE(test_zb_h1), MMP_TEST_CASE(test_batch_loss),
              MMP_TEST_CASE(test_route), MMP_TEST_CASE(test_replicas),
              MMP_TEST_CASE(test_all_shapes), MMP_TEST_CASE(test_exact_lists),
              MMP_TEST_CASE(test_rejects), MMP_TEST_CASE(test_sim_textbook),
              MMP_TEST_CASE(test_sim_branches), MMP_TEST_CASE(test_sim_large),
              MMP_TEST_CASE(test_thousand_processes))
