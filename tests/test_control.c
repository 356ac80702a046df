/* The control channel: a ROUTER/DEALER round trip, a send to an unknown peer,
 * untrusted input from foreign raw ZeroMQ sockets (each kind of bad message is
 * rejected and counted, and a valid message after it still gets through),
 * timeouts (also under a flood of bad messages, and on a signal), and closing
 * with unsent messages. Every case runs twice: over ipc (endpoints in the
 * abstract namespace, nothing on disk) and over tcp on 127.0.0.1 with CURVE
 * (the foreign sockets then hold the job's client keys: they test what an
 * authenticated but malformed peer can do). CURVE-only cases: peers without
 * the keys are refused and counted; a stage notices its coordinator's pipe
 * closing and its link going silent (heartbeats) within MMP_CTL_LOST_S. */
#include "transport/control.h"
#include "transport/channel.h"

#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "tests/harness.h"

static void *zctx; /* for the foreign sockets */
static char token[33];
static int over_tcp;      /* the cases' transport: ipc, or tcp with CURVE */
static mmp_ctl_keys keys; /* the job's keys when over_tcp */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *endpoint(const char *name)
{
    static char buf[8][128];
    static int next;
    char *b = buf[next++ % 8];
    if (over_tcp) {
        snprintf(b, sizeof buf[0], "tcp://127.0.0.1:%d", mmp_test_free_port());
    } else {
        snprintf(b, sizeof buf[0], "ipc://@mmpipe-test-%d-%s", (int)getpid(), name);
    }
    return b;
}

static mmp_err bind_ctl(mmp_ctl **out, const char *ep, const char *tok)
{
    mmp_ctl_opts o = {.curve = &keys, .watch_fd = -1};
    return mmp_ctl_bind_opts(out, ep, tok, over_tcp ? &o : NULL);
}

static mmp_err connect_ctl(mmp_ctl **out, const char *ep, const char *id, const char *tok)
{
    mmp_ctl_opts o = {.curve = &keys, .watch_fd = -1};
    return mmp_ctl_connect_opts(out, ep, id, tok, over_tcp ? &o : NULL);
}

/* The job's ROUTER bound at ep (checked); NULL when the bind failed. */
static mmp_ctl *router_at(const char *ep)
{
    mmp_ctl *r = NULL;
    CHECK_OK(bind_ctl(&r, ep, token));
    return r;
}

/* A raw socket; over tcp a DEALER holds the job's client keys and a ROUTER
 * is a CURVE server with the job's server key. */
static void *foreign(int type, const char *id)
{
    void *s = zmq_socket(zctx, type);
    int zero = 0, one = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (id) {
        zmq_setsockopt(s, ZMQ_ROUTING_ID, id, strlen(id));
    }
    if (over_tcp && type == ZMQ_ROUTER) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, keys.server_secret, 41);
    } else if (over_tcp) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, keys.server_public, 41);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, keys.client_public, 41);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, keys.client_secret, 41);
    }
    return s;
}

/* A packed Envelope carrying Hello{pid}; free() the result. */
static unsigned char *pack_hello(unsigned version, const char *tok, int pid, size_t *n)
{
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    hello.name = "foreign";
    hello.pid = pid;
    env.version = version;
    env.job_token = (char *)tok;
    env.body_case = MMPIPE__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    *n = mmpipe__envelope__get_packed_size(&env);
    unsigned char *buf = malloc(*n);
    mmpipe__envelope__pack(&env, buf);
    return buf;
}

static void send_hello(void *sock, unsigned version, const char *tok, int pid, int flags)
{
    size_t n;
    unsigned char *buf = pack_hello(version, tok, pid, &n);
    CHECK(zmq_send(sock, buf, n, flags) == (int)n);
    free(buf);
}

static int stats_equal(mmp_ctl_stats got, mmp_ctl_stats want)
{
    if (memcmp(&got, &want, sizeof got) == 0) {
        return 1;
    }
    fprintf(stderr,
            "  stats got:  received %ld rejected %ld too_big %ld undecodable %ld bad_version %ld "
            "bad_token %ld no_body %ld bad_frames %ld\n"
            "  stats want: received %ld rejected %ld too_big %ld undecodable %ld bad_version %ld "
            "bad_token %ld no_body %ld bad_frames %ld\n",
            got.received, got.rejected, got.too_big, got.undecodable, got.bad_version,
            got.bad_token, got.no_body, got.bad_frames, want.received, want.rejected, want.too_big,
            want.undecodable, want.bad_version, want.bad_token, want.no_body, want.bad_frames);
    return 0;
}

static void test_round_trip(void)
{
    const char *ep = endpoint("rt");
    mmp_ctl *r = NULL, *d = NULL;
    CHECK_OK(bind_ctl(&r, ep, token));
    CHECK_OK(connect_ctl(&d, ep, "image.0/0", token));
    if (!r || !d) {
        goto exit;
    }

    /* The caller leaves version and token unset: send fills them in. */
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    hello.name = "image.0/0";
    hello.pid = 4242;
    env.body_case = MMPIPE__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    char *callers_token = env.job_token;
    CHECK_OK(mmp_ctl_send(d, NULL, &env));
    CHECK(env.version == MMP_CTL_VERSION);
    CHECK(env.job_token == callers_token);

    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_recv(r, 2000, &got, from, sizeof from));
    CHECK(strcmp(from, "image.0/0") == 0);
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_HELLO);
    if (got && got->body_case == MMPIPE__ENVELOPE__BODY_HELLO) {
        CHECK(strcmp(got->hello->name, "image.0/0") == 0);
        CHECK(got->hello->pid == 4242);
        CHECK(strcmp(got->job_token, token) == 0);
    }
    mmp_ctl_free(got);

    Mmpipe__Envelope reply = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Start start = MMPIPE__START__INIT;
    start.first_step = 7;
    start.steps = 300;
    reply.body_case = MMPIPE__ENVELOPE__BODY_START;
    reply.start = &start;
    CHECK_OK(mmp_ctl_send(r, "image.0/0", &reply));
    strcpy(from, "junk");
    CHECK_OK(mmp_ctl_recv(d, 2000, &got, from, sizeof from));
    CHECK(from[0] == 0);
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_START);
    if (got && got->body_case == MMPIPE__ENVELOPE__BODY_START) {
        CHECK(got->start->first_step == 7 && got->start->steps == 300);
    }
    mmp_ctl_free(got);

    /* Nested and repeated fields survive too. */
    Mmpipe__Envelope asg_env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Assignment asg = MMPIPE__ASSIGNMENT__INIT;
    Mmpipe__Channel ch = MMPIPE__CHANNEL__INIT;
    Mmpipe__Instr i0 = MMPIPE__INSTR__INIT, i1 = MMPIPE__INSTR__INIT;
    Mmpipe__Channel *chs[] = {&ch};
    Mmpipe__Instr *prog[] = {&i0, &i1};
    ch.id = 3;
    ch.peer = "fusion/0";
    ch.slot_bytes = 1ull << 33;
    i0.op = MMPIPE__OP__LOAD;
    i0.mb = 1;
    i0.edge = -1;
    i1.op = MMPIPE__OP__SEND_ACT;
    i1.mb = 1;
    i1.edge = 0;
    asg.name = "image.0/0";
    asg.n_channels = 1;
    asg.channels = chs;
    asg.n_program = 2;
    asg.program = prog;
    asg_env.body_case = MMPIPE__ENVELOPE__BODY_ASSIGNMENT;
    asg_env.assignment = &asg;
    CHECK_OK(mmp_ctl_send(r, "image.0/0", &asg_env));
    CHECK_OK(mmp_ctl_recv(d, 2000, &got, from, sizeof from));
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_ASSIGNMENT);
    if (got && got->body_case == MMPIPE__ENVELOPE__BODY_ASSIGNMENT) {
        Mmpipe__Assignment *a = got->assignment;
        CHECK(strcmp(a->name, "image.0/0") == 0);
        CHECK(a->n_channels == 1 && a->channels[0]->id == 3 &&
              strcmp(a->channels[0]->peer, "fusion/0") == 0 &&
              a->channels[0]->slot_bytes == 1ull << 33);
        CHECK(a->n_program == 2 && a->program[0]->op == MMPIPE__OP__LOAD &&
              a->program[0]->edge == -1 && a->program[1]->op == MMPIPE__OP__SEND_ACT &&
              a->program[1]->mb == 1);
        /* A received envelope can be re-sent and then freed (its token
         * pointer is restored); ASan checks the free. */
        CHECK_OK(mmp_ctl_send(d, NULL, got));
    }
    mmp_ctl_free(got);
    CHECK_OK(mmp_ctl_recv(r, 2000, &got, from, sizeof from));
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_ASSIGNMENT);
    mmp_ctl_free(got);

    mmp_ctl_stats want = {.received = 2};
    CHECK(stats_equal(mmp_ctl_get_stats(r), want));
    CHECK(stats_equal(mmp_ctl_get_stats(d), want));
exit:
    mmp_ctl_close(d);
    mmp_ctl_close(r);
}

/* An Error body of `len` characters; returns its packed size. */
static size_t error_env(Mmpipe__Envelope *env, Mmpipe__Error *err, char *text, size_t len)
{
    memset(text, 'x', len);
    text[len] = 0;
    err->message = text;
    env->body_case = MMPIPE__ENVELOPE__BODY_ERROR;
    env->error = err;
    env->version = MMP_CTL_VERSION;
    env->job_token = token;
    return mmpipe__envelope__get_packed_size(env);
}

static void test_limits_and_misuse(void)
{
    const char *ep = endpoint("lim");
    mmp_ctl *r = NULL, *d = NULL, *dup = NULL;
    CHECK_OK(bind_ctl(&r, ep, token));
    CHECK_OK(connect_ctl(&d, ep, "text.0/0", token));
    if (!r || !d) {
        goto exit;
    }
    /* The same endpoint twice, bad tokens and ids: errors, *out stays NULL. */
    CHECK(bind_ctl(&dup, ep, token) == MMP_ERR_IO && !dup);
    CHECK(bind_ctl(&dup, endpoint("other"), "") == MMP_ERR_INVALID && !dup);
    CHECK(bind_ctl(&dup, "nonsense://x", token) == MMP_ERR_IO && !dup);
    CHECK(connect_ctl(&dup, ep, "", token) == MMP_ERR_INVALID && !dup);
    CHECK(connect_ctl(&dup, ep, "bad\nid", token) == MMP_ERR_INVALID && !dup);
    char long_id[MMP_CTL_ID_MAX + 1];
    memset(long_id, 'a', MMP_CTL_ID_MAX);
    long_id[MMP_CTL_ID_MAX] = 0;
    CHECK(connect_ctl(&dup, ep, long_id, token) == MMP_ERR_INVALID && !dup);

    /* A ROUTER send to nobody in particular, or to an unknown peer. */
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Shutdown sd = MMPIPE__SHUTDOWN__INIT;
    CHECK(mmp_ctl_send(r, "image.0/0", &env) == MMP_ERR_INVALID); /* no body */
    env.body_case = MMPIPE__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &sd;
    CHECK(mmp_ctl_send(r, NULL, &env) == MMP_ERR_INVALID);
    CHECK(mmp_ctl_send(d, "fusion/0", &env) == MMP_ERR_INVALID);
    CHECK(mmp_ctl_send(r, "nobody/0", &env) == MMP_ERR_PEER);
    CHECK(strstr(mmp_last_error(), "nobody/0") != NULL);

    /* Exactly MMP_CTL_MAX_BYTES goes through; one more is refused by send. */
    char *text = malloc(MMP_CTL_MAX_BYTES + 1);
    Mmpipe__Envelope big = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Error err = MMPIPE__ERROR__INIT;
    size_t len = MMP_CTL_MAX_BYTES - 64;
    for (int i = 0; i < 3; i++) {
        len += MMP_CTL_MAX_BYTES - error_env(&big, &err, text, len);
    }
    CHECK(error_env(&big, &err, text, len) == MMP_CTL_MAX_BYTES);
    CHECK_OK(mmp_ctl_send(d, NULL, &big));
    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_recv(r, 5000, &got, from, sizeof from));
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_ERROR &&
          strlen(got->error->message) == len);
    mmp_ctl_free(got);
    CHECK(error_env(&big, &err, text, len + 1) == MMP_CTL_MAX_BYTES + 1);
    CHECK(mmp_ctl_send(d, NULL, &big) == MMP_ERR_INVALID);
    free(text);
exit:
    mmp_ctl_close(d);
    mmp_ctl_close(r);
}

/* A valid Hello{pid} from the foreign socket arrives next, from "foreign/0". */
static void expect_valid(mmp_ctl *r, void *f, int pid, mmp_ctl_stats *want)
{
    send_hello(f, MMP_CTL_VERSION, token, pid, 0);
    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_recv(r, 3000, &got, from, sizeof from));
    CHECK(strcmp(from, "foreign/0") == 0);
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_HELLO && got->hello->pid == pid);
    if (got && got->body_case == MMPIPE__ENVELOPE__BODY_HELLO && got->hello->pid != pid) {
        fprintf(stderr, "  got Hello %d, want %d\n", got->hello->pid, pid);
    }
    mmp_ctl_free(got);
    want->received++;
    CHECK(stats_equal(mmp_ctl_get_stats(r), *want));
}

/* A ROUTER bound at ep with a foreign DEALER "foreign/0" connected to it
 * and known to it (one valid Hello{pid} received, counted in want). NULL
 * when the bind failed. */
static void *router_and_peer(const char *ep, mmp_ctl **r, int pid, mmp_ctl_stats *want)
{
    if (!(*r = router_at(ep))) {
        return NULL;
    }
    void *f = foreign(ZMQ_DEALER, "foreign/0");
    CHECK(zmq_connect(f, ep) == 0);
    expect_valid(*r, f, pid, want);
    return f;
}

/* env packed and decoded as a receiver would: 1 when the verdict is want
 * (and, refused, the reason names why_has). */
static int decodes_as(Mmpipe__Envelope *env, const char *token, int want, const char *why_has)
{
    unsigned char buf[512];
    char why[160] = "";
    env->version = MMP_CTL_VERSION;
    env->job_token = (char *)token;
    size_t n = mmpipe__envelope__pack(env, buf);
    Mmpipe__Envelope *e = NULL;
    int got = (int)mmp_ctl_decode(buf, n, token, &e, why, sizeof why), have = e != NULL;
    mmp_ctl_free(e);
    return got == want && (want == MMP_CTL_OK) == have &&
           (!why_has || strstr(why, why_has) != NULL);
}

static void test_untrusted_router(void)
{
    const char *ep = endpoint("untrusted");
    mmp_ctl *r = NULL;
    mmp_ctl_stats want = {0};
    int pid = 100;
    void *f = router_and_peer(ep, &r, pid++, &want);
    if (!f) {
        return;
    }

    /* (1) bytes that do not decode: a varint that never ends, and a string
     * field whose length runs past the end. */
    static const unsigned char endless[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                            0xff, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char truncated[] = {0x08, 0x01, 0x12, 0x50, 'a', 'b'};
    CHECK(zmq_send(f, endless, sizeof endless, 0) == sizeof endless);
    want.undecodable++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    CHECK(zmq_send(f, truncated, sizeof truncated, 0) == sizeof truncated);
    want.undecodable++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (2) right version and token, no body; and an empty message, which
     * decodes to all defaults (version 0). */
    Mmpipe__Envelope empty = MMPIPE__ENVELOPE__INIT;
    empty.version = MMP_CTL_VERSION;
    empty.job_token = token;
    unsigned char buf[256];
    size_t n = mmpipe__envelope__pack(&empty, buf);
    CHECK(zmq_send(f, buf, n, 0) == (int)n);
    want.no_body++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    CHECK(zmq_send(f, "", 0, 0) == 0);
    want.bad_version++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (3) a body from a newer sender: field 99, as a varint and as a
     * message, hand-encoded after our version and our token. */
    size_t tl = strlen(token);
    unsigned char unknown[64] = {0x08, (unsigned char)MMP_CTL_VERSION, 0x12, (unsigned char)tl};
    memcpy(unknown + 4, token, tl);
    unsigned char *tail = unknown + 4 + tl;
    tail[0] = 0x98, tail[1] = 0x06, tail[2] = 0x01; /* (99 << 3) | 0 = 792, value 1 */
    CHECK(zmq_send(f, unknown, 4 + tl + 3, 0) == (int)(4 + tl + 3));
    want.no_body++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    tail[0] = 0x9a, tail[1] = 0x06, tail[2] = 0x00; /* (99 << 3) | 2, empty message */
    CHECK(zmq_send(f, unknown, 4 + tl + 3, 0) == (int)(4 + tl + 3));
    want.no_body++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (4) one byte over the limit, below ZeroMQ's cut: seen and counted. */
    unsigned char *huge = calloc(2 * MMP_CTL_MAX_BYTES, 1);
    CHECK(zmq_send(f, huge, MMP_CTL_MAX_BYTES + 1, 0) == (int)MMP_CTL_MAX_BYTES + 1);
    want.too_big++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (5) a wrong token: one character off, a prefix of ours, ours and more. */
    char wrong[33];
    memcpy(wrong, token, sizeof wrong);
    wrong[17] = wrong[17] == 'a' ? 'b' : 'a';
    send_hello(f, MMP_CTL_VERSION, wrong, 1, 0);
    want.bad_token++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    memcpy(wrong, token, sizeof wrong);
    wrong[31] = 0;
    send_hello(f, MMP_CTL_VERSION, wrong, 1, 0);
    want.bad_token++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    char longer[40];
    snprintf(longer, sizeof longer, "%sx", token);
    send_hello(f, MMP_CTL_VERSION, longer, 1, 0);
    want.bad_token++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (6) a wrong version; with a wrong token as well it is still counted as
     * a version error (the checks' order). */
    send_hello(f, MMP_CTL_VERSION + 1, token, 1, 0);
    want.bad_version++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    send_hello(f, MMP_CTL_VERSION + 1, "not-the-token", 1, 0);
    want.bad_version++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (7) more than one payload frame: two valid envelopes in one message,
     * and the empty delimiter a REQ socket would put first. */
    send_hello(f, MMP_CTL_VERSION, token, 1, ZMQ_SNDMORE);
    send_hello(f, MMP_CTL_VERSION, token, 2, 0);
    want.bad_frames++, want.rejected++;
    expect_valid(r, f, pid++, &want);
    CHECK(zmq_send(f, "", 0, ZMQ_SNDMORE) == 0);
    send_hello(f, MMP_CTL_VERSION, token, 1, 0);
    want.bad_frames++, want.rejected++;
    expect_valid(r, f, pid++, &want);

    /* (8) a known body with a field no sender may write: a StepDone whose
     * micro-batch timing names micro-batch -1, one with a NaN time. */
    {
        Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
        Mmpipe__StepDone d = MMPIPE__STEP_DONE__INIT;
        Mmpipe__MbTiming t = MMPIPE__MB_TIMING__INIT, *tp = &t;
        env.version = MMP_CTL_VERSION;
        env.job_token = token;
        env.body_case = MMPIPE__ENVELOPE__BODY_STEP_DONE;
        env.step_done = &d;
        d.n_mbs = 1;
        d.mbs = &tp;
        t.mb = -1;
        unsigned char sd[256];
        size_t sn = mmpipe__envelope__pack(&env, sd);
        CHECK(zmq_send(f, sd, sn, 0) == (int)sn);
        want.bad_body++, want.rejected++;
        expect_valid(r, f, pid++, &want);
        t.mb = 0;
        t.fwd_ms = NAN;
        sn = mmpipe__envelope__pack(&env, sd);
        CHECK(zmq_send(f, sd, sn, 0) == (int)sn);
        want.bad_body++, want.rejected++;
        expect_valid(r, f, pid++, &want);
        char why[160];
        Mmpipe__Envelope *e = NULL;
        CHECK(mmp_ctl_decode(sd, sn, token, &e, why, sizeof why) == MMP_CTL_BAD_BODY && !e);
        CHECK(strstr(why, "step_done") != NULL);
        t.fwd_ms = 1.5f;
        sn = mmpipe__envelope__pack(&env, sd);
        CHECK(mmp_ctl_decode(sd, sn, token, &e, why, sizeof why) == MMP_CTL_OK && e);
        mmp_ctl_free(e);
        /* the process's CPU time feeds the balancer and metrics.jsonl too */
        const float bad_cpu[] = {-1.0f, NAN, INFINITY};
        for (size_t k = 0; k < sizeof bad_cpu / sizeof bad_cpu[0]; k++) {
            d.cpu_ms = bad_cpu[k];
            sn = mmpipe__envelope__pack(&env, sd);
            e = NULL;
            CHECK(mmp_ctl_decode(sd, sn, token, &e, why, sizeof why) == MMP_CTL_BAD_BODY && !e);
        }
        d.cpu_ms = 12.5f;
        sn = mmpipe__envelope__pack(&env, sd);
        CHECK(mmp_ctl_decode(sd, sn, token, &e, why, sizeof why) == MMP_CTL_OK && e);
        mmp_ctl_free(e);
        /* a holding stage's Error names the steps its state holds: never
         * below 0 (the coordinator would checkpoint that step) */
        Mmpipe__Error er = MMPIPE__ERROR__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_ERROR;
        env.error = &er;
        er.message = "image/0: a bad sample";
        er.holding = 1;
        er.held_steps = -1;
        CHECK(decodes_as(&env, token, MMP_CTL_BAD_BODY, "held_steps"));
        er.held_steps = 0;
        CHECK(decodes_as(&env, token, MMP_CTL_OK, NULL));
        er.holding = 0; /* not holding: the field means nothing */
        er.held_steps = -1;
        CHECK(decodes_as(&env, token, MMP_CTL_OK, NULL));
        /* the replica that writes a stage's checkpoint file: never below 0 */
        Mmpipe__CheckpointRequest cr = MMPIPE__CHECKPOINT_REQUEST__INIT;
        env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_REQUEST;
        env.checkpoint_request = &cr;
        cr.step = 3;
        cr.dir = "run/ckpt/step_0000003";
        cr.writer = -1;
        CHECK(decodes_as(&env, token, MMP_CTL_BAD_BODY, "writer"));
        cr.writer = 1;
        CHECK(decodes_as(&env, token, MMP_CTL_OK, NULL));
    }

    /* Far over the limit: ZeroMQ itself drops the connection, so the message
     * is never seen (not counted); the peer reconnects and goes on. */
    CHECK(zmq_send(f, huge, 2 * MMP_CTL_MAX_BYTES, 0) == 2 * (int)MMP_CTL_MAX_BYTES);
    free(huge);
    usleep(300 * 1000);
    expect_valid(r, f, pid++, &want);

    /* A peer with no routing id gets ZeroMQ's binary one: printed as hex,
     * and its valid messages still come through. */
    void *anon = foreign(ZMQ_DEALER, NULL);
    CHECK(zmq_connect(anon, ep) == 0);
    send_hello(anon, MMP_CTL_VERSION, wrong, 1, 0);
    send_hello(anon, MMP_CTL_VERSION, token, 77, 0);
    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_recv(r, 3000, &got, from, sizeof from));
    CHECK(strncmp(from, "0x", 2) == 0 && strlen(from) == 12);
    CHECK(got && got->hello->pid == 77);
    mmp_ctl_free(got);
    want.bad_token++, want.rejected++, want.received++;
    CHECK(stats_equal(mmp_ctl_get_stats(r), want));
    CHECK(want.rejected == want.too_big + want.undecodable + want.bad_version + want.bad_token +
                               want.no_body + want.bad_frames + want.bad_body);
    zmq_close(anon);
    zmq_close(f);
    mmp_ctl_close(r);
}

/* The DEALER end checks what the coordinator's side sends just the same. */
static void test_untrusted_dealer(void)
{
    const char *ep = endpoint("fake-coordinator");
    void *fr = foreign(ZMQ_ROUTER, NULL);
    CHECK(zmq_bind(fr, ep) == 0);
    mmp_ctl *d = NULL;
    CHECK_OK(connect_ctl(&d, ep, "fusion/0", token));
    if (!d) {
        zmq_close(fr);
        return;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Ready ready = MMPIPE__READY__INIT;
    env.body_case = MMPIPE__ENVELOPE__BODY_READY;
    env.ready = &ready;
    CHECK_OK(mmp_ctl_send(d, NULL, &env));

    /* What went on the wire: [id][Envelope with version and token]. */
    char id[64] = {0};
    unsigned char buf[256];
    CHECK(zmq_recv(fr, id, sizeof id - 1, 0) == 8 && strcmp(id, "fusion/0") == 0);
    int n = zmq_recv(fr, buf, sizeof buf, 0);
    CHECK(n > 0);
    Mmpipe__Envelope *wire = mmpipe__envelope__unpack(NULL, n > 0 ? (size_t)n : 0, buf);
    CHECK(wire && wire->version == MMP_CTL_VERSION && strcmp(wire->job_token, token) == 0 &&
          wire->body_case == MMPIPE__ENVELOPE__BODY_READY);
    mmpipe__envelope__free_unpacked(wire, NULL);

    /* A wrong token, three frames, then a valid one. */
    CHECK(zmq_send(fr, "fusion/0", 8, ZMQ_SNDMORE) == 8);
    send_hello(fr, MMP_CTL_VERSION, "0123", 1, 0);
    CHECK(zmq_send(fr, "fusion/0", 8, ZMQ_SNDMORE) == 8);
    send_hello(fr, MMP_CTL_VERSION, token, 2, ZMQ_SNDMORE);
    CHECK(zmq_send(fr, "x", 1, ZMQ_SNDMORE) == 1);
    send_hello(fr, MMP_CTL_VERSION, token, 3, 0);
    CHECK(zmq_send(fr, "fusion/0", 8, ZMQ_SNDMORE) == 8);
    send_hello(fr, MMP_CTL_VERSION, token, 4, 0);

    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX] = "junk";
    CHECK_OK(mmp_ctl_recv(d, 3000, &got, from, sizeof from));
    CHECK(from[0] == 0);
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_HELLO && got->hello->pid == 4);
    mmp_ctl_free(got);
    mmp_ctl_stats want = {.received = 1, .rejected = 2, .bad_token = 1, .bad_frames = 1};
    CHECK(stats_equal(mmp_ctl_get_stats(d), want));
    mmp_ctl_close(d);
    zmq_close(fr);
}

static volatile int flood_stop;

/* Sends undecodable bytes every 20 ms until told to stop, for 1.5 s at most
 * (so a recv that restarts its wait on each one fails instead of hanging). */
static void *flood(void *ep)
{
    void *s = foreign(ZMQ_DEALER, "flood/0");
    zmq_connect(s, ep);
    double t0 = now_ms();
    while (!flood_stop && now_ms() - t0 < 1500) {
        zmq_send(s, "\xff\xff", 2, 0);
        usleep(20 * 1000);
    }
    zmq_close(s);
    return NULL;
}

static void on_alarm(int sig)
{
    (void)sig;
}

static void test_timeouts(void)
{
    const char *ep = endpoint("timeout");
    mmp_ctl *r = router_at(ep);
    if (!r) {
        return;
    }
    Mmpipe__Envelope *got = (Mmpipe__Envelope *)&got;
    char from[MMP_CTL_ID_MAX] = "junk";
    double t0 = now_ms();
    CHECK(mmp_ctl_recv(r, 0, &got, from, sizeof from) == MMP_ERR_TIMEOUT);
    double dt = now_ms() - t0;
    CHECK(dt < 140); /* a 0 ms wait does not block: well below the 150 ms wait below */
    CHECK(got == NULL && from[0] == 0);

    t0 = now_ms();
    CHECK(mmp_ctl_recv(r, 150, &got, from, sizeof from) == MMP_ERR_TIMEOUT);
    dt = now_ms() - t0;
    CHECK(dt >= 149 && dt < 1000);
    if (!(dt >= 149 && dt < 1000)) {
        fprintf(stderr, "  150 ms timeout took %.1f ms\n", dt);
    }

    /* Rejected messages arriving during the wait do not restart it: bad
     * messages every 20 ms for 1.5 s, a 300 ms timeout. */
    pthread_t th;
    flood_stop = 0;
    CHECK(pthread_create(&th, NULL, flood, (void *)ep) == 0);
    usleep(100 * 1000);
    long before = mmp_ctl_get_stats(r).undecodable;
    t0 = now_ms();
    CHECK(mmp_ctl_recv(r, 300, &got, from, sizeof from) == MMP_ERR_TIMEOUT);
    dt = now_ms() - t0;
    long during = mmp_ctl_get_stats(r).undecodable - before;
    CHECK(dt >= 299 && dt < 1000);
    CHECK(during >= 5);
    if (!(dt >= 299 && dt < 1000) || during < 5) {
        fprintf(stderr, "  300 ms timeout under a flood took %.1f ms, %ld rejected\n", dt, during);
    }
    flood_stop = 1;
    pthread_join(th, NULL);

    /* A signal ends the wait early with MMP_ERR_TIMEOUT. */
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
    struct sigaction old;
    sigaction(SIGALRM, &sa, &old);
    struct itimerval it = {.it_value = {.tv_usec = 100 * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    t0 = now_ms();
    CHECK(mmp_ctl_recv(r, 5000, &got, from, sizeof from) == MMP_ERR_TIMEOUT);
    dt = now_ms() - t0;
    CHECK(dt < 2000);
    sigaction(SIGALRM, &old, NULL);
    mmp_ctl_close(r);
}

static void test_close_does_not_hang(void)
{
    /* A DEALER whose peer never came: the message waits in its queue. */
    mmp_ctl *d = NULL;
    CHECK_OK(connect_ctl(&d, endpoint("nobody"), "image.0/0", token));
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Heartbeat hb = MMPIPE__HEARTBEAT__INIT;
    env.body_case = MMPIPE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    CHECK_OK(mmp_ctl_send(d, NULL, &env));
    double t0 = now_ms();
    mmp_ctl_close(d);
    CHECK(now_ms() - t0 < 2000);

    /* A ROUTER with megabytes queued for a peer that stopped reading. */
    mmp_ctl *r = NULL;
    mmp_ctl_stats want = {0};
    void *f = router_and_peer(endpoint("stuck"), &r, 1, &want);
    if (!f) {
        return;
    }
    Mmpipe__Envelope big = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Error err = MMPIPE__ERROR__INIT;
    char *text = malloc(65537);
    error_env(&big, &err, text, 65536);
    int sent = 0;
    for (int i = 0; i < 100; i++) {
        sent += mmp_ctl_send(r, "foreign/0", &big) == MMP_OK;
    }
    free(text);
    CHECK(sent == 100);
    t0 = now_ms();
    mmp_ctl_close(r);
    CHECK(now_ms() - t0 < 2000);
    zmq_close(f);
}

/* A Heartbeat's start-up progress is text the coordinator prints: bounded,
 * no control characters, done within total. */
static void test_heartbeat_progress(void)
{
    CHECK_OK(mmp_ctl_new_token(token));
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Heartbeat hb = MMPIPE__HEARTBEAT__INIT;
    env.version = MMP_CTL_VERSION;
    env.job_token = token;
    env.body_case = MMPIPE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    char phase[300], why[300];
    unsigned char buf[1024];
    struct {
        const char *phase, *unit;
        uint64_t done, total;
        int ok;
    } cases[] = {
        {"", "", 0, 0, 1}, /* a heartbeat of the steps */
        {"manifest /d/train.jsonl", "lines", 4096, 30000000, 1},
        {"manifest /d/train.jsonl", "lines", 4096, 0, 1}, /* total not known */
        {"manifest /d/train.jsonl", "lines", 5, 4, 0},    /* done over total */
        {"manifest /d/\x1b[2Jx", "lines", 0, 0, 0},       /* replaced below: an escape */
        {"manifest", "lines\n", 0, 0, 0},                 /* replaced below: a newline */
        {NULL, "lines", 0, 0, 0},                         /* a phase of 256 bytes */
        {NULL, "lines", 0, 0, 1},                         /* of 255 */
        {"checkpoint", "bytes of the checkpoint file!!", 1, 2, 1},
        {"checkpoint", "bytes of the checkpoint files!!!", 1, 2, 0}, /* a unit of 32 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].phase) {
            snprintf(phase, sizeof phase, "%s", cases[k].phase);
        } else {
            memset(phase, 'p', sizeof phase);
            phase[cases[k].ok ? 255 : 256] = 0;
        }
        if (k == 4) {
            phase[13] = 0x1b;
        }
        char unit[64];
        snprintf(unit, sizeof unit, "%s", cases[k].unit);
        if (k == 5) {
            unit[5] = '\n', unit[6] = 0;
        }
        hb.phase = phase;
        hb.unit = unit;
        hb.done = cases[k].done;
        hb.total = cases[k].total;
        size_t n = mmpipe__envelope__pack(&env, buf);
        Mmpipe__Envelope *e = NULL;
        mmp_ctl_verdict v = mmp_ctl_decode(buf, n, token, &e, why, sizeof why);
        if ((v == MMP_CTL_OK) != cases[k].ok) {
            fprintf(stderr, "  heartbeat case %zu: verdict %d (%s)\n", k, (int)v, why);
        }
        CHECK((v == MMP_CTL_OK) == cases[k].ok);
        CHECK(cases[k].ok ? e != NULL : (v == MMP_CTL_BAD_BODY && !e && strstr(why, "heartbeat")));
        mmp_ctl_free(e);
    }
}

/* Text a receiver prints (a stage's error, an abort's reason, a checkpoint
 * ack's error, a hello's name) arrives whole but harmless: escape and other
 * control bytes as '?', line breaks as spaces, so no peer can forge a line
 * of the coordinator's or drive the terminal. Endpoint addresses up to the
 * transports' own MMP_ENDPOINT_MAX (a nccl creator's, a long host name)
 * pass; one with a control byte is refused. */
static void test_printed_text(void)
{
    CHECK_OK(mmp_ctl_new_token(token));
    char why[300];
    static unsigned char buf[4096];
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    env.version = MMP_CTL_VERSION;
    env.job_token = token;
    char text[] = "boom\x1b[2J\r\n[coordinator] step 400/400 done\x07\t!";
    const char *want = "boom?[2J  [coordinator] step 400/400 done? !";
    Mmpipe__Error err = MMPIPE__ERROR__INIT;
    Mmpipe__Abort ab = MMPIPE__ABORT__INIT;
    Mmpipe__CheckpointAck ack = MMPIPE__CHECKPOINT_ACK__INIT;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    err.message = ab.reason = ack.error = hello.name = hello.blas = text;
    for (int k = 0; k < 4; k++) {
        /* the bodies share a union: set the one the case sends */
        if (k == 0) {
            env.body_case = MMPIPE__ENVELOPE__BODY_ERROR, env.error = &err;
        } else if (k == 1) {
            env.body_case = MMPIPE__ENVELOPE__BODY_ABORT, env.abort = &ab;
        } else if (k == 2) {
            env.body_case = MMPIPE__ENVELOPE__BODY_CHECKPOINT_ACK, env.checkpoint_ack = &ack;
        } else {
            env.body_case = MMPIPE__ENVELOPE__BODY_HELLO, env.hello = &hello;
        }
        size_t n = mmpipe__envelope__pack(&env, buf);
        Mmpipe__Envelope *e = NULL;
        CHECK(mmp_ctl_decode(buf, n, token, &e, why, sizeof why) == MMP_CTL_OK && e);
        if (!e) {
            continue;
        }
        const char *got = k == 0   ? e->error->message
                          : k == 1 ? e->abort->reason
                          : k == 2 ? e->checkpoint_ack->error
                                   : e->hello->name;
        if (strcmp(got, want) != 0) {
            fprintf(stderr, "  text case %d: '%s'\n", k, got);
        }
        CHECK(strcmp(got, want) == 0);
        CHECK(k != 3 || strcmp(e->hello->blas, want) == 0);
        mmp_ctl_free(e);
    }
    CHECK(strstr(text, "\x1b") != NULL); /* the sender's own copy is untouched */

    Mmpipe__Endpoint ep = MMPIPE__ENDPOINT__INIT, *eps = &ep;
    Mmpipe__Endpoints all = MMPIPE__ENDPOINTS__INIT;
    all.n_endpoints = 1;
    all.endpoints = &eps;
    env.body_case = MMPIPE__ENVELOPE__BODY_ENDPOINTS;
    env.endpoints = &all;
    char addr[MMP_ENDPOINT_MAX + 1];
    for (int len = MMP_ENDPOINT_MAX - 1; len <= MMP_ENDPOINT_MAX; len++) {
        memset(addr, 'a', (size_t)len);
        addr[len] = 0;
        ep.address = addr;
        size_t n = mmpipe__envelope__pack(&env, buf);
        Mmpipe__Envelope *e = NULL;
        mmp_ctl_verdict v = mmp_ctl_decode(buf, n, token, &e, why, sizeof why);
        CHECK(len < MMP_ENDPOINT_MAX ? v == MMP_CTL_OK : v == MMP_CTL_BAD_BODY);
        mmp_ctl_free(e);
    }
    /* a nccl creator's address on a 40-character host name: 302 bytes */
    snprintf(addr, sizeof addr, "gpu-node-017.rack3.dc1.example.org:41234#nccl:%0256d", 0);
    ep.address = addr;
    size_t n = mmpipe__envelope__pack(&env, buf);
    Mmpipe__Envelope *e = NULL;
    CHECK(mmp_ctl_decode(buf, n, token, &e, why, sizeof why) == MMP_CTL_OK && e);
    mmp_ctl_free(e);
    CHECK_OK(mmp_channel_check_endpoint(addr));
    snprintf(addr, sizeof addr, "host:1\x1b[2J");
    n = mmpipe__envelope__pack(&env, buf);
    CHECK(mmp_ctl_decode(buf, n, token, &e, why, sizeof why) == MMP_CTL_BAD_BODY && !e);
    CHECK(strstr(why, "control characters") != NULL);
}

/* Over ipc another user's process cannot connect: it would take a stage's
 * routing id over (ROUTER_HANDOVER) before its token is read, and the
 * coordinator's messages to the stage would go to it. Here a process of
 * user nobody connects under the routing id of a stage that is talking to
 * the coordinator; the stage still gets what the coordinator sends it.
 * Needs root (to become nobody); ipc only (over tcp CURVE refuses it). */
static void test_ipc_other_user(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "  skipped: not root (the case becomes another user)\n");
        return;
    }
    const char *ep = endpoint("other-user");
    mmp_ctl *r = NULL, *d = NULL;
    CHECK_OK(bind_ctl(&r, ep, token));
    CHECK_OK(connect_ctl(&d, ep, "image.0/0", token));
    if (!r || !d) {
        goto exit;
    }
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT, *got = NULL;
    Mmpipe__Hello hello = MMPIPE__HELLO__INIT;
    hello.name = "image.0/0";
    env.body_case = MMPIPE__ENVELOPE__BODY_HELLO;
    env.hello = &hello;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_send(d, NULL, &env));
    CHECK_OK(mmp_ctl_recv(r, 2000, &got, from, sizeof from));
    mmp_ctl_free(got);

    pid_t child = fork();
    if (child == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0) {
            _exit(3);
        }
        void *ctx = zmq_ctx_new();
        void *s = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(s, ZMQ_ROUTING_ID, "image.0/0", 9);
        zmq_connect(s, ep);
        size_t n;
        unsigned char *buf = pack_hello(MMP_CTL_VERSION, "not-the-token", 1, &n);
        zmq_send(s, buf, n, 0);
        char sink[64];
        int wait_ms = 3000;
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
        /* exit 5: it was handed what the coordinator sent the stage */
        _exit(zmq_recv(s, sink, sizeof sink, 0) >= 0 ? 5 : 0);
    }
    usleep(500 * 1000); /* the stranger has connected (or been turned away) */
    Mmpipe__Envelope start_env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Start start = MMPIPE__START__INIT;
    start.steps = 5;
    start_env.body_case = MMPIPE__ENVELOPE__BODY_START;
    start_env.start = &start;
    CHECK_OK(mmp_ctl_send(r, "image.0/0", &start_env));
    got = NULL;
    CHECK_OK(mmp_ctl_recv(d, 2000, &got, from, sizeof from));
    CHECK(got && got->body_case == MMPIPE__ENVELOPE__BODY_START && got->start->steps == 5);
    mmp_ctl_free(got);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "  the other user's process: status 0x%x (exit 5: it got the stage's message)\n",
                status);
    }
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(mmp_ctl_get_stats(r).bad_token == 0); /* its message never arrived */
exit:
    mmp_ctl_close(d);
    mmp_ctl_close(r);
}

static void test_new_token(void)
{
    char a[33], b[33];
    CHECK_OK(mmp_ctl_new_token(a));
    CHECK_OK(mmp_ctl_new_token(b));
    CHECK(strlen(a) == 32 && strspn(a, "0123456789abcdef") == 32);
    CHECK(strlen(b) == 32 && strspn(b, "0123456789abcdef") == 32);
    CHECK(strcmp(a, b) != 0);
}

/* ---- CURVE only ------------------------------------------------------------ */

/* Peers without the job's keys: no CURVE at all, another client key with the
 * right server key, a wrong server key. Each is refused in the handshake and
 * counted; none of their (valid-token!) messages arrives; the job's own
 * client still gets through. */
static void test_curve_refuses(void)
{
    const char *ep = endpoint("refuse");
    mmp_ctl *r = router_at(ep);
    if (!r) {
        return;
    }
    int zero = 0;
    void *plain = zmq_socket(zctx, ZMQ_DEALER);
    zmq_setsockopt(plain, ZMQ_LINGER, &zero, sizeof zero);
    void *other = foreign(ZMQ_DEALER, "other/0");
    char pub[41], sec[41];
    CHECK(zmq_curve_keypair(pub, sec) == 0);
    zmq_setsockopt(other, ZMQ_CURVE_PUBLICKEY, pub, 41);
    zmq_setsockopt(other, ZMQ_CURVE_SECRETKEY, sec, 41);
    void *wrong_server = foreign(ZMQ_DEALER, "wrong/0");
    zmq_setsockopt(wrong_server, ZMQ_CURVE_SERVERKEY, pub, 41);
    void *peers[] = {plain, other, wrong_server};
    for (int i = 0; i < 3; i++) {
        CHECK(zmq_connect(peers[i], ep) == 0);
        send_hello(peers[i], MMP_CTL_VERSION, token, 10 + i, ZMQ_DONTWAIT);
    }
    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    double t0 = now_ms();
    while (mmp_ctl_get_stats(r).refused < 3 && now_ms() - t0 < 5000) {
        CHECK(mmp_ctl_recv(r, 100, &got, from, sizeof from) == MMP_ERR_TIMEOUT);
        mmp_ctl_free(got);
        got = NULL;
    }
    mmp_ctl_stats st = mmp_ctl_get_stats(r);
    CHECK(st.refused >= 3 && st.received == 0 && st.rejected == 0);
    if (st.refused < 3) {
        fprintf(stderr, "  refused %ld handshakes, want 3\n", st.refused);
    }
    void *good = foreign(ZMQ_DEALER, "foreign/0");
    CHECK(zmq_connect(good, ep) == 0);
    mmp_ctl_stats want = mmp_ctl_get_stats(r);
    expect_valid(r, good, 99, &want);
    for (int i = 0; i < 3; i++) {
        zmq_close(peers[i]);
    }
    zmq_close(good);
    mmp_ctl_close(r);
    /* keys that are not keys */
    mmp_ctl_keys bad = keys;
    strcpy(bad.client_secret, "short");
    mmp_ctl *d = NULL;
    mmp_ctl_opts o = {.curve = &bad, .watch_fd = -1};
    CHECK(mmp_ctl_connect_opts(&d, ep, "x/0", token, &o) == MMP_ERR_INVALID && !d);
}

static atomic_int lost_calls;
static double lost_at;
static char lost_why[512];
static void on_lost(const char *why, void *arg)
{
    (void)arg;
    lost_at = now_ms();
    snprintf(lost_why, sizeof lost_why, "%s", why);
    atomic_fetch_add(&lost_calls, 1);
}

/* The launcher's pipe closing (ssh or the coordinator ended) is news at once. */
static void test_lost_on_pipe_eof(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    const char *ep = endpoint("eof");
    mmp_ctl *r = NULL, *d = NULL;
    CHECK_OK(bind_ctl(&r, ep, token));
    mmp_ctl_opts o = {.curve = &keys, .watch_fd = fds[0], .lost = on_lost};
    atomic_store(&lost_calls, 0);
    CHECK_OK(mmp_ctl_connect_opts(&d, ep, "image.0/0", token, &o));
    CHECK(write(fds[1], "keepalive\n", 10) == 10); /* data is not an end */
    usleep(300 * 1000);
    CHECK(atomic_load(&lost_calls) == 0);
    double t0 = now_ms();
    close(fds[1]);
    while (!atomic_load(&lost_calls) && now_ms() - t0 < 3000) {
        usleep(10 * 1000);
    }
    CHECK(atomic_load(&lost_calls) == 1 && lost_at - t0 < 1000);
    CHECK(strstr(lost_why, "pipe closed") != NULL);
    mmp_ctl_close(d);
    mmp_ctl_close(r);
    close(fds[0]);
}

/* A forwarder between a stage and its coordinator that can go silent, as a
 * link that is down: bytes stop, nothing is closed. */
static atomic_int proxy_silent, proxy_stop;
static int proxy_listen_fd, proxy_target_port;

static void *proxy_main(void *arg)
{
    (void)arg;
    int a = accept(proxy_listen_fd, NULL, NULL);
    int b = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)proxy_target_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (a < 0 || connect(b, (struct sockaddr *)&to, sizeof to) != 0) {
        goto out;
    }
    while (!atomic_load(&proxy_stop)) {
        if (atomic_load(&proxy_silent)) {
            usleep(20 * 1000);
            continue;
        }
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        if (poll(p, 2, 20) <= 0) {
            continue;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].revents & (POLLIN | POLLHUP)) {
                char buf[65536];
                ssize_t n = read(p[i].fd, buf, sizeof buf);
                if (n <= 0) {
                    goto out;
                }
                if (write(i ? a : b, buf, (size_t)n) != n) {
                    goto out;
                }
            }
        }
    }
out:
    while (!atomic_load(&proxy_stop)) {
        usleep(20 * 1000);
    }
    if (a >= 0) {
        close(a);
    }
    close(b);
    return NULL;
}

/* A silent link (no bytes either way, no close): the stage's heartbeats go
 * unanswered and it calls lost within MMP_CTL_LOST_S seconds. */
static void test_lost_on_silent_link(void)
{
    int port = mmp_test_free_port();
    char ep[64], via[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    mmp_ctl *r = NULL, *d = NULL;
    mmp_ctl_opts server = {.curve = &keys, .watch_fd = -1};
    CHECK_OK(mmp_ctl_bind_opts(&r, ep, token, &server));
    proxy_target_port = port;
    proxy_listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    CHECK(bind(proxy_listen_fd, (struct sockaddr *)&a, sizeof a) == 0 &&
          listen(proxy_listen_fd, 1) == 0 &&
          getsockname(proxy_listen_fd, (struct sockaddr *)&a, &len) == 0);
    snprintf(via, sizeof via, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
    atomic_store(&proxy_silent, 0);
    atomic_store(&proxy_stop, 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, proxy_main, NULL) == 0);
    mmp_ctl_opts o = {.curve = &keys, .watch_fd = -1, .lost = on_lost};
    atomic_store(&lost_calls, 0);
    CHECK_OK(mmp_ctl_connect_opts(&d, via, "image.0/0", token, &o));
    /* a round trip through the forwarder: connected and authenticated */
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Ready ready = MMPIPE__READY__INIT;
    env.body_case = MMPIPE__ENVELOPE__BODY_READY;
    env.ready = &ready;
    CHECK_OK(mmp_ctl_send(d, NULL, &env));
    Mmpipe__Envelope *got = NULL;
    char from[MMP_CTL_ID_MAX];
    CHECK_OK(mmp_ctl_recv(r, 3000, &got, from, sizeof from));
    mmp_ctl_free(got);
    sleep(2); /* heartbeats flow: no loss while the link is up */
    CHECK(atomic_load(&lost_calls) == 0);
    CHECK(mmp_ctl_peer_dropped_s(r, "image.0/0") < 0);
    CHECK(mmp_ctl_peer_dropped_s(r, "text.0/0") < 0); /* never heard from */
    double t0 = now_ms(), r_dropped = -1;
    atomic_store(&proxy_silent, 1);
    /* both ends: the stage calls lost, the coordinator sees the peer's
     * connection dropped (what it names a lost stage by) */
    while ((!atomic_load(&lost_calls) || r_dropped < 0) &&
           now_ms() - t0 < (MMP_CTL_LOST_S + 4) * 1000.0) {
        usleep(20 * 1000);
        if (r_dropped < 0 && mmp_ctl_peer_dropped_s(r, "image.0/0") >= 0) {
            r_dropped = (now_ms() - t0) / 1000;
        }
    }
    double dt = (lost_at - t0) / 1000;
    CHECK(atomic_load(&lost_calls) == 1 && dt <= MMP_CTL_LOST_S);
    CHECK(strstr(lost_why, "lost the coordinator") != NULL);
    CHECK(r_dropped >= 0 && r_dropped <= MMP_CTL_LOST_S);
    CHECK(mmp_ctl_peer_dropped_s(r, "text.0/0") < 0);
    fprintf(stderr,
            "  silent link noticed after %.1f s by the stage (%s), %.1f s by the coordinator "
            "(bound %d s)\n",
            atomic_load(&lost_calls) ? dt : -1.0, lost_why, r_dropped, MMP_CTL_LOST_S);
    mmp_ctl_close(d);
    mmp_ctl_close(r);
    atomic_store(&proxy_stop, 1);
    pthread_join(th, NULL);
    close(proxy_listen_fd);
}

/* The coordinator's view of a stage's connection: standing while it lives,
 * dropped once it closes (a dead process: the same event as heartbeats
 * going unanswered), standing again when a process under the same name
 * connects and sends (a restart; its connection often gets the dropped
 * one's descriptor number, which must not keep it dropped). */
static void test_peer_dropped_and_back(void)
{
    int port = mmp_test_free_port();
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    mmp_ctl *r = NULL;
    mmp_ctl_opts server = {.curve = &keys, .watch_fd = -1};
    CHECK_OK(mmp_ctl_bind_opts(&r, ep, token, &server));
    mmp_ctl_opts o = {.curve = &keys, .watch_fd = -1};
    Mmpipe__Envelope env = MMPIPE__ENVELOPE__INIT;
    Mmpipe__Ready ready = MMPIPE__READY__INIT;
    env.body_case = MMPIPE__ENVELOPE__BODY_READY;
    env.ready = &ready;
    for (int round = 0; round < 3; round++) {
        mmp_ctl *d = NULL;
        CHECK_OK(mmp_ctl_connect_opts(&d, ep, "text.0/0", token, &o));
        CHECK_OK(mmp_ctl_send(d, NULL, &env));
        Mmpipe__Envelope *got = NULL;
        char from[MMP_CTL_ID_MAX];
        CHECK_OK(mmp_ctl_recv(r, 3000, &got, from, sizeof from));
        mmp_ctl_free(got);
        CHECK(mmp_ctl_peer_dropped_s(r, "text.0/0") < 0);
        usleep(300 * 1000);
        CHECK(mmp_ctl_peer_dropped_s(r, "text.0/0") < 0);
        mmp_ctl_close(d);
        double t0 = now_ms();
        while (mmp_ctl_peer_dropped_s(r, "text.0/0") < 0 && now_ms() - t0 < 3000) {
            usleep(10 * 1000);
        }
        CHECK(mmp_ctl_peer_dropped_s(r, "text.0/0") >= 0);
    }
    mmp_ctl_close(r);
}

/* Each shared case once more, over tcp with CURVE. */
#define OVER_TCP(fn)                                                                               \
    static void fn##_tcp(void)                                                                     \
    {                                                                                              \
        over_tcp = 1;                                                                              \
        fn();                                                                                      \
        over_tcp = 0;                                                                              \
    }
OVER_TCP(test_round_trip)
OVER_TCP(test_limits_and_misuse)
OVER_TCP(test_untrusted_router)
OVER_TCP(test_untrusted_dealer)
OVER_TCP(test_timeouts)
OVER_TCP(test_close_does_not_hang)
OVER_TCP(test_curve_refuses)
OVER_TCP(test_lost_on_pipe_eof)

static const mmp_test_case cases[] = {
    MMP_TEST_CASE(test_new_token),
    MMP_TEST_CASE(test_heartbeat_progress),
    MMP_TEST_CASE(test_printed_text),
    MMP_TEST_CASE(test_ipc_other_user),
    MMP_TEST_CASE(test_round_trip),
    MMP_TEST_CASE(test_limits_and_misuse),
    MMP_TEST_CASE(test_untrusted_router),
    MMP_TEST_CASE(test_untrusted_dealer),
    MMP_TEST_CASE(test_timeouts),
    MMP_TEST_CASE(test_close_does_not_hang),
    MMP_TEST_CASE(test_round_trip_tcp),
    MMP_TEST_CASE(test_limits_and_misuse_tcp),
    MMP_TEST_CASE(test_untrusted_router_tcp),
    MMP_TEST_CASE(test_untrusted_dealer_tcp),
    MMP_TEST_CASE(test_timeouts_tcp),
    MMP_TEST_CASE(test_close_does_not_hang_tcp),
    MMP_TEST_CASE(test_curve_refuses_tcp),
    MMP_TEST_CASE(test_lost_on_pipe_eof_tcp),
    MMP_TEST_CASE(test_lost_on_silent_link),
    MMP_TEST_CASE(test_peer_dropped_and_back),
};

int main(int argc, char **argv)
{
    mmp_log_set_name("test_control");
    zctx = zmq_ctx_new();
    CHECK_OK(mmp_ctl_new_token(token));
    if (!zmq_has("curve")) {
        fprintf(stderr, "test_control: this libzmq has no CURVE; mmpipe needs it for tcp\n");
        return 1;
    }
    CHECK_OK(mmp_ctl_new_keys(&keys));
    int rc = MMP_TEST_MAIN("test_control", cases, argc, argv);
    zmq_ctx_term(zctx);
    return rc;
}
