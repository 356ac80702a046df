/* The conformance suite for data-channel transports (transport/channel.h):
 * one table, every transport of the build (shm and tcp always; cuda_ipc in a
 * CUDA build), every case runnable alone by name ("shm/ordered", --list).
 *
 * Network transports (tcp, over loopback here): a creator listens on port 0
 * and publishes the port it got (mmp_channel_address) through the shared
 * page, where its connector picks it up; "no creator" cases use a port this
 * process holds bound and never listens on; names in /dev/shm are not
 * theirs to check; the forged-headers case plays the hostile peer with a
 * raw socket speaking transport/tcp.h's wire; tcp/idle-strangers opens 34
 * silent connections before the real connector; tcp/host-lost (root and ip(8),
 * ~20 s) puts the two ends in two network namespaces and takes one's link
 * down.
 *
 * The two ends run in two processes (fork) unless a case says otherwise; one
 * run also puts them in two threads of one process. Each end's body returns
 * the number of problems it found (printing the first few), so the same body
 * works in a child process (its exit status) and in a thread. Payload bytes
 * are written and read through the channel (mmp_channel_fill/read), so the
 * same bodies check host and device slots.
 *
 * Device transports (caps MMP_TRANSPORT_DEVICE_SLOTS): this process never
 * calls CUDA (a probe child counts the devices), because a CUDA context does
 * not survive fork and cudaIpcOpenMemHandle refuses a handle from its own
 * process; both ends run in children, there is no thread run, and the cases
 * that need both ends in one process (mismatch, no-creator, forged-headers)
 * are covered by their processes-apart twins, which run on every transport.
 * Their cases are skipped (noted, not failed) when no device is visible, so
 * the suite still judges shm. Device-only cases (own streams, two devices,
 * no host synchronisation, mmp_channel_open's on_gpu choice) are guarded by
 * the capability. Known gap (transport/cuda/cuda_ipc.c): after a device
 * creator dies, the slots it posted are delivered but not read.
 *
 * The cuda_ipc cases skip without a GPU; they passed on an H100 (both
 * MMP_CIPC_SYNC modes; scripts/gpu-check runs them). On a GPU machine:
 *   cmake -S . -B build -DMMP_CUDA=ON && cmake --build build -j
 *   build/tests/test_transport          (or: ctest --test-dir build -R test_transport)
 *   build/tests/test_transport cuda_ipc/no-host-sync    (one case)
 *
 * Every name a case creates starts with "/mmpipe-test-<pid>-"; after each
 * case /dev/shm must hold none of them, including after a peer was SIGKILLed.
 * SIGALRM is the watchdog: a hang fails the test instead of stalling ctest. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/harness.h"
#include "tests/transport_msgs.h"
#include "transport/channel.h"
#include "transport/auth.h"
#include "transport/sock.h"
#include "transport/tcp.h"

#ifdef MMP_HAVE_CUDA
#include <cuda_runtime_api.h>

/* A CUDA call in a test body: a failure is a problem, and the body stops. */
#define CU(count, call)                                                                            \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            PROBLEM(count, "%s: %s", #call, cudaGetErrorString(ce_));                              \
            return count;                                                                          \
        }                                                                                          \
    } while (0)
#endif

/* ---- names and /dev/shm ------------------------------------------------- */

static char prefix[64];    /* "/mmpipe-test-<pid>-" */
static int n_devices = -1; /* CUDA devices a child sees; -1 until probed */
static int next_name;

static const char *fresh_address(char *buf, size_t n)
{
    snprintf(buf, n, "%s%d", prefix, next_name++);
    return buf;
}

static int leftovers(const char *p)
{
    return mmp_test_shm_count(p, 0);
}

/* A network transport (tcp): "host:port" addresses, no /dev/shm names; its
 * creator listens on a port of its own choosing and reports it. */
static int network(const mmp_transport *t)
{
    return (t->caps & MMP_TRANSPORT_NETWORK) != 0;
}

/* A fresh address for a creator of t: a new shm name, or the loopback
 * host with port 0 (the creator reports the port it got). */
static const char *address_for(const mmp_transport *t, char *buf, size_t n)
{
    if (network(t)) {
        snprintf(buf, n, "127.0.0.1:0");
        return buf;
    }
    return fresh_address(buf, n);
}

/* An address where no creator is, nor will be: a fresh shm name, or a
 * loopback port this process holds bound and never listens on (a connect is
 * refused for as long as the test runs). */
static const char *dead_address(const mmp_transport *t, char *buf, size_t n)
{
    static int held = -1;
    static int port;
    if (!network(t)) {
        return fresh_address(buf, n);
    }
    if (held < 0) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t l = sizeof a;
        held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (held < 0 || bind(held, (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(held, (struct sockaddr *)&a, &l) != 0) {
            fprintf(stderr, "dead_address: %s\n", strerror(errno));
            exit(1);
        }
        port = ntohs(a.sin_port);
    }
    snprintf(buf, n, "127.0.0.1:%d", port);
    return buf;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static mmp_channel_cfg make_cfg(const char *address, size_t slot_bytes, int slots, int send,
                                int timeout_ms)
{
    mmp_channel_cfg c = {.address = address,
                         .slot_bytes = slot_bytes,
                         .slots = slots,
                         .send = send,
                         .timeout_ms = timeout_ms,
                         .secret = MMP_TEST_SECRET};
    return c;
}

/* ---- payload bytes, always through the transport ------------------------ */

/* Writes message k's pattern into the acquired slot at `slot` with
 * mmp_channel_fill (host or device slots alike). */
static mmp_err put_pattern(mmp_channel *ch, void *slot, size_t bytes, uint64_t k)
{
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        return MMP_ERR_NOMEM;
    }
    fill(buf, bytes, k);
    mmp_err e = mmp_channel_fill(ch, slot, buf, bytes);
    free(buf);
    return e;
}

/* first_bad() of a received payload, read out with mmp_channel_read; 0 when
 * the read fails (so a failed read never passes as a good payload of n > 0). */
static size_t payload_bad(mmp_channel *ch, const void *payload, size_t bytes, uint64_t k)
{
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        return 0;
    }
    size_t at = mmp_channel_read(ch, buf, payload, bytes) == MMP_OK ? first_bad(buf, bytes, k) : 0;
    free(buf);
    return at;
}

/* ---- two ends ----------------------------------------------------------- */

/* State shared by both ends: an anonymous MAP_SHARED page, so it works
 * across fork as well as between threads. */
typedef struct shared {
    _Atomic int flag[4];
    _Atomic int connected;
    /* The creator's address as it reports it (mmp_channel_address): network
     * transports listen on a port of their own choosing. */
    _Atomic int addr_ready;
    char addr[96];
} shared;

typedef struct side side;
struct side {
    const mmp_transport *t;
    mmp_channel_cfg cfg;
    int creator;
    int n;       /* messages (or what the body makes of it) */
    int streams; /* device transports: an own non-blocking stream, async copies */
    int opens;   /* 1: the body opens its channel(s) itself (ch is NULL) */
    shared *sh;
    int (*body)(side *s, mmp_channel *ch);
    int problems;  /* thread mode: the result */
    char addr[96]; /* cfg.address, when pair() named it */
};

/* Device transports: a CUDA context does not survive fork and
 * cudaIpcOpenMemHandle refuses a handle from its own process, so their ends
 * always run in children of a process that never called CUDA itself. */
static int device(const mmp_transport *t)
{
    return (t->caps & MMP_TRANSPORT_DEVICE_SLOTS) != 0;
}

/* The sending and the receiving end of one channel: cfg's geometry, opposite
 * directions; the creator is the sender when creator_sends. */
static void make_ends(side *snd, side *rcv, const mmp_transport *t, mmp_channel_cfg cfg,
                      int creator_sends, int n, shared *sh)
{
    cfg.on_gpu = device(t);
    if (sh) {
        atomic_store(&sh->addr_ready, 0);
    }
    *snd = (side){.t = t, .cfg = cfg, .creator = creator_sends, .n = n, .sh = sh};
    *rcv = *snd;
    snd->cfg.send = 1;
    rcv->cfg.send = 0;
    rcv->creator = !creator_sends;
}

/* make_ends on a fresh address with a cfg of this geometry (timeout_ms for
 * blocking calls), with the two ends' bodies. */
static void pair(side *snd, side *rcv, const mmp_transport *t, size_t slot_bytes, int slots,
                 int timeout_ms, int creator_sends, int n, shared *sh,
                 int (*snd_body)(side *, mmp_channel *), int (*rcv_body)(side *, mmp_channel *))
{
    char addr[96];
    address_for(t, addr, sizeof addr);
    make_ends(snd, rcv, t, make_cfg(addr, slot_bytes, slots, 1, timeout_ms), creator_sends, n, sh);
    snprintf(snd->addr, sizeof snd->addr, "%s", addr);
    snprintf(rcv->addr, sizeof rcv->addr, "%s", addr);
    snd->cfg.address = snd->addr;
    rcv->cfg.address = rcv->addr;
    snd->body = snd_body;
    rcv->body = rcv_body;
}

/* A creator tells its connector where it is (its reported address). */
static void publish(side *s, const mmp_channel *ch)
{
    snprintf(s->addr, sizeof s->addr, "%s", mmp_channel_address(ch));
    s->cfg.address = s->addr;
    snprintf(s->sh->addr, sizeof s->sh->addr, "%s", s->addr);
    atomic_store(&s->sh->addr_ready, 1);
}

/* A connector given port 0 learns its creator's real address (publish); at
 * most 20 s, then it goes on with port 0 and fails. */
static void resolve(side *s)
{
    size_t n = s->cfg.address ? strlen(s->cfg.address) : 0;
    if (!network(s->t) || n < 2 || strcmp(s->cfg.address + n - 2, ":0") != 0) {
        return;
    }
    for (int i = 0; i < 20000 && !atomic_load(&s->sh->addr_ready); i++) {
        sleep_ms(1);
    }
    if (atomic_load(&s->sh->addr_ready)) {
        snprintf(s->addr, sizeof s->addr, "%s", s->sh->addr);
        s->cfg.address = s->addr;
    }
}

static int side_run(side *s)
{
    int problems = 0;
#ifdef MMP_HAVE_CUDA
    cudaStream_t st = NULL;
    if (device(s->t)) {
        /* This process's first CUDA use. */
        CU(problems, cudaSetDevice(s->cfg.device));
        if (s->streams) {
            CU(problems, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            s->cfg.cuda_stream = st;
        }
    }
#endif
    if (s->opens) {
        problems += s->body(s, NULL);
    } else {
        mmp_channel *ch = NULL;
        if (!s->creator) {
            resolve(s);
        }
        mmp_err e = mmp_channel_open_with(&ch, s->t, &s->cfg, s->creator);
        if (e != MMP_OK) {
            PROBLEM(problems, "%s %s: %s: %s", s->t->name, s->creator ? "setup" : "connect",
                    mmp_err_name(e), mmp_last_error());
        } else {
            if (s->creator) {
                publish(s, ch);
            }
            atomic_store(&s->sh->connected, 1);
            problems += s->body(s, ch);
            mmp_channel_close(ch);
        }
    }
#ifdef MMP_HAVE_CUDA
    if (st) {
        cudaStreamDestroy(st);
    }
#endif
    return problems;
}

static void *side_thread(void *arg)
{
    side *s = arg;
    s->problems = side_run(s);
    return NULL;
}

static pid_t spawn(side *s)
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        _exit(side_run(s) ? 1 : 0);
    }
    return pid;
}

/* Both ends in children; how many of them failed. A `b_dies` end must end by
 * SIGKILL (it raises it itself). */
static int run_ends(side *a, side *b, int b_dies)
{
    pid_t pa = spawn(a), pb = spawn(b);
    int sa = 0, sb = 0, bad = 0;
    if (pa < 0 || pb < 0) {
        return 1;
    }
    waitpid(pa, &sa, 0);
    waitpid(pb, &sb, 0);
    if (!WIFEXITED(sa) || WEXITSTATUS(sa) != 0) {
        fprintf(stderr, "  end pid %d failed: status %#x\n", (int)pa, sa);
        bad++;
    }
    if (b_dies ? !(WIFSIGNALED(sb) && WTERMSIG(sb) == SIGKILL)
               : (!WIFEXITED(sb) || WEXITSTATUS(sb) != 0)) {
        fprintf(stderr, "  end pid %d: status %#x, want %s\n", (int)pb, sb,
                b_dies ? "SIGKILL" : "exit 0");
        bad++;
    }
    return bad;
}

/* Runs one body in a child, then another in a second child, in turn. */
static int run_in_turn(side *first, int first_dies, side *second)
{
    pid_t p = spawn(first);
    int st = 0, bad = 0;
    waitpid(p, &st, 0);
    if (first_dies ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                   : (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
        fprintf(stderr, "  end pid %d: status %#x\n", (int)p, st);
        bad++;
    }
    p = spawn(second);
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "  end pid %d: status %#x\n", (int)p, st);
        bad++;
    }
    return bad;
}

/* Runs a here and b in a child process (or a thread); the problems of both.
 * Device transports run both in children (and never in threads). */
static int run_pair(side *a, side *b, int threads)
{
    if (device(a->t)) {
        return run_ends(a, b, 0);
    }
    if (threads) {
        pthread_t th;
        if (pthread_create(&th, NULL, side_thread, b) != 0) {
            return 1;
        }
        int pa = side_run(a);
        pthread_join(th, NULL);
        return pa + b->problems;
    }
    pid_t pid = spawn(b);
    if (pid < 0) {
        return 1;
    }
    int pa = side_run(a);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "  the other end (pid %d) failed: status %#x\n", (int)pid, st);
        pa++;
    }
    return pa;
}

static shared *new_shared(void)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "mmap: %s\n", strerror(errno));
        exit(1);
    }
    memset(sh, 0, sizeof *sh);
    return sh;
}

static void wait_flag(shared *sh, int i, int value)
{
    while (atomic_load(&sh->flag[i]) < value) {
        sleep_ms(1);
    }
}

/* 1 (and a note) when case `what` needs both ends in this one process, which
 * a device transport cannot give it; its processes-apart twin covers t. */
static int same_process_only(const mmp_transport *t, const char *what)
{
    if (device(t)) {
        fprintf(stderr, "  %s %s: both ends in one process, left to its processes-apart twin\n",
                t->name, what);
        return 1;
    }
    return 0;
}

/* ---- (1) ordered delivery ----------------------------------------------- */

static int send_ordered(side *s, mmp_channel *ch)
{
    int bad = 0;
    size_t sb = s->cfg.slot_bytes;
    unsigned char *src = malloc(sb ? sb : 1);
    for (int k = 0; k < s->n && src; k++) {
        mmp_msg_header h = message(k, sb);
        mmp_err e;
        if (k % 2) {
            /* The copying helper, for half of them. */
            fill(src, h.bytes, (uint64_t)k);
            e = mmp_channel_send(ch, &h, src);
        } else {
            void *p = NULL;
            e = mmp_channel_acquire(ch, &p);
            if (e == MMP_OK) {
                e = put_pattern(ch, p, h.bytes, (uint64_t)k);
            }
            if (e == MMP_OK) {
                e = mmp_channel_post(ch, &h);
            }
        }
        if (e != MMP_OK) {
            PROBLEM(bad, "send %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
            break;
        }
    }
    free(src);
    return bad;
}

static int recv_ordered(side *s, mmp_channel *ch)
{
    int bad = 0;
    size_t sb = s->cfg.slot_bytes;
    for (int k = 0; k < s->n; k++) {
        mmp_msg_header h, want = message(k, sb);
        const void *p = NULL;
        mmp_err e = mmp_channel_recv(ch, &h, &p);
        if (e != MMP_OK) {
            PROBLEM(bad, "recv %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
            return bad;
        }
        if (!same_header(&h, &want)) {
            PROBLEM(bad, "message %d: header step %d mb %d bytes %llu, want %d %d %llu", k, h.step,
                    h.mb, (unsigned long long)h.bytes, want.step, want.mb,
                    (unsigned long long)want.bytes);
        }
        size_t at = payload_bad(ch, p, h.bytes, (uint64_t)k);
        if (at != h.bytes) {
            PROBLEM(bad, "message %d: payload differs at byte %zu of %llu", k, at,
                    (unsigned long long)h.bytes);
        }
        e = mmp_channel_release(ch);
        if (e != MMP_OK) {
            PROBLEM(bad, "release %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
        }
    }
    /* The sender closes after its last post: the next recv reports it. */
    mmp_msg_header h;
    const void *p;
    mmp_err e = mmp_channel_recv(ch, &h, &p);
    if (e != MMP_ERR_PEER) {
        PROBLEM(bad, "recv after the sender closed: %s, want peer", mmp_err_name(e));
    }
    return bad;
}

static void test_ordered(const mmp_transport *t)
{
    char addr[96];
    shared *sh = new_shared();
    struct {
        int slots, creator_sends, threads;
    } runs[] = {{1, 1, 0}, {2, 0, 0}, {4, 1, 0}, {2, 1, 1}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (runs[r].threads && device(t)) {
            continue; /* one process cannot import its own device slots */
        }
        address_for(t, addr, sizeof addr);
        size_t sb = 3000; /* not a multiple of 64 */
        side snd, rcv;
        make_ends(&snd, &rcv, t, make_cfg(addr, sb, runs[r].slots, 1, 10000), runs[r].creator_sends,
                  1000, sh);
        snd.body = send_ordered;
        rcv.body = recv_ordered;
        /* The receiver runs here so its problems are counted here too. */
        int problems = run_pair(&rcv, &snd, runs[r].threads);
        if (problems) {
            fprintf(stderr, "  ordered: slots=%d creator %s, %s\n", runs[r].slots,
                    runs[r].creator_sends ? "sends" : "receives",
                    runs[r].threads ? "threads" : "processes");
        }
        CHECK(problems == 0);
    }
    munmap(sh, sizeof *sh);
}

/* ---- (2) credits -------------------------------------------------------- */

#define HOLD_MS 200

static int send_credit(side *s, mmp_channel *ch)
{
    int bad = 0;
    void *p;
    for (int k = 0; k < 2; k++) {
        mmp_msg_header h = message(k, 64);
        if (mmp_channel_acquire(ch, &p) != MMP_OK || mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "send %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    /* Both slots are in flight: the third acquire must wait for a release. */
    double t0 = now_ms();
    mmp_err e = mmp_channel_acquire(ch, &p);
    double waited = now_ms() - t0;
    if (e != MMP_OK) {
        PROBLEM(bad, "third acquire: %s: %s", mmp_err_name(e), mmp_last_error());
        return bad;
    }
    if (!atomic_load(&s->sh->flag[0])) {
        PROBLEM(bad, "third acquire returned before the receiver released a slot");
    }
    if (waited < HOLD_MS * 0.5) {
        PROBLEM(bad, "third acquire waited %.1f ms, the receiver held the slots %d ms", waited,
                HOLD_MS);
    }
    mmp_msg_header h = message(2, 64);
    if (mmp_channel_post(ch, &h) != MMP_OK) {
        PROBLEM(bad, "post 2: %s", mmp_last_error());
    }
    return bad;
}

static int recv_credit(side *s, mmp_channel *ch)
{
    int bad = 0;
    mmp_msg_header h;
    const void *p[3];
    /* Holding two slots at once is allowed; releases free the oldest. */
    for (int k = 0; k < 2; k++) {
        if (mmp_channel_recv(ch, &h, &p[k]) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    sleep_ms(HOLD_MS);
    atomic_store(&s->sh->flag[0], 1);
    if (mmp_channel_release(ch) != MMP_OK || mmp_channel_release(ch) != MMP_OK) {
        PROBLEM(bad, "release: %s", mmp_last_error());
    }
    mmp_msg_header want = message(2, 64);
    if (mmp_channel_recv(ch, &h, &p[2]) != MMP_OK || !same_header(&h, &want)) {
        PROBLEM(bad, "recv 2: %s", mmp_last_error());
    } else if (p[2] != p[0]) {
        PROBLEM(bad, "message 2 is not in slot 0");
    }
    mmp_channel_release(ch);
    return bad;
}

/* A live receiver that never releases: acquire gives up after timeout_ms. */
static int send_timeout(side *s, mmp_channel *ch)
{
    int bad = 0;
    void *p;
    mmp_msg_header h = message(0, 64);
    if (mmp_channel_acquire(ch, &p) != MMP_OK || mmp_channel_post(ch, &h) != MMP_OK) {
        PROBLEM(bad, "send 0: %s", mmp_last_error());
    }
    wait_flag(s->sh, 1, 1); /* the receiver holds it */
    double t0 = now_ms();
    mmp_err e = mmp_channel_acquire(ch, &p);
    double waited = now_ms() - t0;
    if (e != MMP_ERR_PEER || waited < 190 || waited >= 1000) {
        PROBLEM(bad, "acquire with no credit: %s after %.0f ms, want peer after ~200 ms",
                mmp_err_name(e), waited);
    }
    atomic_store(&s->sh->flag[2], 1);
    return bad;
}

static int recv_hold(side *s, mmp_channel *ch)
{
    int bad = 0;
    mmp_msg_header h;
    const void *p;
    if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
        PROBLEM(bad, "recv: %s", mmp_last_error());
    }
    atomic_store(&s->sh->flag[1], 1);
    wait_flag(s->sh, 2, 1);
    return bad;
}

static void test_credit(const mmp_transport *t)
{
    shared *sh = new_shared();
    side snd, rcv;
    pair(&snd, &rcv, t, 64, 2, 10000, 1, 3, sh, send_credit, recv_credit);
    CHECK(run_pair(&snd, &rcv, 0) == 0);

    /* A live receiver that never releases: acquire gives up after timeout_ms. */
    pair(&snd, &rcv, t, 64, 1, 200, 1, 1, sh, send_timeout, recv_hold);
    CHECK(run_pair(&snd, &rcv, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (3) zero-copy ------------------------------------------------------ */

#define ZC_SLOTS 3
#define ZC_BYTES 1000

static int check_slot_pointers(const char *who, const void *const *ptr, int n)
{
    int bad = 0;
    for (int k = 0; k < n; k++) {
        if ((uintptr_t)ptr[k] % 64) {
            PROBLEM(bad, "%s: payload of message %d at %p is not 64-byte aligned", who, k, ptr[k]);
        }
        if (k >= ZC_SLOTS && ptr[k] != ptr[k % ZC_SLOTS]) {
            PROBLEM(bad, "%s: message %d at %p, slot %d was at %p", who, k, ptr[k], k % ZC_SLOTS,
                    ptr[k % ZC_SLOTS]);
        }
    }
    for (int i = 0; i < ZC_SLOTS; i++) {
        for (int j = 0; j < i; j++) {
            intptr_t d = (const char *)ptr[i] - (const char *)ptr[j];
            if ((d < 0 ? -d : d) < ZC_BYTES) {
                PROBLEM(bad, "%s: slots %d and %d overlap (%p, %p)", who, i, j, ptr[i], ptr[j]);
            }
        }
    }
    return bad;
}

static int send_zc(side *s, mmp_channel *ch)
{
    (void)s;
    int bad = 0;
    const void *ptr[12];
    for (int k = 0; k < 12; k++) {
        void *p;
        mmp_msg_header h = message(k, ZC_BYTES);
        if (mmp_channel_acquire(ch, &p) != MMP_OK) {
            PROBLEM(bad, "acquire %d: %s", k, mmp_last_error());
            return bad;
        }
        ptr[k] = p;
        if (put_pattern(ch, p, h.bytes, (uint64_t)k) != MMP_OK ||
            mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "post %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    return bad + check_slot_pointers("sender", ptr, 12);
}

static int recv_zc(side *s, mmp_channel *ch)
{
    (void)s;
    int bad = 0;
    const void *ptr[12];
    for (int k = 0; k < 12; k++) {
        mmp_msg_header h;
        if (mmp_channel_recv(ch, &h, &ptr[k]) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            return bad;
        }
        if (payload_bad(ch, ptr[k], h.bytes, (uint64_t)k) != h.bytes) {
            PROBLEM(bad, "message %d: payload differs", k);
        }
        mmp_channel_release(ch);
    }
    return bad + check_slot_pointers("receiver", ptr, 12);
}

/* pair() in fresh shared memory, run by run (run_pair or run_ends) with the
 * receiver as its first side; its count of problems. */
static int run_one_pair(const mmp_transport *t, size_t slot_bytes, int slots, int timeout_ms,
                        int creator_sends, int n, int (*snd_body)(side *, mmp_channel *),
                        int (*rcv_body)(side *, mmp_channel *), int (*run)(side *, side *, int))
{
    shared *sh = new_shared();
    side snd, rcv;
    pair(&snd, &rcv, t, slot_bytes, slots, timeout_ms, creator_sends, n, sh, snd_body, rcv_body);
    int bad = run(&rcv, &snd, 0);
    munmap(sh, sizeof *sh);
    return bad;
}

static void test_zero_copy(const mmp_transport *t)
{
    CHECK(run_one_pair(t, ZC_BYTES, ZC_SLOTS, 10000, 0, 12, send_zc, recv_zc, run_pair) == 0);
}

/* try_acquire: a producer asks for a slot before it computes and never
 * waits. While the receiver holds both slots the answer is MMP_ERR_TIMEOUT,
 * at once, with nothing acquired (a post is then misuse); once one is
 * released (for tcp: once its credit has crossed the socket) the next try
 * gets that slot, and what was written there in place arrives intact. */
static int send_try(side *s, mmp_channel *ch)
{
    int bad = 0;
    void *p = NULL;
    int host = mmp_channel_host_slots(ch);
    if (host != !(mmp_channel_transport(ch)->caps & MMP_TRANSPORT_DEVICE_SLOTS)) {
        PROBLEM(bad, "mmp_channel_host_slots says %d against the caps", host);
    }
    for (int k = 0; k < 2; k++) {
        mmp_msg_header h = message(k, ZC_BYTES);
        if (mmp_channel_try_acquire(ch, &p) != MMP_OK || !p) {
            PROBLEM(bad, "try_acquire %d with a free slot: %s", k, mmp_last_error());
            return bad;
        }
        if (put_pattern(ch, p, h.bytes, (uint64_t)k) != MMP_OK ||
            mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "post %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    double t0 = now_ms();
    p = (void *)&bad;
    mmp_err e = mmp_channel_try_acquire(ch, &p);
    double took = now_ms() - t0;
    if (e != MMP_ERR_TIMEOUT || p != NULL || took > 100) {
        PROBLEM(bad,
                "try_acquire with no credit: %s, slot %p after %.1f ms (want timeout, NULL, "
                "at once)",
                mmp_err_name(e), p, took);
    }
    mmp_msg_header h2 = message(2, ZC_BYTES);
    if (mmp_channel_post(ch, &h2) != MMP_ERR_INVALID) {
        PROBLEM(bad, "a post after a refused try_acquire is not refused");
    }
    atomic_store(&s->sh->flag[0], 1); /* receiver: take and release message 0 */
    wait_flag(s->sh, 1, 1);
    t0 = now_ms();
    while ((e = mmp_channel_try_acquire(ch, &p)) == MMP_ERR_TIMEOUT && now_ms() - t0 < 5000) {
        sleep_ms(1);
    }
    if (e != MMP_OK || !p) {
        PROBLEM(bad, "try_acquire after a release: %s", mmp_err_name(e));
        return bad;
    }
    if (put_pattern(ch, p, h2.bytes, 2) != MMP_OK || mmp_channel_post(ch, &h2) != MMP_OK) {
        PROBLEM(bad, "post 2: %s", mmp_last_error());
    }
    return bad;
}

static int recv_try(side *s, mmp_channel *ch)
{
    int bad = 0;
    wait_flag(s->sh, 0, 1);
    for (int k = 0; k < 3; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            return bad;
        }
        mmp_msg_header want = message(k, ZC_BYTES);
        if (!same_header(&h, &want) || payload_bad(ch, p, h.bytes, (uint64_t)k) != h.bytes) {
            PROBLEM(bad, "message %d: its header or payload differs", k);
        }
        mmp_channel_release(ch);
        if (k == 0) {
            atomic_store(&s->sh->flag[1], 1);
        }
    }
    return bad;
}

static void test_try_acquire(const mmp_transport *t)
{
    shared *sh = new_shared();
    side snd, rcv;
    pair(&snd, &rcv, t, ZC_BYTES, 2, 10000, 1, 3, sh, send_try, recv_try);
    CHECK(run_pair(&snd, &rcv, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (4) geometry and misuse ------------------------------------------- */

static void test_mismatch(const mmp_transport *t)
{
    if (same_process_only(t, "mismatch")) {
        return;
    }
    char addr[96];
    address_for(t, addr, sizeof addr);
    mmp_channel *a = NULL, *b = NULL;
    mmp_channel_cfg cs = make_cfg(addr, 4096, 2, 1, 1000);
    CHECK_OK(mmp_channel_open_with(&a, t, &cs, 1));
    if (a) {
        snprintf(addr, sizeof addr, "%s", mmp_channel_address(a)); /* tcp: the real port */
    }

    mmp_channel_cfg bad = make_cfg(addr, 4096, 4, 0, 1000);
    CHECK(mmp_channel_open_with(&b, t, &bad, 0) == MMP_ERR_PROTO && b == NULL);
    CHECK(strstr(mmp_last_error(), "2 slots") && strstr(mmp_last_error(), "4 slots"));
    bad = make_cfg(addr, 8192, 2, 0, 1000);
    CHECK(mmp_channel_open_with(&b, t, &bad, 0) == MMP_ERR_PROTO && b == NULL);
    CHECK(strstr(mmp_last_error(), "4096") && strstr(mmp_last_error(), "8192"));
    bad = make_cfg(addr, 4096, 2, 1, 1000); /* both ends send */
    CHECK(mmp_channel_open_with(&b, t, &bad, 0) == MMP_ERR_PROTO && b == NULL);

    /* Failed connects leave the creator usable. */
    mmp_channel_cfg cr = make_cfg(addr, 4096, 2, 0, 1000);
    CHECK_OK(mmp_channel_open_with(&b, t, &cr, 0));
    if (a && b) {
        mmp_msg_header h = message(7, 4096), got;
        unsigned char src[4096];
        const void *p;
        fill(src, h.bytes, 7);
        CHECK_OK(mmp_channel_send(a, &h, src));
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(same_header(&h, &got) && payload_bad(b, p, got.bytes, 7) == got.bytes);
        CHECK_OK(mmp_channel_release(b));

        /* Misuse is an error value, never a crash. */
        void *q;
        CHECK(mmp_channel_release(b) == MMP_ERR_INVALID);        /* nothing held */
        CHECK(mmp_channel_post(a, &h) == MMP_ERR_INVALID);       /* nothing acquired */
        CHECK(mmp_channel_acquire(b, &q) == MMP_ERR_INVALID);    /* receiving end */
        CHECK(mmp_channel_recv(a, &got, &p) == MMP_ERR_INVALID); /* sending end */
        CHECK_OK(mmp_channel_acquire(a, &q));
        CHECK(mmp_channel_acquire(a, &q) == MMP_ERR_INVALID); /* twice */
        mmp_msg_header big = h;
        big.bytes = 4097;
        CHECK(mmp_channel_post(a, &big) == MMP_ERR_INVALID);
        CHECK(mmp_channel_send(a, &big, src) == MMP_ERR_INVALID);
        CHECK(mmp_channel_slot_bytes(a) == 4096 && mmp_channel_slot_bytes(b) == 4096);

        /* A closed receiver fails the sender's acquire at once: well before
         * the channel's 1000 ms timeout (the bar leaves room for a loaded
         * machine; the expected wait is ~0). */
        mmp_channel_close(b);
        b = NULL;
        CHECK_OK(mmp_channel_post(a, &h));
        double t0 = now_ms();
        CHECK(mmp_channel_acquire(a, &q) == MMP_ERR_PEER);
        CHECK(now_ms() - t0 < 400);
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
    mmp_channel_close(NULL);

    mmp_channel_cfg nameless = make_cfg("no-slash", 64, 2, 1, 100);
    CHECK(mmp_channel_open_with(&a, t, &nameless, 1) == MMP_ERR_INVALID && a == NULL);
    address_for(t, addr, sizeof addr);
    mmp_channel_cfg noslots = make_cfg(addr, 64, 0, 1, 100);
    CHECK(mmp_channel_open_with(&a, t, &noslots, 1) == MMP_ERR_INVALID && a == NULL);
}

/* ---- (5) no creator, creator gone -------------------------------------- */

static void test_no_creator(const mmp_transport *t)
{
    if (same_process_only(t, "no-creator")) {
        return;
    }
    char addr[96];
    dead_address(t, addr, sizeof addr);
    mmp_channel *b = NULL;
    mmp_channel_cfg cr = make_cfg(addr, 64, 2, 0, 300);
    double t0 = now_ms();
    mmp_err e = mmp_channel_open_with(&b, t, &cr, 0);
    double waited = now_ms() - t0;
    CHECK(e == MMP_ERR_PEER && b == NULL);
    CHECK(waited >= 290 && waited < 800);

    /* A creator that closes before anyone connects removes its name (a
     * network one stops listening). */
    mmp_channel *a = NULL;
    address_for(t, addr, sizeof addr);
    mmp_channel_cfg cs = make_cfg(addr, 64, 2, 1, 300);
    CHECK_OK(mmp_channel_open_with(&a, t, &cs, 1));
    if (a) {
        snprintf(addr, sizeof addr, "%s", mmp_channel_address(a));
    }
    cr = make_cfg(addr, 64, 2, 0, 300);
    CHECK(network(t) || leftovers(prefix) == 1);
    mmp_channel_close(a);
    CHECK(leftovers(prefix) == 0);
    CHECK(mmp_channel_open_with(&b, t, &cr, 0) == MMP_ERR_PEER && b == NULL);

    /* A creator SIGKILLed before anyone connects: connect reports it, and
     * removes the name the dead creator could not. */
    shared *sh = new_shared();
    address_for(t, addr, sizeof addr);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        mmp_channel_cfg c = make_cfg(addr, 64, 2, 1, 0);
        mmp_channel *x = NULL;
        if (mmp_channel_open_with(&x, t, &c, 1) == MMP_OK) {
            snprintf(sh->addr, sizeof sh->addr, "%s", mmp_channel_address(x));
            raise(SIGKILL);
        }
        _exit(1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    snprintf(addr, sizeof addr, "%s", sh->addr);
    munmap(sh, sizeof *sh);
    cr = make_cfg(addr, 64, 2, 0, 300);
    CHECK(mmp_channel_open_with(&b, t, &cr, 0) == MMP_ERR_PEER && b == NULL);
}

/* ---- (6) a peer dies ---------------------------------------------------- */

static int recv_then_die(side *s, mmp_channel *ch)
{
    (void)s;
    mmp_msg_header h;
    const void *p;
    for (int k = 0; k < 5; k++) {
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK || mmp_channel_release(ch) != MMP_OK) {
            return 1;
        }
    }
    /* Hold one slot, then die without closing. */
    if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
        return 1;
    }
    sleep_ms(100);
    raise(SIGKILL);
    return 1;
}

static int send_until_peer(side *s, mmp_channel *ch)
{
    int bad = 0;
    for (int k = 0; k < 100; k++) {
        void *p;
        mmp_msg_header h = message(k, 256);
        double t0 = now_ms();
        mmp_err e = mmp_channel_acquire(ch, &p);
        double waited = now_ms() - t0;
        if (e == MMP_ERR_PEER) {
            if (k < 6) {
                PROBLEM(bad, "acquire %d: peer error before the receiver died", k);
            }
            if (waited > 1100 + 100) {
                PROBLEM(bad, "acquire %d noticed the dead receiver after %.0f ms", k, waited);
            }
            if (!strstr(mmp_last_error(), s->cfg.address)) {
                PROBLEM(bad, "the error does not name the channel: %s", mmp_last_error());
            }
            return bad;
        }
        if (e != MMP_OK || mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "send %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    PROBLEM(bad, "100 messages to a receiver that died after 6");
    return bad;
}

static int send_then_die(side *s, mmp_channel *ch)
{
    for (int k = 0; k < 3; k++) {
        void *p;
        mmp_msg_header h = message(k, 256);
        if (mmp_channel_acquire(ch, &p) != MMP_OK) {
            return 1;
        }
        if (put_pattern(ch, p, h.bytes, (uint64_t)k) != MMP_OK ||
            mmp_channel_post(ch, &h) != MMP_OK) {
            return 1;
        }
    }
    /* Die only once the receiver is attached, so the death is mid-stream. */
    while (!atomic_load(&s->sh->flag[0])) {
        sleep_ms(1);
    }
    sleep_ms(100);
    raise(SIGKILL);
    return 1;
}

static int recv_until_peer(side *s, mmp_channel *ch)
{
    int bad = 0;
    atomic_store(&s->sh->flag[0], 1);
    for (int k = 0; k < 4; k++) {
        mmp_msg_header h, want = message(k, 256);
        const void *p;
        double t0 = now_ms();
        mmp_err e = mmp_channel_recv(ch, &h, &p);
        double waited = now_ms() - t0;
        if (k < 3) {
            /* Posted before the death: still delivered, in order, intact.
             * Device slots lived in the dead creator's allocation, so their
             * payloads are not read (the known gap of legacy cudaIpc, see
             * transport/cuda/cuda_ipc.c). */
            if (e != MMP_OK || !same_header(&h, &want) ||
                (!device(s->t) && payload_bad(ch, p, h.bytes, (uint64_t)k) != h.bytes)) {
                PROBLEM(bad, "recv %d (posted before the sender died): %s", k, mmp_err_name(e));
            }
            mmp_channel_release(ch);
        } else if (e != MMP_ERR_PEER || waited > 1200) {
            PROBLEM(bad, "recv after the sender died: %s after %.0f ms", mmp_err_name(e), waited);
        }
    }
    return bad;
}

/* Runs `here` in this process and `there` in a child that SIGKILLs itself
 * (device transports: both in children). */
static int run_killed(side *here, side *there)
{
    if (device(here->t)) {
        return run_ends(here, there, 1);
    }
    pid_t pid = spawn(there);
    int problems = side_run(here);
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
        fprintf(stderr, "  the dying end did not die of SIGKILL: status %#x\n", st);
        problems++;
    }
    return problems;
}

static void test_peer_death(const mmp_transport *t)
{
    char addr[96];
    shared *sh = new_shared();
    /* timeout_ms 0: only noticing the death can end the sender's wait. */
    side snd, rcv;
    pair(&snd, &rcv, t, 256, 2, 0, 1, 0, sh, send_until_peer, recv_then_die);
    CHECK(run_killed(&snd, &rcv) == 0);
    CHECK(leftovers(prefix) == 0);

    address_for(t, addr, sizeof addr);
    atomic_store(&sh->flag[0], 0);
    side snd2, rcv2;
    make_ends(&snd2, &rcv2, t, make_cfg(addr, 256, 4, 1, 0), 1, 0, sh);
    snd2.body = send_then_die;
    rcv2.body = recv_until_peer;
    CHECK(run_killed(&rcv2, &snd2) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (5b) the same, each end in its own process ---------------------------
 * Misuse, geometry and role mismatch, no creator and a creator gone, with
 * the two ends in different processes (what device transports need), for
 * every transport. */

static int apart_creator_mismatch(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *a = NULL, *x = NULL;
    mmp_channel_cfg nameless = make_cfg("no-slash", 64, 2, 1, 100);
    if (mmp_channel_open_with(&x, s->t, &nameless, 1) != MMP_ERR_INVALID || x) {
        PROBLEM(bad, "setup without a shm name");
    }
    mmp_channel_cfg noslots = s->cfg;
    noslots.slots = 0;
    if (mmp_channel_open_with(&x, s->t, &noslots, 1) != MMP_ERR_INVALID || x) {
        PROBLEM(bad, "setup with 0 slots");
    }
    if (mmp_channel_open_with(&a, s->t, &s->cfg, 1) != MMP_OK) {
        PROBLEM(bad, "setup: %s", mmp_last_error());
        atomic_store(&s->sh->flag[0], -1000);
        return bad;
    }
    publish(s, a);
    atomic_store(&s->sh->flag[0], 1);
    wait_flag(s->sh, 1, 1); /* the receiver's bad connects are done, it is attached */
    mmp_msg_header h = message(7, 4096), got;
    unsigned char src[4096];
    const void *cp;
    void *q;
    fill(src, h.bytes, 7);
    if (mmp_channel_send(a, &h, src) != MMP_OK) {
        PROBLEM(bad, "send: %s", mmp_last_error());
    }
    if (mmp_channel_post(a, &h) != MMP_ERR_INVALID) {
        PROBLEM(bad, "post with nothing acquired");
    }
    if (mmp_channel_recv(a, &got, &cp) != MMP_ERR_INVALID) {
        PROBLEM(bad, "recv on the sending end");
    }
    if (mmp_channel_acquire(a, &q) != MMP_OK) {
        PROBLEM(bad, "acquire: %s", mmp_last_error());
    }
    if (mmp_channel_acquire(a, &q) != MMP_ERR_INVALID) {
        PROBLEM(bad, "acquire twice");
    }
    mmp_msg_header big = h;
    big.bytes = 4097;
    if (mmp_channel_post(a, &big) != MMP_ERR_INVALID ||
        mmp_channel_send(a, &big, src) != MMP_ERR_INVALID) {
        PROBLEM(bad, "a post larger than the slot");
    }
    if (mmp_channel_slot_bytes(a) != 4096) {
        PROBLEM(bad, "slot_bytes");
    }
    atomic_store(&s->sh->flag[3], 1); /* the checks that need a live receiver are done */
    wait_flag(s->sh, 2, 1);           /* the receiver closed */
    if (mmp_channel_post(a, &h) != MMP_OK) {
        PROBLEM(bad, "post of the acquired slot: %s", mmp_last_error());
    }
    /* At once: well below the channel's 1000 ms timeout (room for a loaded machine). */
    double t0 = now_ms();
    if (mmp_channel_acquire(a, &q) != MMP_ERR_PEER || now_ms() - t0 > 400) {
        PROBLEM(bad, "acquire after the receiver closed is not an immediate peer error");
    }
    mmp_channel_close(a);
    return bad;
}

static int apart_connector_mismatch(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *b = NULL;
    wait_flag(s->sh, 0, 1);
    if (atomic_load(&s->sh->flag[0]) < 0) {
        return 1;
    }
    resolve(s);
    mmp_channel_cfg c = s->cfg;
    c.slots = 4;
    if (mmp_channel_open_with(&b, s->t, &c, 0) != MMP_ERR_PROTO || b ||
        !strstr(mmp_last_error(), "2 slots") || !strstr(mmp_last_error(), "4 slots")) {
        PROBLEM(bad, "4 slots against 2: %s", mmp_last_error());
    }
    c = s->cfg;
    c.slot_bytes = 8192;
    if (mmp_channel_open_with(&b, s->t, &c, 0) != MMP_ERR_PROTO || b ||
        !strstr(mmp_last_error(), "8192")) {
        PROBLEM(bad, "8192 bytes against 4096: %s", mmp_last_error());
    }
    c = s->cfg;
    c.send = 1;
    if (mmp_channel_open_with(&b, s->t, &c, 0) != MMP_ERR_PROTO || b) {
        PROBLEM(bad, "both ends send");
    }
    /* An end that picked shm for a device transport's name is told, not
     * left hanging. */
    c = s->cfg;
    c.on_gpu = 0;
    if (device(s->t) &&
        (mmp_channel_open_with(&b, &mmp_transport_shm, &c, 0) != MMP_ERR_PROTO || b)) {
        PROBLEM(bad, "shm connect to a %s name: %s", s->t->name, mmp_last_error());
    }
    if (mmp_channel_open_with(&b, s->t, &s->cfg, 0) != MMP_OK) {
        PROBLEM(bad, "connect: %s", mmp_last_error());
        atomic_store(&s->sh->flag[1], 1);
        atomic_store(&s->sh->flag[2], 1);
        return bad;
    }
    atomic_store(&s->sh->flag[1], 1);
    mmp_msg_header h, want = message(7, 4096);
    const void *p;
    void *q;
    if (mmp_channel_recv(b, &h, &p) != MMP_OK || !same_header(&h, &want)) {
        PROBLEM(bad, "recv: %s", mmp_last_error());
    } else {
        if (payload_bad(b, p, h.bytes, 7) != h.bytes) {
            PROBLEM(bad, "payload differs");
        }
        if (mmp_channel_release(b) != MMP_OK) {
            PROBLEM(bad, "release: %s", mmp_last_error());
        }
    }
    if (mmp_channel_release(b) != MMP_ERR_INVALID) {
        PROBLEM(bad, "release with nothing held");
    }
    if (mmp_channel_acquire(b, &q) != MMP_ERR_INVALID) {
        PROBLEM(bad, "acquire on the receiving end");
    }
    /* Close only once the sender's checks on a live channel are done: on a
     * loaded machine it may still be acquiring its second slot. */
    wait_flag(s->sh, 3, 1);
    mmp_channel_close(b);
    mmp_channel_close(NULL);
    atomic_store(&s->sh->flag[2], 1);
    return bad;
}

static void test_mismatch_apart(const mmp_transport *t)
{
    shared *sh = new_shared();
    side snd, rcv;
    pair(&snd, &rcv, t, 4096, 2, 1000, 1, 1, sh, apart_creator_mismatch, apart_connector_mismatch);
    snd.opens = rcv.opens = 1;
    CHECK(run_ends(&snd, &rcv, 0) == 0);
    munmap(sh, sizeof *sh);
}

static int connect_nobody(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *b = NULL;
    resolve(s);
    double t0 = now_ms();
    mmp_err e = mmp_channel_open_with(&b, s->t, &s->cfg, 0);
    double waited = now_ms() - t0;
    /* n: 1 when nothing is there (the full timeout), 0 when a dead creator's
     * segment is (reported at once). */
    if (e != MMP_ERR_PEER || b || (s->n && waited < s->cfg.timeout_ms - 10) || waited > 800) {
        PROBLEM(bad, "connect with no creator: %s after %.0f ms", mmp_err_name(e), waited);
    }
    return bad;
}

static int setup_close(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *a = NULL;
    if (mmp_channel_open_with(&a, s->t, &s->cfg, 1) != MMP_OK) {
        PROBLEM(bad, "setup: %s", mmp_last_error());
        return bad;
    }
    publish(s, a);
    if (!network(s->t) && mmp_test_shm_count(s->cfg.address, 0) != 1) {
        PROBLEM(bad, "setup made no name");
    }
    mmp_channel_close(a);
    if (!network(s->t) && mmp_test_shm_count(s->cfg.address, 0) != 0) {
        PROBLEM(bad, "a creator closed before any connect left its name");
    }
    return bad;
}

static int setup_die(side *s, mmp_channel *unused)
{
    (void)unused;
    mmp_channel *a = NULL;
    if (mmp_channel_open_with(&a, s->t, &s->cfg, 1) == MMP_OK) {
        publish(s, a);
        raise(SIGKILL);
    }
    return 1;
}

static int idle(side *s, mmp_channel *unused)
{
    (void)s;
    (void)unused;
    return 0;
}

static void test_no_creator_apart(const mmp_transport *t)
{
    shared *sh = new_shared();
    side a, b;
    pair(&a, &b, t, 64, 2, 300, 1, 1, sh, idle, connect_nobody);
    a.opens = b.opens = 1;
    dead_address(t, b.addr, sizeof b.addr); /* tcp: nobody ever listens there */
    CHECK(run_ends(&a, &b, 0) == 0);
    munmap(sh, sizeof *sh);
}

static void test_creator_gone(const mmp_transport *t)
{
    shared *sh = new_shared();
    side a, b;
    /* A creator that closed before anyone connected took its name along. */
    pair(&a, &b, t, 64, 2, 300, 1, 1, sh, setup_close, connect_nobody);
    a.opens = b.opens = 1;
    CHECK(run_in_turn(&a, 0, &b) == 0);
    /* A creator SIGKILLed before anyone connected: connect reports it, and
     * removes the name the dead creator could not. */
    pair(&a, &b, t, 64, 2, 300, 1, 0, sh, setup_die, connect_nobody);
    a.opens = b.opens = 1;
    CHECK(run_in_turn(&a, 1, &b) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (10) device transports only ------------------------------------------
 * Payloads written and read with CUDA copies on each end's own non-blocking
 * stream (only the channel's events order the two processes' work), two
 * devices when there are two, no host synchronisation on the data path, and
 * mmp_channel_open's choice for on_gpu edges. */

#ifdef MMP_HAVE_CUDA

static int send_streams(side *s, mmp_channel *ch)
{
    int bad = 0;
    size_t sb = s->cfg.slot_bytes;
    cudaStream_t st = s->cfg.cuda_stream;
    unsigned char *host = malloc(sb), *stage = NULL;
    if (!host) {
        PROBLEM(bad, "malloc");
        return bad;
    }
    if (s->streams) {
        CU(bad, cudaMalloc((void **)&stage, sb));
    }
    for (int k = 0; k < s->n && !bad; k++) {
        mmp_msg_header h = message(k, sb);
        fill(host, h.bytes, (uint64_t)k);
        mmp_err e;
        if (k % 2) {
            e = mmp_channel_send(ch, &h, host); /* the transport's fill */
        } else {
            void *p = NULL;
            e = mmp_channel_acquire(ch, &p);
            if (e == MMP_OK && s->streams) {
                /* Pageable H2D returns once staged; the D2D into the slot is
                 * truly asynchronous: only the channel's event orders it. */
                CU(bad, cudaMemcpyAsync(stage, host, h.bytes, cudaMemcpyHostToDevice, st));
                CU(bad, cudaMemcpyAsync(p, stage, h.bytes, cudaMemcpyDeviceToDevice, st));
            } else if (e == MMP_OK) {
                e = mmp_channel_fill(ch, p, host, h.bytes);
            }
            if (e == MMP_OK) {
                e = mmp_channel_post(ch, &h);
            }
        }
        if (e != MMP_OK) {
            PROBLEM(bad, "send %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
        }
    }
    if (stage) {
        cudaStreamSynchronize(st);
        cudaFree(stage);
    }
    free(host);
    return bad;
}

static int recv_streams(side *s, mmp_channel *ch)
{
    int bad = 0;
    size_t sb = s->cfg.slot_bytes;
    cudaStream_t st = s->cfg.cuda_stream;
    int slots = s->cfg.slots;
    unsigned char *host = malloc(sb), *own = NULL;
    const void *first[8] = {0};
    if (!host) {
        PROBLEM(bad, "malloc");
        return bad;
    }
    if (s->streams) {
        CU(bad, cudaMalloc((void **)&own, sb));
    }
    for (int k = 0; k < s->n && !bad; k++) {
        mmp_msg_header h, want = message(k, sb);
        const void *p = NULL;
        mmp_err e = mmp_channel_recv(ch, &h, &p);
        if (e != MMP_OK) {
            PROBLEM(bad, "recv %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
            break;
        }
        if (!same_header(&h, &want)) {
            PROBLEM(bad, "message %d: header step %d mb %d bytes %llu, want %d %d %llu", k, h.step,
                    h.mb, (unsigned long long)h.bytes, want.step, want.mb,
                    (unsigned long long)want.bytes);
        }
        if ((uintptr_t)p % 256) {
            PROBLEM(bad, "message %d: slot %p not 256-byte aligned", k, p);
        }
        if (k < slots && k < 8) {
            first[k] = p;
            for (int j = 0; j < k; j++) {
                intptr_t d = (const char *)p - (const char *)first[j];
                if ((size_t)(d < 0 ? -d : d) < sb) {
                    PROBLEM(bad, "slots %d and %d overlap", j, k);
                }
            }
        } else if (slots <= 8 && p != first[k % slots]) {
            PROBLEM(bad, "message %d at %p, slot %d was at %p", k, p, k % slots, first[k % slots]);
        }
        if (s->streams) {
            /* Read on our stream, release, then look: the release's event is
             * what keeps the sender off the slot until the D2D ran. */
            CU(bad, cudaMemcpyAsync(own, p, h.bytes, cudaMemcpyDeviceToDevice, st));
            e = mmp_channel_release(ch);
            CU(bad, cudaMemcpyAsync(host, own, h.bytes, cudaMemcpyDeviceToHost, st));
            CU(bad, cudaStreamSynchronize(st)); /* the test's check, not the data path */
        } else {
            e = mmp_channel_read(ch, host, p, h.bytes);
            if (e == MMP_OK) {
                e = mmp_channel_release(ch);
            }
        }
        if (e != MMP_OK) {
            PROBLEM(bad, "release %d: %s: %s", k, mmp_err_name(e), mmp_last_error());
        }
        size_t at = first_bad(host, h.bytes, (uint64_t)k);
        if (at != h.bytes) {
            PROBLEM(bad, "message %d: payload differs at byte %zu of %llu", k, at,
                    (unsigned long long)h.bytes);
        }
    }
    if (!bad) {
        mmp_msg_header h;
        const void *p;
        mmp_err e = mmp_channel_recv(ch, &h, &p);
        if (e != MMP_ERR_PEER) {
            PROBLEM(bad, "recv after the sender closed: %s, want peer", mmp_err_name(e));
        }
    }
    cudaFree(own);
    free(host);
    return bad;
}

static void test_ordered_streams(const mmp_transport *t)
{
    char addr[96];
    shared *sh = new_shared();
    struct {
        int slots, creator_sends, streams, two_devices;
    } runs[] = {{4, 1, 1, 0}, {3, 0, 1, 0}, {2, 1, 1, 1}}; /* the default stream: "ordered" */
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (runs[r].two_devices && n_devices < 2) {
            fprintf(stderr, "  ordered: one device, the two-device run is left out\n");
            continue;
        }
        fresh_address(addr, sizeof addr);
        side snd, rcv;
        make_ends(&snd, &rcv, t, make_cfg(addr, 3000, runs[r].slots, 1, 10000),
                  runs[r].creator_sends, 300, sh);
        snd.streams = rcv.streams = runs[r].streams;
        if (runs[r].two_devices) {
            rcv.cfg.device = n_devices - 1;
        }
        snd.body = send_streams;
        rcv.body = recv_streams;
        int problems = run_ends(&rcv, &snd, 0);
        if (problems) {
            fprintf(stderr, "  ordered: slots=%d creator %s, %s, %s\n", runs[r].slots,
                    runs[r].creator_sends ? "sends" : "receives",
                    runs[r].streams ? "own streams" : "default stream",
                    runs[r].two_devices ? "two devices" : "one device");
        }
        CHECK(problems == 0);
    }
    munmap(sh, sizeof *sh);
}

/* ---- (10b) no host synchronisation on the data path ------------------------
 *
 * By design (transport/cuda/cuda_ipc.c) acquire, post, recv and release only
 * enqueue cudaStreamWaitEvent / cudaEventRecord; none calls
 * cudaStreamSynchronize, cudaDeviceSynchronize or cudaEventSynchronize. This
 * case checks it without timing anything fine: each end parks its stream in a
 * host function that sleeps SLOW_MS and then raises a flag, so a data-path
 * call that waited for the device would return only after the flag. It also
 * checks that the events order the two processes' device work: the copies
 * queued behind them see the flag raised and the right bytes. */

#define SLOW_MS 300
#define NHS_BYTES 4096

static void CUDART_CB slow_then_flag(void *arg)
{
    sleep_ms(SLOW_MS); /* a host function must not call CUDA; this does not */
    atomic_store((_Atomic int *)arg, 1);
}

static int send_nhs(side *s, mmp_channel *ch)
{
    int bad = 0;
    unsigned char *pinned = NULL, *host = malloc(NHS_BYTES);
    void *p;
    mmp_msg_header h = message(0, NHS_BYTES);
    h.bytes = NHS_BYTES;
    if (!host) {
        PROBLEM(bad, "malloc");
        return bad;
    }
    /* Pinned, so the H2D copy is truly asynchronous behind the host function. */
    CU(bad, cudaMallocHost((void **)&pinned, NHS_BYTES));
    fill(pinned, NHS_BYTES, 0);
    if (mmp_channel_acquire(ch, &p) != MMP_OK) {
        PROBLEM(bad, "acquire 0: %s", mmp_last_error());
        return bad;
    }
    CU(bad, cudaLaunchHostFunc(NULL, slow_then_flag, &s->sh->flag[0]));
    CU(bad, cudaMemcpyAsync(p, pinned, NHS_BYTES, cudaMemcpyHostToDevice, NULL));
    if (mmp_channel_post(ch, &h) != MMP_OK) {
        PROBLEM(bad, "post 0: %s", mmp_last_error());
    }
    if (atomic_load(&s->sh->flag[0])) {
        PROBLEM(bad, "post waited for the device work before it");
    }
    /* Slot 0 again (one slot): the credit comes at once, the device order
     * only once the receiver's stream passed its slow host function. */
    if (mmp_channel_acquire(ch, &p) != MMP_OK) {
        PROBLEM(bad, "acquire 1: %s", mmp_last_error());
        return bad;
    }
    if (atomic_load(&s->sh->flag[1])) {
        PROBLEM(bad, "acquire waited for the receiver's device work");
    }
    fill(host, NHS_BYTES, 1);
    CU(bad, cudaMemcpy(p, host, NHS_BYTES, cudaMemcpyHostToDevice));
    h = message(1, NHS_BYTES);
    h.bytes = NHS_BYTES;
    if (mmp_channel_post(ch, &h) != MMP_OK) {
        PROBLEM(bad, "post 1: %s", mmp_last_error());
    }
    cudaDeviceSynchronize();
    cudaFreeHost(pinned);
    free(host);
    return bad;
}

static int recv_nhs(side *s, mmp_channel *ch)
{
    int bad = 0;
    unsigned char *host = malloc(NHS_BYTES), *own = NULL;
    mmp_msg_header h;
    const void *p;
    if (!host) {
        PROBLEM(bad, "malloc");
        return bad;
    }
    CU(bad, cudaMalloc((void **)&own, NHS_BYTES));
    if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
        PROBLEM(bad, "recv 0: %s", mmp_last_error());
        return bad;
    }
    if (atomic_load(&s->sh->flag[0])) {
        PROBLEM(bad, "recv returned only after the sender's device work (a host wait?)");
    }
    CU(bad, cudaMemcpy(host, p, NHS_BYTES, cudaMemcpyDeviceToHost));
    if (!atomic_load(&s->sh->flag[0])) {
        PROBLEM(bad, "the copy after recv ran before the sender's device work finished");
    }
    if (first_bad(host, NHS_BYTES, 0) != NHS_BYTES) {
        PROBLEM(bad, "message 0: payload differs");
    }
    /* Our read of the slot sits behind a slow host function; release must
     * not wait for it, and the sender's overwrite must. */
    CU(bad, cudaLaunchHostFunc(NULL, slow_then_flag, &s->sh->flag[1]));
    CU(bad, cudaMemcpyAsync(own, p, NHS_BYTES, cudaMemcpyDeviceToDevice, NULL));
    if (mmp_channel_release(ch) != MMP_OK) {
        PROBLEM(bad, "release 0: %s", mmp_last_error());
    }
    if (atomic_load(&s->sh->flag[1])) {
        PROBLEM(bad, "release waited for the device work before it");
    }
    CU(bad, cudaMemcpy(host, own, NHS_BYTES, cudaMemcpyDeviceToHost));
    if (first_bad(host, NHS_BYTES, 0) != NHS_BYTES) {
        PROBLEM(bad, "the sender overwrote slot 0 before our read of it ran");
    }
    if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
        PROBLEM(bad, "recv 1: %s", mmp_last_error());
        return bad;
    }
    CU(bad, cudaMemcpy(host, p, NHS_BYTES, cudaMemcpyDeviceToHost));
    if (first_bad(host, NHS_BYTES, 1) != NHS_BYTES) {
        PROBLEM(bad, "message 1: payload differs");
    }
    mmp_channel_release(ch);
    cudaFree(own);
    free(host);
    return bad;
}

static void test_no_host_sync(const mmp_transport *t)
{
    CHECK(run_one_pair(t, NHS_BYTES, 1, 10000, 1, 2, send_nhs, recv_nhs, run_ends) == 0);
}

static int open_end(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *ch = NULL;
    if (mmp_channel_open(&ch, NULL, &s->cfg, s->creator) != MMP_OK) {
        PROBLEM(bad, "open: %s", mmp_last_error());
        atomic_store(&s->sh->flag[0], 1);
        return bad;
    }
    const mmp_transport *used = mmp_channel_transport(ch);
    const mmp_transport *want = s->cfg.on_gpu ? &mmp_transport_cuda_ipc : &mmp_transport_shm;
    if (used != want) {
        PROBLEM(bad, "open picked %s, want %s", used->name, want->name);
    }
    if (s->cfg.send) {
        mmp_msg_header h = {.flags = MMP_MSG_STOP};
        if (mmp_channel_send(ch, &h, NULL) != MMP_OK) {
            PROBLEM(bad, "send: %s", mmp_last_error());
        }
    } else {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK || h.flags != MMP_MSG_STOP || h.bytes != 0 ||
            mmp_channel_release(ch) != MMP_OK) {
            PROBLEM(bad, "recv: %s", mmp_last_error());
        }
    }
    /* The creator's close removes the name: it waits until the other end is
     * through (a connect after the close would find no creator). */
    if (s->creator) {
        wait_flag(s->sh, 0, 1);
    } else {
        atomic_store(&s->sh->flag[0], 1);
    }
    mmp_channel_close(ch);
    return bad;
}

static void test_open_gpu(const mmp_transport *t)
{
    char addr[96];
    shared *sh = new_shared();
    for (int gpu = 1; gpu >= 0; gpu--) {
        side snd, rcv;
        fresh_address(addr, sizeof addr);
        make_ends(&snd, &rcv, t, make_cfg(addr, 64, 2, 1, 2000), 1, 0, sh);
        snd.cfg.on_gpu = rcv.cfg.on_gpu = gpu;
        snd.opens = rcv.opens = 1;
        snd.body = rcv.body = open_end;
        atomic_store(&sh->flag[0], 0);
        CHECK(run_ends(&snd, &rcv, 0) == 0);
    }
    munmap(sh, sizeof *sh);
}

#endif /* MMP_HAVE_CUDA */

/* ---- (8) crash clean-up ------------------------------------------------- */

/* MMP_SHM_SPIN_NS and MMP_SHM_SPIN_MAX_NS in the environment: a number is
 * taken (the channel works), anything else fails the open with an error
 * naming the variable, and no name is left behind. */
static void test_spin_env(void)
{
    static const char *bad[] = {"abc", "-1", "12x", "", "2000000000"};
    static const char *vars[] = {"MMP_SHM_SPIN_NS", "MMP_SHM_SPIN_MAX_NS"};
    char addr[96];
    mmp_channel *a = NULL;
    for (size_t v = 0; v < sizeof vars / sizeof vars[0]; v++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            fresh_address(addr, sizeof addr);
            mmp_channel_cfg c = make_cfg(addr, 64, 1, 1, 100);
            setenv(vars[v], bad[i], 1);
            CHECK(mmp_channel_open_with(&a, &mmp_transport_shm, &c, 1) == MMP_ERR_INVALID && !a);
            CHECK(strstr(mmp_last_error(), vars[v]) != NULL);
            mmp_channel_close(a);
            a = NULL;
        }
        unsetenv(vars[v]);
    }
    CHECK(leftovers(prefix) == 0);
    fresh_address(addr, sizeof addr);
    mmp_channel *b = NULL;
    mmp_channel_cfg cs = make_cfg(addr, 64, 1, 1, 1000), cr = make_cfg(addr, 64, 1, 0, 1000);
    setenv("MMP_SHM_SPIN_NS", "0", 1);
    setenv("MMP_SHM_SPIN_MAX_NS", "0", 1);
    CHECK_OK(mmp_channel_open_with(&a, &mmp_transport_shm, &cs, 1));
    CHECK_OK(mmp_channel_open_with(&b, &mmp_transport_shm, &cr, 0));
    unsetenv("MMP_SHM_SPIN_NS");
    unsetenv("MMP_SHM_SPIN_MAX_NS");
    if (a && b) {
        mmp_msg_header h = {.step = 4, .n = 1, .bytes = 8}, got;
        const void *p;
        unsigned char src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        CHECK_OK(mmp_channel_send(a, &h, src));
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(got.step == 4 && p && memcmp(p, src, 8) == 0);
        CHECK_OK(mmp_channel_release(b));
    }
    mmp_channel_close(b);
    mmp_channel_close(a);
}

static double thread_cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* An shm end blocked with nothing coming burns little CPU, whatever its
 * spin (transport/ring.h: it polls at most the adaptive ceiling per wait,
 * then sleeps on the doorbell): a receiver waiting ~400 ms for a message and
 * a sender waiting as long for a credit each use under 10% of the wait's
 * time on the CPU (a waiter that polled until the peer moved would use all
 * of it). Both ends start by answering at once (50 messages back and forth),
 * so the spin is at its ceiling when the long waits begin. */
static void test_idle_cpu(void)
{
    enum { LONG_MS = 400, WARM = 50 };
    char addr[96];
    mmp_channel *a = NULL;
    fresh_address(addr, sizeof addr);
    mmp_channel_cfg cs = make_cfg(addr, 64, 1, 1, 5000), cr = make_cfg(addr, 64, 1, 0, 5000);
    CHECK_OK(mmp_channel_open_with(&a, &mmp_transport_shm, &cs, 1));
    if (!a) {
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        mmp_channel *b = NULL;
        mmp_msg_header h;
        const void *p;
        int bad = 0;
        if (mmp_channel_open_with(&b, &mmp_transport_shm, &cr, 0) != MMP_OK) {
            _exit(1);
        }
        for (int k = 0; k < WARM; k++) {
            bad += mmp_channel_recv(b, &h, &p) != MMP_OK || mmp_channel_release(b) != MMP_OK;
        }
        double t0 = now_ms(), c0 = thread_cpu_ms();
        bad += mmp_channel_recv(b, &h, &p) != MMP_OK; /* the sender pauses LONG_MS first */
        double waited = now_ms() - t0, cpu = thread_cpu_ms() - c0;
        if (waited < LONG_MS / 2 || cpu > 0.1 * waited) {
            fprintf(stderr, "  receiver: waited %.0f ms, %.1f ms of it on the CPU\n", waited, cpu);
            bad++;
        }
        sleep_ms(LONG_MS); /* holds the only slot: the sender waits for its credit */
        bad += mmp_channel_release(b) != MMP_OK;
        bad += mmp_channel_recv(b, &h, &p) != MMP_OK || mmp_channel_release(b) != MMP_OK;
        mmp_channel_close(b);
        _exit(bad ? 1 : 0);
    }
    mmp_msg_header h = {.step = 0, .n = 1, .bytes = 8};
    unsigned char src[8] = {0};
    for (int k = 0; k < WARM; k++) {
        CHECK_OK(mmp_channel_send(a, &h, src));
    }
    sleep_ms(LONG_MS);
    CHECK_OK(mmp_channel_send(a, &h, src));
    double t0 = now_ms(), c0 = thread_cpu_ms();
    CHECK_OK(mmp_channel_send(a, &h, src)); /* waits for the credit the receiver holds */
    double waited = now_ms() - t0, cpu = thread_cpu_ms() - c0;
    if (waited < LONG_MS / 2 || cpu > 0.1 * waited) {
        fprintf(stderr, "  sender: waited %.0f ms, %.1f ms of it on the CPU\n", waited, cpu);
        CHECK(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    mmp_channel_close(a);
}

/* What a stage takes from another process as the address of the network
 * end it connects (mmp_channel_check_endpoint): a real "host:port" or a nccl
 * creator's address, never a shm name (a reduce given one would join that
 * segment) nor port 0 nor text. */
static void test_endpoint_check(void)
{
    char nccl[400], bad_hex[400];
    int n = snprintf(nccl, sizeof nccl, "node7:4100#nccl:");
    for (int i = 0; i < 256; i++) {
        nccl[n++] = "0123456789abcdef"[i % 16];
    }
    nccl[n] = 0;
    snprintf(bad_hex, sizeof bad_hex, "%s", nccl);
    bad_hex[n - 1] = 'g';
    const char *good[] = {"node7:4100", "10.0.0.2:65535", "[::1]:1", nccl};
    const char *bad[] = {
        "/mmpipe-x-r0", "/l:33", "[[a]]:5",      "[%1]:4015", "node7:0", "node7", "node7:65536",
        "node7:4100 ",  "a:b:1", "node3:0#nccl", bad_hex,     "",        NULL};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        CHECK_OK(mmp_channel_check_endpoint(good[i]));
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(mmp_channel_check_endpoint(bad[i]) == MMP_ERR_PROTO);
    }
    CHECK(strstr(mmp_last_error(), "endpoint") != NULL);
    nccl[n - 2] = 0; /* an id one byte short */
    CHECK(mmp_channel_check_endpoint(nccl) == MMP_ERR_PROTO);
    CHECK(strstr(mmp_last_error(), "hex digits") != NULL);
}

static void test_unlink_prefix(void)
{
    char stray[96], keep[96];
    snprintf(stray, sizeof stray, "%sstray-", prefix);
    fresh_address(keep, sizeof keep);
    mmp_channel *k = NULL;
    mmp_channel_cfg ck = make_cfg(keep, 64, 1, 1, 100);
    CHECK_OK(mmp_channel_open_with(&k, &mmp_transport_shm, &ck, 1));

    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 3; i++) {
            char addr[128];
            snprintf(addr, sizeof addr, "%s%d", stray, i);
            mmp_channel_cfg c = make_cfg(addr, 4096, 2, 1, 0);
            mmp_channel *x = NULL;
            if (mmp_channel_open_with(&x, &mmp_transport_shm, &c, 1) != MMP_OK) {
                _exit(1);
            }
        }
        raise(SIGKILL);
        _exit(1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    CHECK(leftovers(stray) == 3);
    CHECK(mmp_shm_unlink_prefix("") == 0);
    CHECK(mmp_shm_unlink_prefix("/") == 0);
    CHECK(mmp_shm_unlink_prefix(stray) == 3);
    CHECK(leftovers(stray) == 0);
    CHECK(leftovers(prefix) == 1); /* the live one is untouched */
    mmp_channel_close(k);
}

/* ---- (9) a large slot --------------------------------------------------- */

#define BIG (16u << 20)

static int send_big(side *s, mmp_channel *ch)
{
    int bad = 0;
    for (int k = 0; k < s->n; k++) {
        void *p;
        mmp_msg_header h = message(k, BIG);
        h.bytes = BIG - (k % 2) * 13; /* a full slot, and a ragged end */
        if (mmp_channel_acquire(ch, &p) != MMP_OK) {
            PROBLEM(bad, "acquire %d: %s", k, mmp_last_error());
            return bad;
        }
        if (put_pattern(ch, p, h.bytes, (uint64_t)k) != MMP_OK ||
            mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "post %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    return bad;
}

static int recv_big(side *s, mmp_channel *ch)
{
    int bad = 0;
    for (int k = 0; k < s->n; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            return bad;
        }
        size_t at = payload_bad(ch, p, h.bytes, (uint64_t)k);
        if (h.bytes != BIG - (k % 2) * 13 || at != h.bytes) {
            PROBLEM(bad, "message %d: %llu bytes, differs at %zu", k, (unsigned long long)h.bytes,
                    at);
        }
        mmp_channel_release(ch);
    }
    return bad;
}

static void test_big(const mmp_transport *t)
{
    CHECK(run_one_pair(t, BIG, 2, 10000, 1, 6, send_big, recv_big, run_pair) == 0);
}

/* ---- mmp_channel_open --------------------------------------------------- */

static void test_open(void)
{
    char addr[96];
    mmp_channel *a = NULL, *b = NULL;
    mmp_channel_cfg nowhere = make_cfg("tcp-ish", 64, 2, 1, 100);
    CHECK(mmp_channel_open(&a, NULL, &nowhere, 1) == MMP_ERR_UNSUPPORTED);
    CHECK(a == NULL);
    fresh_address(addr, sizeof addr);
    mmp_channel_cfg cs = make_cfg(addr, 64, 2, 1, 1000), cr = make_cfg(addr, 64, 2, 0, 1000);
    CHECK(mmp_channel_open(&a, "no-such-transport", &cs, 1) == MMP_ERR_UNSUPPORTED);
    CHECK(a == NULL && strstr(mmp_last_error(), "no-such-transport") != NULL);

    /* By name (the coordinator's pick) and by the priority list; the handle
     * carries the transport it was opened with. */
    CHECK_OK(mmp_channel_open(&a, "shm", &cs, 1));
    CHECK_OK(mmp_channel_open(&b, NULL, &cr, 0));
    CHECK(a && mmp_channel_transport(a) == &mmp_transport_shm);
    CHECK(b && mmp_channel_transport(b) == &mmp_transport_shm);
    if (a && b) {
        mmp_msg_header h = {.flags = MMP_MSG_STOP}, got;
        const void *p;
        CHECK(mmp_channel_sends(a) && !mmp_channel_sends(b));
        CHECK(mmp_channel_slot_bytes(a) == 64 && mmp_channel_slot_bytes(b) == 64);
        CHECK_OK(mmp_channel_send(a, &h, NULL));
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(got.flags == MMP_MSG_STOP && got.bytes == 0);
        CHECK_OK(mmp_channel_release(b));
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
    mmp_channel_close(NULL);
    /* A "host:port" address goes to tcp; its creator opened on port 0
     * reports the port it listens on, and the connector reaches it there. */
    mmp_channel_cfg ts = make_cfg("127.0.0.1:0", 64, 2, 1, 1000);
    CHECK_OK(mmp_channel_open(&a, NULL, &ts, 1));
    CHECK(a && mmp_channel_transport(a) == &mmp_transport_tcp);
    if (a) {
        const char *at = mmp_channel_address(a);
        CHECK(strncmp(at, "127.0.0.1:", 10) == 0 && atoi(at + 10) > 0);
        mmp_channel_cfg tr = make_cfg(at, 64, 2, 0, 1000);
        CHECK_OK(mmp_channel_open(&b, NULL, &tr, 0));
        CHECK(b && mmp_channel_transport(b) == &mmp_transport_tcp &&
              strcmp(mmp_channel_address(b), at) == 0);
        mmp_msg_header h = {.flags = MMP_MSG_STOP}, got;
        const void *p;
        CHECK_OK(mmp_channel_send(a, &h, NULL));
        CHECK(b && mmp_channel_recv(b, &got, &p) == MMP_OK && got.flags == MMP_MSG_STOP);
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
    a = b = NULL;
    mmp_channel_cfg gpu = ts;
    gpu.on_gpu = 1; /* device slots: never tcp */
    CHECK(mmp_channel_open(&a, "tcp", &gpu, 1) == MMP_ERR_UNSUPPORTED && a == NULL);
    /* A failed setup names the channel and the transport. */
    CHECK_OK(mmp_channel_open(&a, "", &cs, 1));
    mmp_channel *c = NULL;
    CHECK(mmp_channel_open(&c, "shm", &cs, 1) == MMP_ERR_IO && c == NULL);
    CHECK(strstr(mmp_last_error(), "(shm setup)") && strstr(mmp_last_error(), addr));
    mmp_channel_close(a);
}

/* ---- (9) forged headers in a live channel ------------------------------ */

/* The segment as a hostile or broken peer sees it: a second mapping of the
 * live channel's shared memory, written without going through the
 * transport. The test knows nothing of the layout: it finds a posted
 * message's header by its digest. */
typedef struct forger {
    unsigned char *base;
    size_t bytes;
} forger;

static int forger_map(forger *f, const char *addr)
{
    *f = (forger){0};
    int fd = shm_open(addr, O_RDWR, 0);
    if (fd < 0) {
        return -1;
    }
    off_t n = lseek(fd, 0, SEEK_END);
    void *p = n > 0 ? mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
        return -1;
    }
    f->base = p;
    f->bytes = (size_t)n;
    return 0;
}

/* The posted header whose digest is d, or NULL. */
static mmp_msg_header *forger_find(const forger *f, uint64_t d)
{
    size_t at = offsetof(mmp_msg_header, digest);
    for (size_t off = at; off + sizeof(mmp_msg_header) - at <= f->bytes; off += 8) {
        uint64_t v;
        memcpy(&v, f->base + off, 8);
        if (v == d) {
            return (mmp_msg_header *)(void *)(f->base + off - at);
        }
    }
    return NULL;
}

/* ---- (9b) forged bytes on a tcp connection --------------------------------
 * The test plays the hostile peer itself: a raw socket that speaks the wire
 * of transport/tcp.h and then lies. A lie breaks the stream for good (TCP
 * cannot resynchronise), so each forged header gets a fresh channel. */

/* A raw connection to address that passes the job-key handshake and sends
 * a hello (sends: 1 the sending end, 0 the receiving one, < 0 neither
 * handshake nor hello) and reads the answer into reply (NULL: does not).
 * -1 when any of it fails. */
static int raw_connect(const char *address, int sends, uint32_t slots, uint64_t slot_bytes,
                       mmp_tcp_hello *reply)
{
    const char *colon = strrchr(address, ':');
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)atoi(colon ? colon + 1 : "0")),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    mmp_tcp_hello h = {.magic = MMP_TCP_MAGIC,
                       .version = MMP_TCP_VERSION,
                       .slots = slots,
                       .slot_bytes = slot_bytes,
                       .sends = sends};
    if (sends < 0) {
        return fd; /* no hello: the caller sends what it likes */
    }
    if (mmp_auth_handshake(fd, "raw connector", MMP_TEST_SECRET, 1, mmp_sock_deadline(5000), -1) !=
        MMP_OK) {
        close(fd);
        return -1;
    }
    if (write(fd, &h, sizeof h) != (ssize_t)sizeof h ||
        (reply && recv(fd, reply, sizeof *reply, MSG_WAITALL) != (ssize_t)sizeof *reply)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A creating end *ch (cfg c) and a raw peer connected to it with a hello of
 * this direction and geometry; the peer's fd, checked, as is its answer when
 * reply is given (-1 on failure). */
static int raw_peer(const mmp_transport *t, const mmp_channel_cfg *c, mmp_channel **ch, int sends,
                    uint32_t slots, uint64_t slot_bytes, mmp_tcp_hello *reply)
{
    CHECK_OK(mmp_channel_open_with(ch, t, c, 1));
    int fd = *ch ? raw_connect(mmp_channel_address(*ch), sends, slots, slot_bytes, reply) : -1;
    CHECK(fd >= 0 && (!reply || reply->status == MMP_TCP_OK));
    return fd;
}

static int raw_send(int fd, const void *p, size_t n)
{
    return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* Reads until the peer closes (or 5 s of silence: raw_connect's receive
 * timeout), at most cap bytes into buf; how many came. */
static size_t recv_to_eof(int fd, void *buf, size_t cap)
{
    size_t have = 0;
    for (;;) {
        ssize_t r = recv(fd, (char *)buf + have, cap - have, 0);
        if (r <= 0 || (have += (size_t)r) == cap) {
            return have;
        }
    }
}

/* One forged header field per row (for slots of FORGED_SLOT bytes); the
 * receiver's error must name the field. */
enum { FORGED_SLOT = 4096 };
static const struct {
    const char *field;
    uint64_t bytes;
    int32_t n, step, mb, flags;
} forged_rows[] = {
    {"bytes", FORGED_SLOT + 1, 1, 0, 0, 0},
    {"bytes", UINT64_MAX, 1, 0, 0, 0},
    {"n", 8, -1, 0, 0, 0},
    {"n", 8, INT32_MIN, 0, 0, 0},
    {"step", 8, 1, -3, 0, 0},
    {"mb", 8, 1, 0, -1, 0},
    {"flags", 8, 1, 0, 0, 0x40},
    {"bytes", 8, 1, 0, 0, MMP_MSG_STOP}, /* a STOP carries no payload */
};

/* h with row r's forged values. */
static void forge(mmp_msg_header *h, size_t r)
{
    h->bytes = forged_rows[r].bytes;
    h->n = forged_rows[r].n;
    h->step = forged_rows[r].step;
    h->mb = forged_rows[r].mb;
    h->flags = forged_rows[r].flags;
}

/* The last error names row r's field. */
static int names_forged_field(size_t r)
{
    char want[32];
    snprintf(want, sizeof want, "field %s", forged_rows[r].field);
    return strstr(mmp_last_error(), want) != NULL;
}

static void test_forged_tcp(const mmp_transport *t)
{
    enum { SLOT = FORGED_SLOT, SLOTS = 4 };
    char addr[96];
    address_for(t, addr, sizeof addr);
    mmp_channel_cfg cr = make_cfg(addr, SLOT, SLOTS, 0, 1000);
    unsigned char src[SLOT] = {0};
    for (size_t r = 0; r < sizeof forged_rows / sizeof forged_rows[0]; r++) {
        mmp_channel *b = NULL;
        mmp_tcp_hello reply = {0};
        int fd = raw_peer(t, &cr, &b, 1, SLOTS, SLOT, &reply);
        if (fd < 0) {
            mmp_channel_close(b);
            break;
        }
        /* A good message first: it is delivered. */
        mmp_msg_header h = {.step = 1, .mb = 2, .n = 3, .bytes = 8, .digest = 0xF0F6ED00 + r}, got;
        memset(src, (int)r + 1, sizeof src);
        const void *p = NULL;
        CHECK(raw_send(fd, &h, sizeof h) == 0 && raw_send(fd, src, 8) == 0);
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(same_header(&h, &got) && p && memcmp(p, src, 8) == 0);
        CHECK_OK(mmp_channel_release(b));
        /* Then the lie, with as many payload bytes as it claims (up to a slot). */
        mmp_msg_header bad = h;
        forge(&bad, r);
        CHECK(raw_send(fd, &bad, sizeof bad) == 0);
        (void)raw_send(fd, src, bad.bytes < SLOT ? (size_t)bad.bytes : SLOT);
        mmp_err e = mmp_channel_recv(b, &got, &p);
        CHECK(e == MMP_ERR_PROTO && names_forged_field(r));
        if (e == MMP_OK) {
            mmp_channel_release(b);
        }
        /* The stream is broken for good: the same error again. */
        CHECK(mmp_channel_recv(b, &got, &p) == MMP_ERR_PROTO);
        close(fd);
        mmp_channel_close(b);
    }

    /* More messages than credits: the receiver holds all SLOTS, and one more
     * arrives. The SLOTS are delivered, then the protocol error. */
    {
        mmp_channel *b = NULL;
        int fd = raw_peer(t, &cr, &b, 1, SLOTS, SLOT, NULL);
        for (int k = 0; fd >= 0 && k <= SLOTS; k++) {
            mmp_msg_header h = message(k, 64);
            fill(src, h.bytes, (uint64_t)k);
            CHECK(raw_send(fd, &h, sizeof h) == 0 && raw_send(fd, src, h.bytes) == 0);
        }
        for (int k = 0; fd >= 0 && k < SLOTS; k++) {
            mmp_msg_header got, want = message(k, 64);
            const void *p;
            CHECK(mmp_channel_recv(b, &got, &p) == MMP_OK && same_header(&got, &want));
        }
        mmp_msg_header got;
        const void *p;
        CHECK(b && mmp_channel_recv(b, &got, &p) == MMP_ERR_PROTO &&
              strstr(mmp_last_error(), "without a credit"));
        if (fd >= 0) {
            close(fd);
        }
        mmp_channel_close(b);
    }

    /* A message cut off by the sender's end: the peer, named. */
    {
        mmp_channel *b = NULL;
        int fd = raw_peer(t, &cr, &b, 1, SLOTS, SLOT, NULL);
        mmp_msg_header h = message(0, 1000);
        if (fd >= 0) {
            CHECK(raw_send(fd, &h, sizeof h) == 0 && raw_send(fd, src, h.bytes / 2) == 0);
            close(fd);
        }
        mmp_msg_header got;
        const void *p;
        CHECK(b && mmp_channel_recv(b, &got, &p) == MMP_ERR_PEER &&
              strstr(mmp_last_error(), "127.0.0.1:"));
        mmp_channel_close(b);
    }

    /* A forged credit: more messages released than were ever posted. */
    {
        mmp_channel *a = NULL;
        mmp_channel_cfg cs = make_cfg(addr, SLOT, 1, 1, 1000);
        mmp_tcp_hello reply = {0};
        int fd = raw_peer(t, &cs, &a, 0, 1, SLOT, &reply);
        if (fd >= 0) {
            mmp_msg_header h = message(0, 64), got;
            void *q;
            fill(src, h.bytes, 0);
            CHECK_OK(mmp_channel_send(a, &h, src));
            CHECK(recv(fd, &got, sizeof got, MSG_WAITALL) == (ssize_t)sizeof got &&
                  same_header(&got, &h));
            uint64_t credit = 5; /* one message posted */
            CHECK(raw_send(fd, &credit, sizeof credit) == 0);
            CHECK(mmp_channel_acquire(a, &q) == MMP_ERR_PROTO &&
                  strstr(mmp_last_error(), "field tail"));
            close(fd);
        }
        mmp_channel_close(a);
    }

    /* Strangers at the door: junk, a process without the job's key (a wrong
     * one, none, or the creator's own nonce and answer sent back), a wrong
     * geometry and a wrong direction are refused (the answer says why, once
     * the stranger holds the key), and the right connector still gets in. */
    {
        mmp_channel *b = NULL, *a = NULL;
        CHECK_OK(mmp_channel_open_with(&b, t, &cr, 1));
        const char *at = b ? mmp_channel_address(b) : "127.0.0.1:1";
        int junk = raw_connect(at, -1, 0, 0, NULL); /* one handshake part of junk */
        if (junk >= 0) {
            memset(src, 0x5a, MMP_AUTH_BYTES);
            CHECK(raw_send(junk, src, MMP_AUTH_BYTES) == 0);
            /* the creator's magic and nonce, then the end: never its HMAC */
            CHECK(recv_to_eof(junk, src, sizeof src) == 40 && memcmp(src, "MMPAUTH1", 8) == 0);
            close(junk);
        }
        int mirror = raw_connect(at, -1, 0, 0, NULL);
        if (mirror >= 0) { /* sends back the creator's own magic and nonce */
            unsigned char part[40];
            CHECK(recv(mirror, part, sizeof part, MSG_WAITALL) == (ssize_t)sizeof part);
            CHECK(raw_send(mirror, part, sizeof part) == 0);
            CHECK(recv_to_eof(mirror, src, sizeof src) == 0);
            close(mirror);
        }
        int stranger = raw_connect(at, -1, 0, 0, NULL);
        if (stranger >= 0) { /* another job's key: each end finds the other's HMAC wrong */
            CHECK(mmp_auth_handshake(stranger, "stranger", "another job's token", 1,
                                     mmp_sock_deadline(5000), -1) == MMP_ERR_PROTO &&
                  strstr(mmp_last_error(), "does not hold this job's key"));
            CHECK(recv_to_eof(stranger, src, sizeof src) == 0); /* and no hello answered */
            close(stranger);
        }
        mmp_channel_cfg other = make_cfg(at, SLOT, SLOTS, 1, 1000);
        other.secret = "another job's token";
        double t0 = mmp_test_now_s();
        CHECK(mmp_channel_open_with(&a, t, &other, 0) == MMP_ERR_PROTO && a == NULL &&
              strstr(mmp_last_error(), "does not hold this job's key") &&
              mmp_test_now_s() - t0 < 0.9); /* told at once, not at its timeout */
        other.secret = NULL;
        CHECK(mmp_channel_open_with(&a, t, &other, 0) == MMP_ERR_INVALID && a == NULL &&
              strstr(mmp_last_error(), "secret"));
        mmp_tcp_hello reply = {0};
        int g = raw_connect(at, 1, SLOTS, (uint64_t)1 << 50, &reply);
        CHECK(g >= 0 && reply.status == MMP_TCP_GEOMETRY && reply.slots == SLOTS &&
              reply.slot_bytes == SLOT);
        if (g >= 0) {
            close(g);
        }
        int d = raw_connect(at, 0, SLOTS, SLOT, &reply);
        CHECK(d >= 0 && reply.status == MMP_TCP_DIRECTION);
        if (d >= 0) {
            close(d);
        }
        char real[128];
        snprintf(real, sizeof real, "%s", at);
        mmp_channel_cfg cs = make_cfg(real, SLOT, SLOTS, 1, 1000);
        CHECK_OK(mmp_channel_open_with(&a, t, &cs, 0));
        if (a && b) {
            mmp_msg_header h = message(3, SLOT), got;
            const void *p;
            fill(src, h.bytes, 3);
            CHECK_OK(mmp_channel_send(a, &h, src));
            CHECK_OK(mmp_channel_recv(b, &got, &p));
            CHECK(same_header(&h, &got) && first_bad(p, got.bytes, 3) == got.bytes);
            CHECK_OK(mmp_channel_release(b));
        }
        mmp_channel_close(a);
        mmp_channel_close(b);
    }
}

/* ---- (9b') idle strangers at the door ---------------------------------------
 * Connections that open the creator's port and then say nothing (a port
 * scanner, a hung process) must not hold the door: before the gate
 * (transport/auth.h) the creator's thread served one connection at a time,
 * each for up to 5 s, so the real connector behind them timed out. Here
 * MMP_AUTH_PENDING + 2 idle strangers connect first, then the real connector
 * (the gate, full, drops the three oldest for newcomers), whose timeout (3 s) is
 * shorter than one stranger's 5 s: it gets in, a message flows, and every
 * stranger is refused (its socket sees the creator's first handshake part,
 * then the end) and logged with its address. */

enum { IDLE_STRANGERS = MMP_AUTH_PENDING + 2 };

typedef struct strangers_run {
    const mmp_transport *t;
    int fd[IDLE_STRANGERS];
    char at[128];
} strangers_run;

static void strangers_body(void *arg)
{
    strangers_run *sr = arg;
    enum { SLOT = 4096, SLOTS = 2 };
    char addr[96];
    address_for(sr->t, addr, sizeof addr);
    mmp_channel_cfg cr = make_cfg(addr, SLOT, SLOTS, 0, 3000);
    mmp_channel *a = NULL, *b = NULL;
    CHECK_OK(mmp_channel_open_with(&b, sr->t, &cr, 1));
    snprintf(sr->at, sizeof sr->at, "%s", b ? mmp_channel_address(b) : "127.0.0.1:1");
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        sr->fd[i] = raw_connect(sr->at, -1, 0, 0, NULL); /* connects, says nothing */
        CHECK(sr->fd[i] >= 0);
    }
    mmp_channel_cfg cs = make_cfg(sr->at, SLOT, SLOTS, 1, 3000);
    CHECK_OK(mmp_channel_open_with(&a, sr->t, &cs, 0));
    if (a && b) {
        static unsigned char src[SLOT];
        mmp_msg_header h = message(7, SLOT), got;
        const void *p;
        fill(src, h.bytes, 7);
        CHECK_OK(mmp_channel_send(a, &h, src));
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(same_header(&h, &got) && first_bad(p, got.bytes, 7) == got.bytes);
        CHECK_OK(mmp_channel_release(b));
    }
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        unsigned char part[128];
        CHECK(sr->fd[i] < 0 || (recv_to_eof(sr->fd[i], part, sizeof part) == 40 &&
                                memcmp(part, "MMPAUTH1", 8) == 0));
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, what)); p += strlen(what)) {
        n++;
    }
    return n;
}

static void test_idle_strangers(const mmp_transport *t)
{
    strangers_run sr = {.t = t};
    char *log = mmp_test_stderr_of("transport-strangers", strangers_body, &sr);
    CHECK(log != NULL);
    if (log) {
        char tag[160];
        snprintf(tag, sizeof tag, "tcp %s: connector 127.0.0.1:", sr.at);
        CHECK(count_of(log, tag) == IDLE_STRANGERS);
        /* the real connector made the gate drop one more */
        int dropped = IDLE_STRANGERS + 1 - MMP_AUTH_PENDING;
        CHECK(count_of(log, "the oldest dropped; refused") == dropped);
        CHECK(count_of(log, "the channel has its connector; refused") == IDLE_STRANGERS - dropped);
    }
    free(log);
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        if (sr.fd[i] >= 0) {
            close(sr.fd[i]);
        }
    }
}

/* ---- (9c) a host that vanishes: two network namespaces -----------------------
 * The sender's and the receiver's processes in two namespaces joined by a
 * veth pair (made here with ip(8), removed whatever happens); mid-stream the
 * receiver's link goes down: no FIN, no reset, only silence. Both ends wait
 * forever (timeout_ms 0), so only the transport's own loss detection
 * (keepalive, TCP_USER_TIMEOUT: MMP_SOCK_LOST_MS, 20 s) can end their wait:
 * both must report MMP_ERR_PEER naming the channel within 15..40 s. Needs
 * root and ip(8); noted and skipped without them. */

static int run_ip(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
                  const char *a5, const char *a6, const char *a7)
{
    const char *argv[] = {"ip", a0, a1, a2, a3, a4, a5, a6, a7, NULL};
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execv("/usr/sbin/ip", (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct lost_board {
    _Atomic int addr_ready, sent, err[2];
    double err_at[2];
    char addr[96], msg[2][512];
} lost_board;

/* One end in namespace ns: sends (or receives) 1 MB messages every 50 ms
 * until an error, which it records. */
static void lost_end(lost_board *b, const char *ns, int send)
{
    char path[128];
    snprintf(path, sizeof path, "/run/netns/%s", ns);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
        _exit(2);
    }
    while (!send && !atomic_load(&b->addr_ready)) {
        sleep_ms(1);
    }
    mmp_channel_cfg c = make_cfg(send ? "10.231.78.1:0" : b->addr, 1 << 20, 2, send, 0);
    mmp_channel *ch = NULL;
    if (mmp_channel_open_with(&ch, &mmp_transport_tcp, &c, send) != MMP_OK) {
        snprintf(b->msg[send], sizeof b->msg[send], "open: %s", mmp_last_error());
        atomic_store(&b->err[send], -1);
        _exit(1);
    }
    if (send) {
        snprintf(b->addr, sizeof b->addr, "%s", mmp_channel_address(ch));
        atomic_store(&b->addr_ready, 1);
    }
    static unsigned char buf[1 << 20];
    for (int k = 0;; k++) {
        mmp_msg_header h = message(k, sizeof buf);
        const void *p;
        mmp_err e = send ? mmp_channel_send(ch, &h, buf) : mmp_channel_recv(ch, &h, &p);
        if (e != MMP_OK) {
            b->err_at[send] = now_ms();
            snprintf(b->msg[send], sizeof b->msg[send], "%s", mmp_last_error());
            atomic_store(&b->err[send], (int)e);
            _exit(0);
        }
        if (send) {
            atomic_store(&b->sent, k + 1);
        } else {
            mmp_channel_release(ch);
        }
        sleep_ms(50);
    }
}

static void test_host_lost(const mmp_transport *t)
{
    (void)t;
    if (geteuid() != 0 || access("/usr/sbin/ip", X_OK) != 0) {
        fprintf(stderr, "  tcp host-lost: skipped (needs root and /usr/sbin/ip)\n");
        return;
    }
    char na[32], nb[32], va[16], vb[16];
    snprintf(na, sizeof na, "mmptcp-%d-a", (int)getpid());
    snprintf(nb, sizeof nb, "mmptcp-%d-b", (int)getpid());
    snprintf(va, sizeof va, "mt%da", (int)getpid() % 100000);
    snprintf(vb, sizeof vb, "mt%db", (int)getpid() % 100000);
    int bad = run_ip("netns", "add", na, NULL, NULL, NULL, NULL, NULL) |
              run_ip("netns", "add", nb, NULL, NULL, NULL, NULL, NULL) |
              run_ip("link", "add", va, "type", "veth", "peer", "name", vb) |
              run_ip("link", "set", va, "netns", na, NULL, NULL, NULL) |
              run_ip("link", "set", vb, "netns", nb, NULL, NULL, NULL) |
              run_ip("-n", na, "addr", "add", "10.231.78.1/24", "dev", va, NULL) |
              run_ip("-n", nb, "addr", "add", "10.231.78.2/24", "dev", vb, NULL) |
              run_ip("-n", na, "link", "set", va, "up", NULL, NULL) |
              run_ip("-n", nb, "link", "set", vb, "up", NULL, NULL);
    CHECK(bad == 0);
    lost_board *b =
        mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (bad == 0 && b != MAP_FAILED) {
        memset(b, 0, sizeof *b);
        fflush(stderr);
        pid_t ps = fork();
        if (ps == 0) {
            alarm(120);
            lost_end(b, na, 1);
        }
        pid_t pr = fork();
        if (pr == 0) {
            alarm(120);
            lost_end(b, nb, 0);
        }
        double t0 = now_ms();
        while (atomic_load(&b->sent) < 4 && !atomic_load(&b->err[0]) && !atomic_load(&b->err[1]) &&
               now_ms() - t0 < 20000) {
            sleep_ms(5);
        }
        CHECK(atomic_load(&b->sent) >= 4);
        double down = now_ms();
        CHECK(run_ip("-n", nb, "link", "set", vb, "down", NULL, NULL) == 0);
        while ((!atomic_load(&b->err[0]) || !atomic_load(&b->err[1])) && now_ms() - down < 60000) {
            sleep_ms(20);
        }
        for (int e = 0; e < 2; e++) {
            double after = b->err_at[e] - down;
            CHECK(atomic_load(&b->err[e]) == MMP_ERR_PEER && after > 15000 && after < 40000 &&
                  strstr(b->msg[e], b->addr) != NULL);
            fprintf(stderr, "  tcp host-lost: the %s end: %.1f s after the link went down: %s\n",
                    e ? "sending" : "receiving", after / 1e3, b->msg[e]);
        }
        kill(ps, SIGKILL);
        kill(pr, SIGKILL);
        waitpid(ps, NULL, 0);
        waitpid(pr, NULL, 0);
    }
    if (b != MAP_FAILED) {
        munmap(b, sizeof *b);
    }
    run_ip("netns", "del", na, NULL, NULL, NULL, NULL, NULL); /* its veth end goes with it */
    run_ip("netns", "del", nb, NULL, NULL, NULL, NULL, NULL);
}

static void test_forged(const mmp_transport *t)
{
    if (same_process_only(t, "forged-headers")) {
        return;
    }
    if (network(t)) {
        test_forged_tcp(t);
        return;
    }
    enum { SLOT = FORGED_SLOT, SLOTS = 4 };
    char addr[96];
    fresh_address(addr, sizeof addr);
    mmp_channel *a = NULL, *b = NULL;
    mmp_channel_cfg cs = make_cfg(addr, SLOT, SLOTS, 1, 1000);
    mmp_channel_cfg cr = make_cfg(addr, SLOT, SLOTS, 0, 1000);
    forger f = {0};
    CHECK_OK(mmp_channel_open_with(&a, t, &cs, 1));
    CHECK(forger_map(&f, addr) == 0); /* before the connect unlinks the name */
    CHECK_OK(mmp_channel_open_with(&b, t, &cr, 0));
    if (!a || !b || !f.base) {
        goto exit;
    }
    unsigned char src[64];
    for (size_t r = 0; r < sizeof forged_rows / sizeof forged_rows[0]; r++) {
        mmp_msg_header h = {
            .step = 1, .mb = 2, .n = 3, .bytes = 8, .digest = 0xF0F6ED0000000000ull + r};
        memset(src, (int)r, sizeof src);
        CHECK_OK(mmp_channel_send(a, &h, src));
        mmp_msg_header *raw = forger_find(&f, h.digest);
        CHECK(raw != NULL);
        if (!raw) {
            break;
        }
        forge(raw, r);
        mmp_msg_header got;
        const void *p = NULL;
        mmp_err e = mmp_channel_recv(b, &got, &p);
        CHECK(e == MMP_ERR_PROTO);
        CHECK(e == MMP_ERR_PROTO && names_forged_field(r));
        if (e == MMP_OK) {
            mmp_channel_release(b);
            continue;
        }
        /* Nothing was taken: mend the header and the message comes through. */
        *raw = h;
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        CHECK(same_header(&h, &got) && p && memcmp(p, src, 8) == 0);
        CHECK_OK(mmp_channel_release(b));
    }

    /* The released counter, forged beyond what was posted: found as the word
     * that a release moves by one. The sender reads it when it next needs a
     * credit it has not seen yet, at the latest a ring later, and refuses it
     * whether it waits (acquire) or not (try_acquire). Mended afterwards. */
    for (int use_try = 1; use_try >= 0; use_try--) {
        mmp_msg_header h = {.step = 1, .n = 1, .bytes = 0, .digest = 0xF0F6ED000000AA00ull};
        mmp_msg_header got;
        const void *p;
        enum { SCAN = 4096 };
        size_t scan = SCAN < f.bytes ? SCAN : f.bytes;
        unsigned char before[SCAN];
        size_t at[8];
        uint64_t was_at[8];
        int found = 0;
        CHECK_OK(mmp_channel_send(a, &h, NULL));
        CHECK_OK(mmp_channel_recv(b, &got, &p));
        memcpy(before, f.base, scan);
        CHECK_OK(mmp_channel_release(b));
        for (size_t off = 0; off + 8 <= scan && found < 8; off += 8) {
            uint64_t was, now;
            memcpy(&was, before + off, 8);
            memcpy(&now, f.base + off, 8);
            if (now == was + 1) {
                at[found] = off;
                was_at[found++] = now;
                uint64_t bad = now + 100;
                memcpy(f.base + off, &bad, 8);
            }
        }
        CHECK(found >= 1);
        int posted = 0, refused = 0;
        for (int k = 0; k <= SLOTS && !refused && found; k++) {
            void *q = NULL;
            mmp_err e = use_try ? mmp_channel_try_acquire(a, &q) : mmp_channel_acquire(a, &q);
            if (e == MMP_OK) {
                mmp_msg_header m = {.step = 2, .mb = k, .n = 1, .bytes = 0};
                CHECK_OK(mmp_channel_post(a, &m));
                posted++;
            } else {
                CHECK(e == MMP_ERR_PROTO && strstr(mmp_last_error(), "field tail") != NULL);
                refused = 1;
            }
        }
        CHECK(refused);
        for (int i = 0; i < found; i++) {
            memcpy(f.base + at[i], &was_at[i], 8);
        }
        for (int k = 0; k < posted; k++) { /* the channel works on */
            CHECK_OK(mmp_channel_recv(b, &got, &p));
            CHECK(got.step == 2 && got.mb == k);
            CHECK_OK(mmp_channel_release(b));
        }
    }

    /* The posted counter, forged more than a ring ahead of the receiver:
     * found as the word before the first header that a post moves by one
     * (other such words are doorbells, harmless to overwrite). */
    {
        mmp_msg_header h = {
            .step = 1, .mb = 0, .n = 1, .bytes = 0, .digest = 0xF0F6ED00000000FFull};
        size_t scan = 4096 < f.bytes ? 4096 : f.bytes;
        unsigned char before[4096];
        memcpy(before, f.base, scan);
        CHECK_OK(mmp_channel_send(a, &h, NULL));
        mmp_msg_header *raw = forger_find(&f, h.digest);
        size_t limit = raw ? (size_t)((unsigned char *)raw - f.base) : 0;
        limit = limit / 8 * 8;
        int forged = 0;
        for (size_t off = 0; off + 8 <= limit && off + 8 <= scan; off += 8) {
            uint64_t was, now;
            memcpy(&was, before + off, 8);
            memcpy(&now, f.base + off, 8);
            if (now == was + 1) {
                uint64_t bad = now + SLOTS + 5;
                memcpy(f.base + off, &bad, 8);
                forged++;
            }
        }
        CHECK(forged >= 1);
        mmp_msg_header got;
        const void *p;
        CHECK(mmp_channel_recv(b, &got, &p) == MMP_ERR_PROTO);
        CHECK(strstr(mmp_last_error(), "field head") != NULL);
    }
exit:
    if (f.base) {
        munmap(f.base, f.bytes);
    }
    mmp_channel_close(a);
    mmp_channel_close(b);
}

/* ---- the table -------------------------------------------------------------
 * Every case of `per_transport` runs once per transport of the build, named
 * "<transport>/<case>" (`test_transport shm/ordered` runs one alone, --list
 * names them); a device transport's cases are skipped (noted, not failed)
 * when no device is visible, so the suite still judges shm. A new transport
 * adds one TRANSPORT_CASES line and one table line. */

#ifdef MMP_HAVE_CUDA
/* Devices visible to a child (so this process never initialises CUDA). */
static int probe_devices(void)
{
    int fds[2];
    if (pipe(fds) != 0) {
        return 0;
    }
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            n = 0;
        }
        ssize_t w = write(fds[1], &n, sizeof n);
        _exit(w == (ssize_t)sizeof n ? 0 : 1);
    }
    close(fds[1]);
    int n = 0;
    if (pid < 0 || read(fds[0], &n, sizeof n) != (ssize_t)sizeof n) {
        n = 0;
    }
    close(fds[0]);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
    }
    return n;
}
#endif

static void report(const char *transport, const char *name, int before, double t0)
{
    CHECK(mmp_test_shm_count(prefix, 1) == 0);
    fprintf(stderr, "%s %-16s %s (%.0f ms)\n", transport, name,
            mmp_test_failures == before ? "ok" : "FAILED", now_ms() - t0);
}

/* Runs case fn (called `name`) on t: skipped when t needs a device and none
 * is visible, or when the case needs a capability t lacks. */
static void run_case(const mmp_transport *t, const char *name, void (*fn)(const mmp_transport *),
                     unsigned needs)
{
    if ((t->caps & needs) != needs) {
        fprintf(stderr, "%s %-16s skipped: not a device transport\n", t->name, name);
        return;
    }
    if (device(t)) {
#ifdef MMP_HAVE_CUDA
        if (n_devices < 0) {
            n_devices = probe_devices();
        }
#endif
        if (n_devices <= 0) {
            fprintf(stderr, "%s %-16s skipped: no CUDA device\n", t->name, name);
            return;
        }
    }
    int before = mmp_test_failures;
    double t0 = now_ms();
    fn(t);
    report(t->name, name, before, t0);
}

static void run_global(const char *name, void (*fn)(void))
{
    int before = mmp_test_failures;
    double t0 = now_ms();
    fn();
    report("-", name, before, t0);
}

#define DEV MMP_TRANSPORT_DEVICE_SLOTS
/* One wrapper per (transport, case): the harness's cases take no argument. */
#define CASE(tr, fn, needs)                                                                        \
    static void tr##_##fn(void)                                                                    \
    {                                                                                              \
        run_case(&mmp_transport_##tr, #fn, test_##fn, needs);                                      \
    }
#define TRANSPORT_CASES(tr)                                                                        \
    CASE(tr, ordered, 0)                                                                           \
    CASE(tr, credit, 0)                                                                            \
    CASE(tr, zero_copy, 0)                                                                         \
    CASE(tr, try_acquire, 0)                                                                       \
    CASE(tr, mismatch, 0)                                                                          \
    CASE(tr, mismatch_apart, 0)                                                                    \
    CASE(tr, no_creator, 0)                                                                        \
    CASE(tr, no_creator_apart, 0)                                                                  \
    CASE(tr, creator_gone, 0)                                                                      \
    CASE(tr, peer_death, 0)                                                                        \
    CASE(tr, big, 0)                                                                               \
    CASE(tr, forged, 0)
#define TRANSPORT_TABLE(tr)                                                                        \
    {#tr "/ordered", tr##_ordered}, {#tr "/credit", tr##_credit},                                  \
        {#tr "/zero-copy", tr##_zero_copy}, {#tr "/try-acquire", tr##_try_acquire},                \
        {#tr "/mismatch", tr##_mismatch}, {#tr "/mismatch-apart", tr##_mismatch_apart},            \
        {#tr "/no-creator", tr##_no_creator}, {#tr "/no-creator-apart", tr##_no_creator_apart},    \
        {#tr "/creator-gone", tr##_creator_gone}, {#tr "/peer-death", tr##_peer_death},            \
        {#tr "/big-slot", tr##_big},                                                               \
    {                                                                                              \
#tr "/forged-headers", tr##_forged                                                         \
    }

TRANSPORT_CASES(shm)
TRANSPORT_CASES(tcp)
CASE(tcp, host_lost, 0)
CASE(tcp, idle_strangers, 0)
#ifdef MMP_HAVE_CUDA
TRANSPORT_CASES(cuda_ipc)
CASE(cuda_ipc, ordered_streams, DEV)
CASE(cuda_ipc, no_host_sync, DEV)
CASE(cuda_ipc, open_gpu, DEV)
#endif

/* Not per transport: the priority list and shm's crash clean-up. */
static void channel_open(void)
{
    run_global("channel-open", test_open);
}

static void unlink_prefix(void)
{
    run_global("unlink-prefix", test_unlink_prefix);
}

static void endpoint_check(void)
{
    run_global("endpoint-check", test_endpoint_check);
}

static void spin_env(void)
{
    run_global("shm-spin-env", test_spin_env);
}

static void idle_cpu(void)
{
    run_global("shm-idle-cpu", test_idle_cpu);
}

static const mmp_test_case cases[] = {
    TRANSPORT_TABLE(shm),
    TRANSPORT_TABLE(tcp),
    {"tcp/host-lost", tcp_host_lost},
    {"tcp/idle-strangers", tcp_idle_strangers},
#ifdef MMP_HAVE_CUDA
    TRANSPORT_TABLE(cuda_ipc),
    {"cuda_ipc/ordered-streams", cuda_ipc_ordered_streams},
    {"cuda_ipc/no-host-sync", cuda_ipc_no_host_sync},
    {"cuda_ipc/channel-open", cuda_ipc_open_gpu},
#endif
    {"channel-open", channel_open},
    {"unlink-prefix", unlink_prefix},
    {"endpoint-check", endpoint_check},
    {"shm-spin-env", spin_env},
    {"shm-idle-cpu", idle_cpu},
};

int main(int argc, char **argv)
{
    snprintf(prefix, sizeof prefix, "/mmpipe-test-%d-", (int)getpid());
    alarm(600);
    int rc = MMP_TEST_MAIN("test_transport", cases, argc, argv);
    mmp_shm_unlink_prefix(prefix); /* whatever a failure left */
    return rc;
}
