/* What a stage accepts from its peers (stages/peer.h), on a live channel:
 * a sender that claims more rows than the receiver's buffers hold, or a
 * byte count that does not match its rows, passes the transport (the bytes
 * fit the slot) and must then be refused by the stage's check, the one
 * chan_recv in stages/worker.c applies before reading the payload by hdr.n.
 * Then the coordinator's instruction lists: every field that indexes
 * something in the stage is checked against the assignment. */
#include <string.h>
#include <unistd.h>

#include "stages/peer.h"
#include "tests/harness.h"
#include "transport/channel.h"

enum { MB_MAX = 4, ROW = 12 * sizeof(float) };

static void test_rows_live(void)
{
    char addr[64];
    snprintf(addr, sizeof addr, "/mmpipe-test-peer-%d", (int)getpid());
    const mmp_transport *t = &mmp_transport_shm;
    mmp_channel_cfg cs = {
        .address = addr, .slot_bytes = MB_MAX * ROW, .slots = 4, .send = 1, .timeout_ms = 1000};
    mmp_channel_cfg cr = cs;
    cr.send = 0;
    mmp_channel *a = NULL, *b = NULL;
    CHECK_OK(mmp_channel_open_with(&a, t, &cs, 1));
    CHECK_OK(mmp_channel_open_with(&b, t, &cr, 0));
    if (!a || !b) {
        mmp_channel_close(a);
        mmp_channel_close(b);
        return;
    }
    static float rows[MB_MAX * ROW / sizeof(float)];
    static const struct {
        int n;
        size_t bytes;
        mmp_err want;
        const char *says;
    } cases[] = {
        {MB_MAX, MB_MAX * ROW, MMP_OK, NULL},
        {0, 0, MMP_OK, NULL},
        /* The worker bug: n rows copied into mb_max-row buffers unchecked. */
        {MB_MAX + 1, MB_MAX * ROW, MMP_ERR_PROTO, "field n = 5, outside 0..4"},
        {1000000, 8, MMP_ERR_PROTO, "field n = 1000000"},
        /* bytes that do not cover n rows: the mask/valid parts would be read past them */
        {2, ROW, MMP_ERR_PROTO, "field bytes = 48, want 96"},
        {1, 2 * ROW, MMP_ERR_PROTO, "field bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mmp_msg_header h = {.step = 2, .mb = 1, .n = cases[i].n, .bytes = cases[i].bytes};
        CHECK_OK(mmp_channel_send(a, &h, rows));
        mmp_msg_header got;
        const void *p;
        /* the transport lets it through: it fits the slot */
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        mmp_err e = mmp_peer_check_rows(7, &got, MB_MAX, ROW);
        CHECK(e == cases[i].want);
        if (cases[i].says) {
            CHECK(strstr(mmp_last_error(), cases[i].says) != NULL);
            CHECK(strstr(mmp_last_error(), "channel 7") != NULL);
        }
        CHECK_OK(mmp_channel_release(b));
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
}

static void test_program(void)
{
    Mmpipe__Channel in = MMPIPE__CHANNEL__INIT, out = MMPIPE__CHANNEL__INIT;
    in.id = 3, in.send = 0, in.grad = 0, in.slots = 2;
    in.peer = "image.0/0", in.address = "/x", in.transport = "shm";
    out = in;
    out.id = 5, out.send = 1;
    Mmpipe__Channel *chans[] = {&in, &out};
    Mmpipe__Assignment a = MMPIPE__ASSIGNMENT__INIT;
    a.kind = MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE;
    a.microbatches = 4;
    a.replicas = 1;
    a.layer_last = 2;
    a.n_channels = 2;
    a.channels = chans;
    Mmpipe__Instr i0 = MMPIPE__INSTR__INIT;
    Mmpipe__Instr *prog[] = {&i0};
    a.program = prog;
    a.n_program = 1;
    static const struct {
        int op, mb, edge;
        mmp_err want;
        const char *says;
    } cases[] = {
        {MMPIPE__OP__RECV_ACT, 3, 3, MMP_OK, NULL},
        {MMPIPE__OP__SEND_ACT, 0, 5, MMP_OK, NULL},
        {MMPIPE__OP__GRAD_NORM, -1, -1, MMP_OK, NULL},
        {MMPIPE__OP__RECV_ACT, 0, -1, MMP_ERR_PROTO, "field edge = -1"}, /* worker: NULL channel */
        {MMPIPE__OP__RECV_ACT, 0, 5, MMP_ERR_PROTO, "a receive on channel 5, which sends"},
        {MMPIPE__OP__RECV_GRAD, 0, 3, MMP_ERR_PROTO, "receives activations"},
        {MMPIPE__OP__BWD, 4, -1, MMP_ERR_PROTO, "field mb = 4, outside 0..3"}, /* bwd_ms[mb] */
        {MMPIPE__OP__LOAD, -2, -1, MMP_ERR_PROTO, "field mb = -2"},
        {99, 0, -1, MMP_ERR_PROTO, "field op = 99"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        i0.op = cases[i].op;
        i0.mb = cases[i].mb;
        i0.edge = cases[i].edge;
        mmp_err e = mmp_peer_check_assignment(&a);
        CHECK(e == cases[i].want);
        if (e != cases[i].want) {
            fprintf(stderr, "  case %zu: %s\n", i, mmp_last_error());
        }
        if (cases[i].says) {
            CHECK(strstr(mmp_last_error(), cases[i].says) != NULL);
        }
    }
    /* zb-h1: a BWD_WEIGHT needs its micro-batch's BWD_INPUT before it, once */
    Mmpipe__Instr b = MMPIPE__INSTR__INIT, w = MMPIPE__INSTR__INIT, w2 = MMPIPE__INSTR__INIT;
    b.op = MMPIPE__OP__BWD_INPUT, b.mb = 1, b.edge = -1;
    w.op = w2.op = MMPIPE__OP__BWD_WEIGHT, w.mb = w2.mb = 1, w.edge = w2.edge = -1;
    Mmpipe__Instr *split[] = {&b, &w, &w2};
    a.program = split;
    a.n_program = 2;
    CHECK_OK(mmp_peer_check_assignment(&a));
    a.n_program = 3;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO &&
          strstr(mmp_last_error(), "instruction 2: BWD_WEIGHT of mb 1 repeats an earlier one"));
    split[0] = &w, split[1] = &b;
    a.n_program = 2;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO &&
          strstr(mmp_last_error(), "instruction 0: BWD_WEIGHT of mb 1 before its BWD_INPUT"));
    b.mb = 2;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO &&
          strstr(mmp_last_error(), "BWD_WEIGHT of mb 1 without its BWD_INPUT"));
    a.program = prog;
    a.n_program = 1;
    i0 = (Mmpipe__Instr)MMPIPE__INSTR__INIT;
    i0.op = MMPIPE__OP__FWD;
    CHECK_OK(mmp_peer_check_assignment(&a));
    a.microbatches = 0;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO);
    a.microbatches = 4;
    a.replica = 1;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO);
    a.replica = 0;
    a.kind = (Mmpipe__StageKind)7;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO);
    a.kind = MMPIPE__STAGE_KIND__STAGE_KIND_IMAGE;
    a.sub = 1024; /* no branch has so many: the trace's row number would overflow */
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO && strstr(mmp_last_error(), "sub = 1024"));
    a.sub = 0;
    out.id = 3;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO && strstr(mmp_last_error(), "twice"));
    /* an id of -1 would let a send or receive of edge -1 (no channel) pass
     * the check, and the worker run it on a NULL channel (do_send_grad) */
    out.id = -1;
    i0.op = MMPIPE__OP__SEND_ACT, i0.mb = 0, i0.edge = -1;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO &&
          strstr(mmp_last_error(), "channel 1: field id = -1, negative"));
    i0 = (Mmpipe__Instr)MMPIPE__INSTR__INIT;
    i0.op = MMPIPE__OP__FWD;
    out.id = 5;
    out.slots = 0;
    CHECK(mmp_peer_check_assignment(&a) == MMP_ERR_PROTO && strstr(mmp_last_error(), "slots"));
}

MMP_TEST_LIST("test_peer", MMP_TEST_CASE(test_rows_live), MMP_TEST_CASE(test_program))
