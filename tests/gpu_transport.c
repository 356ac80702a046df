/* The data-channel conformance properties (tests/test_transport.c) for the
 * cuda_ipc transport, whose slots are device memory, plus the one property
 * only it has: no host synchronisation on the data path.
 *
 * Every end runs in its own forked child, and this parent process never calls
 * CUDA (not even to count devices: a probe child does), because a CUDA
 * context does not survive fork and cudaIpcOpenMemHandle refuses a handle
 * from its own process. So there is no "two threads" run here, unlike
 * test_transport.c. Payloads are written and read with cudaMemcpy of known
 * patterns, on the legacy default stream or (streams=1) on each end's own
 * non-blocking stream with asynchronous device-to-device copies, where only
 * the channel's events order the two processes' work.
 *
 * Properties: ordered delivery with headers and slot reuse (1, 2, 4 slots,
 * either end creating, both stream modes, two devices when there are two),
 * credit flow control and the acquire timeout, geometry/role mismatch and
 * misuse, connect without a creator, peer death either way, a 16 MB slot,
 * mmp_channel_open's choice, and no name left in /dev/shm after any case.
 *
 * Known gap (see transport/cuda/cuda_ipc.c): after the creator dies, the slots
 * it posted are delivered (headers, order) but their payloads are not read.
 *
 * UNVERIFIED: written on a machine without a GPU, where it only skips. On a
 * GPU machine:
 *   cmake -S . -B build -DMMP_CUDA=ON && cmake --build build -j
 *   ctest --test-dir build -R gpu_transport --output-on-failure
 * Exit 77 (skipped) when built without CUDA or no device is visible. */
#include "tests/harness.h"
#include "tests/transport_msgs.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_transport", "built without CUDA");
}

#else

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "transport/channel.h"

#define NAME "gpu_transport"

static const mmp_transport *const T = &mmp_transport_cuda_ipc;
static int n_devices;

/* ---- names, time, messages (as in test_transport.c) ---------------------- */

static char prefix[64]; /* "/mmpipe-gtest-<pid>-" */
static int next_name;

static const char *fresh_address(char *buf, size_t n)
{
    snprintf(buf, n, "%s%d", prefix, next_name++);
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
                         .on_gpu = 1,
                         .device = 0};
    return c;
}

/* A CUDA call in a test body: a failure is a problem, and the body stops. */
#define CU(count, call)                                                                            \
    do {                                                                                           \
        cudaError_t ce_ = (call);                                                                  \
        if (ce_ != cudaSuccess) {                                                                  \
            PROBLEM(count, "%s: %s", #call, cudaGetErrorString(ce_));                              \
            return count;                                                                          \
        }                                                                                          \
    } while (0)

/* ---- two ends, two children ------------------------------------------------ */

typedef struct shared {
    _Atomic int flag[4];
} shared;

typedef struct side side;
struct side {
    mmp_channel_cfg cfg;
    int creator;
    int n;
    int streams; /* 1: an own non-blocking stream and async copies */
    int opens;   /* 1: body opens the channel itself (ch is NULL) */
    shared *sh;
    int (*body)(side *s, mmp_channel *ch);
};

static void make_ends(side *snd, side *rcv, mmp_channel_cfg cfg, int creator_sends, int n,
                      shared *sh)
{
    *snd = (side){.cfg = cfg, .creator = creator_sends, .n = n, .sh = sh};
    *rcv = *snd;
    snd->cfg.send = 1;
    rcv->cfg.send = 0;
    rcv->creator = !creator_sends;
}

/* Runs in a child: this is the process's first CUDA use. */
static int side_main(side *s)
{
    int bad = 0;
    cudaStream_t st = NULL;
    CU(bad, cudaSetDevice(s->cfg.device));
    if (s->streams) {
        CU(bad, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        s->cfg.cuda_stream = st;
    }
    if (s->opens) {
        bad += s->body(s, NULL);
    } else {
        mmp_channel *ch = NULL;
        mmp_err e = mmp_channel_open_with(&ch, T, &s->cfg, s->creator);
        if (e != MMP_OK) {
            PROBLEM(bad, "%s: %s: %s", s->creator ? "setup" : "connect", mmp_err_name(e),
                    mmp_last_error());
        } else {
            bad += s->body(s, ch);
            mmp_channel_close(ch);
        }
    }
    if (st) {
        cudaStreamDestroy(st);
    }
    return bad;
}

static pid_t spawn(side *s)
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        _exit(side_main(s) ? 1 : 0);
    }
    return pid;
}

/* Both ends in children; how many of them failed. A `dying` end must end by
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

/* ---- (1) ordered delivery, data integrity, slot reuse ---------------------- */

static int send_ordered(side *s, mmp_channel *ch)
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
                CU(bad, cudaMemcpy(p, host, h.bytes, cudaMemcpyHostToDevice));
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

static int recv_ordered(side *s, mmp_channel *ch)
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
            CU(bad, cudaMemcpy(host, p, h.bytes, cudaMemcpyDeviceToHost));
            e = mmp_channel_release(ch);
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

static void test_ordered(void)
{
    char addr[96];
    shared *sh = new_shared();
    struct {
        int slots, creator_sends, streams, two_devices;
    } runs[] = {{1, 1, 0, 0}, {2, 0, 0, 0}, {4, 1, 1, 0}, {3, 0, 1, 0}, {2, 1, 1, 1}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (runs[r].two_devices && n_devices < 2) {
            fprintf(stderr, "  ordered: one device, the two-device run is left out\n");
            continue;
        }
        fresh_address(addr, sizeof addr);
        side snd, rcv;
        make_ends(&snd, &rcv, make_cfg(addr, 3000, runs[r].slots, 1, 10000), runs[r].creator_sends,
                  300, sh);
        snd.streams = rcv.streams = runs[r].streams;
        if (runs[r].two_devices) {
            rcv.cfg.device = n_devices - 1;
        }
        snd.body = send_ordered;
        rcv.body = recv_ordered;
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

/* ---- (2) credits ------------------------------------------------------------ */

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

static void test_credit(void)
{
    char addr[96];
    shared *sh = new_shared();
    side snd, rcv;
    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, 64, 2, 1, 10000), 1, 3, sh);
    snd.body = send_credit;
    rcv.body = recv_credit;
    CHECK(run_ends(&snd, &rcv, 0) == 0);

    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, 64, 1, 1, 200), 1, 1, sh);
    snd.body = send_timeout;
    rcv.body = recv_hold;
    CHECK(run_ends(&snd, &rcv, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (3) no host synchronisation on the data path --------------------------
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

static void test_no_host_sync(void)
{
    char addr[96];
    shared *sh = new_shared();
    side snd, rcv;
    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, NHS_BYTES, 1, 1, 10000), 1, 2, sh);
    snd.body = send_nhs;
    rcv.body = recv_nhs;
    CHECK(run_ends(&rcv, &snd, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (4) geometry and misuse ------------------------------------------------ */

static int creator_mismatch(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *a = NULL, *x = NULL;
    mmp_channel_cfg nameless = make_cfg("no-slash", 64, 2, 1, 100);
    if (mmp_channel_open_with(&x, T, &nameless, 1) != MMP_ERR_INVALID || x) {
        PROBLEM(bad, "setup without a shm name");
    }
    mmp_channel_cfg noslots = s->cfg;
    noslots.slots = 0;
    if (mmp_channel_open_with(&x, T, &noslots, 1) != MMP_ERR_INVALID || x) {
        PROBLEM(bad, "setup with 0 slots");
    }
    if (mmp_channel_open_with(&a, T, &s->cfg, 1) != MMP_OK) {
        PROBLEM(bad, "setup: %s", mmp_last_error());
        atomic_store(&s->sh->flag[0], -1000);
        return bad;
    }
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
    wait_flag(s->sh, 2, 1); /* the receiver closed */
    if (mmp_channel_post(a, &h) != MMP_OK) {
        PROBLEM(bad, "post of the acquired slot: %s", mmp_last_error());
    }
    double t0 = now_ms();
    if (mmp_channel_acquire(a, &q) != MMP_ERR_PEER || now_ms() - t0 > 50) {
        PROBLEM(bad, "acquire after the receiver closed is not an immediate peer error");
    }
    mmp_channel_close(a);
    return bad;
}

static int connector_mismatch(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *b = NULL;
    wait_flag(s->sh, 0, 1);
    if (atomic_load(&s->sh->flag[0]) < 0) {
        return 1;
    }
    mmp_channel_cfg c = s->cfg;
    c.slots = 4;
    if (mmp_channel_open_with(&b, T, &c, 0) != MMP_ERR_PROTO || b ||
        !strstr(mmp_last_error(), "2 slots") ||
        !strstr(mmp_last_error(), "4 slots")) {
        PROBLEM(bad, "4 slots against 2: %s", mmp_last_error());
    }
    c = s->cfg;
    c.slot_bytes = 8192;
    if (mmp_channel_open_with(&b, T, &c, 0) != MMP_ERR_PROTO || b ||
        !strstr(mmp_last_error(), "8192")) {
        PROBLEM(bad, "8192 bytes against 4096: %s", mmp_last_error());
    }
    c = s->cfg;
    c.send = 1;
    if (mmp_channel_open_with(&b, T, &c, 0) != MMP_ERR_PROTO || b) {
        PROBLEM(bad, "both ends send");
    }
    /* An end that picked shm for the same name is told, not left hanging. */
    c = s->cfg;
    c.on_gpu = 0;
    if (mmp_channel_open_with(&b, &mmp_transport_shm, &c, 0) != MMP_ERR_PROTO || b) {
        PROBLEM(bad, "shm connect to a cuda_ipc name: %s", mmp_last_error());
    }
    if (mmp_channel_open_with(&b, T, &s->cfg, 0) != MMP_OK) {
        PROBLEM(bad, "connect: %s", mmp_last_error());
        atomic_store(&s->sh->flag[1], 1);
        atomic_store(&s->sh->flag[2], 1);
        return bad;
    }
    atomic_store(&s->sh->flag[1], 1);
    mmp_msg_header h, want = message(7, 4096);
    const void *p;
    void *q;
    unsigned char host[4096];
    if (mmp_channel_recv(b, &h, &p) != MMP_OK || !same_header(&h, &want)) {
        PROBLEM(bad, "recv: %s", mmp_last_error());
    } else {
        CU(bad, cudaMemcpy(host, p, h.bytes, cudaMemcpyDeviceToHost));
        if (first_bad(host, h.bytes, 7) != h.bytes) {
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
    mmp_channel_close(b);
    mmp_channel_close(NULL);
    atomic_store(&s->sh->flag[2], 1);
    return bad;
}

static void test_mismatch(void)
{
    char addr[96];
    shared *sh = new_shared();
    side snd, rcv;
    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, 4096, 2, 1, 1000), 1, 1, sh);
    snd.opens = rcv.opens = 1;
    snd.body = creator_mismatch;
    rcv.body = connector_mismatch;
    CHECK(run_ends(&snd, &rcv, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (5) no creator, creator gone ------------------------------------------ */

static int connect_nobody(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *b = NULL;
    double t0 = now_ms();
    mmp_err e = mmp_channel_open_with(&b, T, &s->cfg, 0);
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
    if (mmp_channel_open_with(&a, T, &s->cfg, 1) != MMP_OK) {
        PROBLEM(bad, "setup: %s", mmp_last_error());
        return bad;
    }
    if (mmp_test_shm_count(s->cfg.address, 0) != 1) {
        PROBLEM(bad, "setup made no name");
    }
    mmp_channel_close(a);
    if (mmp_test_shm_count(s->cfg.address, 0) != 0) {
        PROBLEM(bad, "a creator closed before any connect left its name");
    }
    return bad;
}

static int setup_die(side *s, mmp_channel *unused)
{
    (void)unused;
    mmp_channel *a = NULL;
    if (mmp_channel_open_with(&a, T, &s->cfg, 1) == MMP_OK) {
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

static void test_no_creator(void)
{
    char addr[96];
    shared *sh = new_shared();
    side a, b;
    fresh_address(addr, sizeof addr);
    make_ends(&a, &b, make_cfg(addr, 64, 2, 1, 300), 1, 1, sh);
    a.opens = b.opens = 1;
    a.body = idle;
    b.body = connect_nobody;
    CHECK(run_ends(&a, &b, 0) == 0);
    munmap(sh, sizeof *sh);
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

static void test_creator_gone(void)
{
    char addr[96];
    shared *sh = new_shared();
    side a, b;
    /* A creator that closed before anyone connected took its name along. */
    fresh_address(addr, sizeof addr);
    make_ends(&a, &b, make_cfg(addr, 64, 2, 1, 300), 1, 1, sh);
    a.opens = b.opens = 1;
    a.body = setup_close;
    b.body = connect_nobody;
    CHECK(run_in_turn(&a, 0, &b) == 0);
    /* A creator SIGKILLed before anyone connected: connect reports it, and
     * removes the name the dead creator could not. */
    fresh_address(addr, sizeof addr);
    make_ends(&a, &b, make_cfg(addr, 64, 2, 1, 300), 1, 0, sh);
    a.opens = b.opens = 1;
    a.body = setup_die;
    b.body = connect_nobody;
    CHECK(run_in_turn(&a, 1, &b) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (6) a peer dies -------------------------------------------------------- */

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
            if (waited > 1200) {
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
    unsigned char host[256];
    for (int k = 0; k < 3; k++) {
        void *p;
        mmp_msg_header h = message(k, 256);
        fill(host, h.bytes, (uint64_t)k);
        if (mmp_channel_acquire(ch, &p) != MMP_OK ||
            cudaMemcpy(p, host, h.bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
            mmp_channel_post(ch, &h) != MMP_OK) {
            return 1;
        }
    }
    wait_flag(s->sh, 0, 1);
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
            /* Posted before the death: delivered in order. The payload lived
             * in the dead creator's allocation, so it is not read (the known
             * gap of legacy cudaIpc, see cuda_ipc.c). */
            if (e != MMP_OK || !same_header(&h, &want)) {
                PROBLEM(bad, "recv %d (posted before the sender died): %s: %s", k, mmp_err_name(e),
                        mmp_last_error());
            }
            mmp_channel_release(ch);
        } else if (e != MMP_ERR_PEER || waited > 1200) {
            PROBLEM(bad, "recv after the sender died: %s after %.0f ms", mmp_err_name(e), waited);
        }
    }
    return bad;
}

static void test_peer_death(void)
{
    char addr[96];
    shared *sh = new_shared();
    side snd, rcv;
    /* timeout_ms 0: only noticing the death can end the waits. */
    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, 256, 2, 1, 0), 1, 0, sh);
    snd.body = send_until_peer;
    rcv.body = recv_then_die;
    CHECK(run_ends(&snd, &rcv, 1) == 0);

    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, 256, 4, 1, 0), 1, 0, sh);
    snd.body = send_then_die;
    rcv.body = recv_until_peer;
    CHECK(run_ends(&rcv, &snd, 1) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (7) a large slot ------------------------------------------------------- */

#define BIG (16u << 20)

static int send_big(side *s, mmp_channel *ch)
{
    int bad = 0;
    unsigned char *host = malloc(BIG);
    for (int k = 0; k < s->n && host && !bad; k++) {
        void *p;
        mmp_msg_header h = message(k, BIG);
        h.bytes = BIG - (k % 2) * 13;
        fill(host, h.bytes, (uint64_t)k);
        if (mmp_channel_acquire(ch, &p) != MMP_OK) {
            PROBLEM(bad, "acquire %d: %s", k, mmp_last_error());
            break;
        }
        CU(bad, cudaMemcpy(p, host, h.bytes, cudaMemcpyHostToDevice));
        if (mmp_channel_post(ch, &h) != MMP_OK) {
            PROBLEM(bad, "post %d: %s", k, mmp_last_error());
        }
    }
    free(host);
    return bad + !host;
}

static int recv_big(side *s, mmp_channel *ch)
{
    int bad = 0;
    unsigned char *host = malloc(BIG);
    for (int k = 0; k < s->n && host && !bad; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            break;
        }
        CU(bad, cudaMemcpy(host, p, h.bytes, cudaMemcpyDeviceToHost));
        size_t at = first_bad(host, h.bytes, (uint64_t)k);
        if (h.bytes != BIG - (k % 2) * 13 || at != h.bytes) {
            PROBLEM(bad, "message %d: %llu bytes, differs at %zu", k, (unsigned long long)h.bytes,
                    at);
        }
        mmp_channel_release(ch);
    }
    free(host);
    return bad + !host;
}

static void test_big(void)
{
    char addr[96];
    shared *sh = new_shared();
    side snd, rcv;
    fresh_address(addr, sizeof addr);
    make_ends(&snd, &rcv, make_cfg(addr, BIG, 2, 1, 10000), 1, 6, sh);
    snd.body = send_big;
    rcv.body = recv_big;
    CHECK(run_ends(&rcv, &snd, 0) == 0);
    munmap(sh, sizeof *sh);
}

/* ---- (8) mmp_channel_open picks cuda_ipc for on_gpu edges only -------------- */

static int open_end(side *s, mmp_channel *unused)
{
    (void)unused;
    int bad = 0;
    mmp_channel *ch = NULL;
    if (mmp_channel_open(&ch, NULL, &s->cfg, s->creator) != MMP_OK) {
        PROBLEM(bad, "open: %s", mmp_last_error());
        return bad;
    }
    const mmp_transport *used = mmp_channel_transport(ch);
    const mmp_transport *want = s->cfg.on_gpu ? T : &mmp_transport_shm;
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
    mmp_channel_close(ch);
    return bad;
}

static void test_open(void)
{
    char addr[96];
    shared *sh = new_shared();
    for (int gpu = 1; gpu >= 0; gpu--) {
        side snd, rcv;
        fresh_address(addr, sizeof addr);
        make_ends(&snd, &rcv, make_cfg(addr, 64, 2, 1, 2000), 1, 0, sh);
        snd.cfg.on_gpu = rcv.cfg.on_gpu = gpu;
        snd.opens = rcv.opens = 1;
        snd.body = rcv.body = open_end;
        CHECK(run_ends(&snd, &rcv, 0) == 0);
    }
    munmap(sh, sizeof *sh);
}

/* ---- main ----------------------------------------------------------------------- */

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

int main(void)
{
    n_devices = probe_devices();
    if (n_devices <= 0) {
        return mmp_test_skip(NAME, "no CUDA device");
    }
    snprintf(prefix, sizeof prefix, "/mmpipe-gtest-%d-", (int)getpid());
    alarm(300);
    struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {
        {"ordered", test_ordered},           {"credit", test_credit},
        {"no-host-sync", test_no_host_sync}, {"mismatch", test_mismatch},
        {"no-creator", test_no_creator},     {"creator-gone", test_creator_gone},
        {"peer-death", test_peer_death},     {"big-slot", test_big},
        {"channel-open", test_open},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int before = mmp_test_failures;
        double t0 = now_ms();
        cases[c].fn();
        CHECK(mmp_test_shm_count(prefix, 1) == 0);
        fprintf(stderr, "cuda_ipc %-14s %s (%.0f ms)\n", cases[c].name,
                mmp_test_failures == before ? "ok" : "FAILED", now_ms() - t0);
    }
    mmp_shm_unlink_prefix(prefix);
    return mmp_test_finish(NAME);
}

#endif
