/* Benchmark of the cuda_ipc data channel; prints a Markdown table, judges
 * nothing. Exits 77 when built without CUDA or no device is visible.
 *
 * Per micro-batch size (1, 4, 16, 64 MB; slots=2, both ends on device 0, the
 * legacy default stream), median over --reps hand-offs, one at a time (the
 * sender waits until the receiver has finished one before posting the next,
 * so no queueing hides in the numbers):
 *   hand-off   the sender acquires a slot and posts it without writing (as a
 *              stage whose kernels wrote its output in place, zero-copy); the
 *              time from just before post to the receiver's stream having
 *              passed the slot's event (recv, then cudaStreamSynchronize --
 *              the bench's own wait to see the device, not part of recv) and
 *              release. CLOCK_MONOTONIC is system-wide, so the two processes'
 *              stamps compare. Effective bytes/s = size / that time.
 *   send       the same with mmp_channel_send from a device buffer of the
 *              sender's (a D2D cudaMemcpyAsync into the slot: what a stage
 *              that produced into its own buffer pays).
 *   memcpy     cudaMemcpy device-to-device of the same size in one process,
 *              timed with events (bytes/s counts the size once, not read +
 *              write).
 * Both ways cuda_ipc can signal a slot are measured (MMP_CIPC_SYNC=memops:
 * stream memory operations on flag words, events: interprocess events), with
 * where a hand-off's time goes (post call, wake-up, device wait, release).
 * Every process is a fresh fork; the parent never touches CUDA.
 *
 * On a GPU machine (scripts/gpu-check runs it; figures in the README):
 *   cmake --build build --target bench_cuda_ipc && ./build/bench/bench_cuda_ipc
 * Options: --reps N (default 100), --sizes 1,4,16,64 (MB). */
#include <stdio.h>

#ifndef MMP_HAVE_CUDA

int main(void)
{
    fprintf(stderr, "bench_cuda_ipc: built without CUDA\n");
    return 77;
}

#else

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
#include "common/progress.h"
#include "common/stats.h"
#include "transport/channel.h"

#define MAX_REPS 1000
#define MAX_SIZES 8
#define WARMUP 5

static double now_us(void)
{
    return mmp_now() * 1e6; /* CLOCK_MONOTONIC */
}

/* Shared by the processes of one measurement (anonymous MAP_SHARED). */
typedef struct shared {
    _Atomic int done; /* hand-offs the receiver finished */
    _Atomic int failed;
    double posted[MAX_REPS + WARMUP];   /* sender: just before post / send */
    double post_end[MAX_REPS + WARMUP]; /* sender: post / send returned */
    double got[MAX_REPS + WARMUP];      /* receiver: recv returned */
    double synced[MAX_REPS + WARMUP];   /* receiver: its stream passed the event */
    double ready[MAX_REPS + WARMUP];    /* receiver: released */
    double result_us;                   /* median of the measured quantity */
    double phase_us[4];                 /* medians: post call, post->recv, recv->synced, release */
} shared;

#define FAIL(sh, ...)                                                                              \
    do {                                                                                           \
        fprintf(stderr, "bench_cuda_ipc: " __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                                     \
        atomic_store(&(sh)->failed, 1);                                                            \
        _exit(1);                                                                                  \
    } while (0)

static void sender(shared *sh, mmp_channel_cfg cfg, int n, int copy, const char *sync)
{
    setenv("MMP_CIPC_SYNC", sync, 1); /* the creator picks the channel's signalling */
    const mmp_transport *t = &mmp_transport_cuda_ipc;
    mmp_channel *ch = NULL;
    void *src = NULL;
    if (cudaSetDevice(cfg.device) != cudaSuccess ||
        (copy && cudaMalloc(&src, cfg.slot_bytes) != cudaSuccess)) {
        FAIL(sh, "sender: device set-up failed");
    }
    if (copy && cudaMemset(src, 1, cfg.slot_bytes) != cudaSuccess) {
        FAIL(sh, "sender: cudaMemset");
    }
    if (mmp_channel_open_with(&ch, t, &cfg, 1) != MMP_OK) {
        FAIL(sh, "sender: %s", mmp_last_error());
    }
    mmp_msg_header h = {.bytes = cfg.slot_bytes};
    for (int k = 0; k < n; k++) {
        while (atomic_load(&sh->done) < k) {
            if (atomic_load(&sh->failed)) {
                _exit(1);
            }
        }
        h.step = k;
        sh->posted[k] = now_us();
        mmp_err e;
        if (copy) {
            e = mmp_channel_send(ch, &h, src);
        } else {
            void *p;
            e = mmp_channel_acquire(ch, &p);
            if (e == MMP_OK) {
                e = mmp_channel_post(ch, &h);
            }
        }
        sh->post_end[k] = now_us();
        if (e != MMP_OK) {
            FAIL(sh, "sender %d: %s", k, mmp_last_error());
        }
    }
    while (atomic_load(&sh->done) < n && !atomic_load(&sh->failed)) {
        usleep(100);
    }
    mmp_channel_close(ch);
    cudaFree(src);
    _exit(0);
}

static void receiver(shared *sh, mmp_channel_cfg cfg, int n)
{
    const mmp_transport *t = &mmp_transport_cuda_ipc;
    mmp_channel *ch = NULL;
    if (cudaSetDevice(cfg.device) != cudaSuccess) {
        FAIL(sh, "receiver: cudaSetDevice");
    }
    if (mmp_channel_open_with(&ch, t, &cfg, 0) != MMP_OK) {
        FAIL(sh, "receiver: %s", mmp_last_error());
    }
    for (int k = 0; k < n; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK || h.step != k) {
            FAIL(sh, "receiver %d: %s", k, mmp_last_error());
        }
        sh->got[k] = now_us();
        /* The bench's own wait, to stamp when the device passed the event. */
        if (cudaStreamSynchronize(NULL) != cudaSuccess) {
            FAIL(sh, "receiver %d: sync", k);
        }
        sh->synced[k] = now_us();
        if (mmp_channel_release(ch) != MMP_OK) {
            FAIL(sh, "receiver %d: release", k);
        }
        sh->ready[k] = now_us();
        atomic_store(&sh->done, k + 1);
    }
    double d[MAX_REPS];
    int m = n - WARMUP;
    for (int k = 0; k < m; k++) {
        d[k] = sh->ready[k + WARMUP] - sh->posted[k + WARMUP];
    }
    sh->result_us = mmp_median(d, m);
    /* where the time goes (the one-line breakdown under the table) */
    double *from[4] = {sh->posted, sh->post_end, sh->got, sh->synced};
    double *to[4] = {sh->post_end, sh->got, sh->synced, sh->ready};
    for (int ph = 0; ph < 4; ph++) {
        for (int k = 0; k < m; k++) {
            d[k] = to[ph][k + WARMUP] - from[ph][k + WARMUP];
        }
        sh->phase_us[ph] = mmp_median(d, m);
    }
    mmp_channel_close(ch);
    _exit(0);
}

static void memcpy_d2d(shared *sh, size_t bytes, int reps)
{
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&a, bytes) != cudaSuccess ||
        cudaMalloc(&b, bytes) != cudaSuccess || cudaMemset(a, 3, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        FAIL(sh, "memcpy: device set-up failed");
    }
    double d[MAX_REPS + WARMUP];
    for (int k = 0; k < reps + WARMUP; k++) {
        float ms = 0;
        if (cudaEventRecord(e0, NULL) != cudaSuccess ||
            cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess ||
            cudaEventRecord(e1, NULL) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
            FAIL(sh, "memcpy %d", k);
        }
        d[k] = ms * 1e3;
    }
    sh->result_us = mmp_median(d + WARMUP, reps);
    _exit(0);
}

static shared *new_shared(void)
{
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    memset(sh, 0, sizeof *sh);
    return sh;
}

static int reap(pid_t pid)
{
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* Median µs of a channel hand-off (copy: mmp_channel_send from a device
 * buffer); < 0 on failure. */
static double handoff(size_t bytes, int reps, int copy, int tag, double phase_us[4],
                      const char *sync)
{
    char addr[96];
    snprintf(addr, sizeof addr, "/mmpipe-bench-%d-cipc%d", (int)getpid(), tag);
    mmp_channel_cfg s = {.address = addr,
                         .slot_bytes = bytes,
                         .slots = 2,
                         .send = 1,
                         .timeout_ms = 60000,
                         .on_gpu = 1,
                         .device = 0};
    mmp_channel_cfg r = s;
    r.send = 0;
    shared *sh = new_shared();
    fflush(stdout);
    fflush(stderr);
    pid_t ps = fork();
    if (ps == 0) {
        sender(sh, s, reps + WARMUP, copy, sync);
    }
    pid_t pr = fork();
    if (pr == 0) {
        receiver(sh, r, reps + WARMUP);
    }
    int ok = reap(pr) & reap(ps);
    double us = ok && !atomic_load(&sh->failed) ? sh->result_us : -1;
    memcpy(phase_us, sh->phase_us, sizeof sh->phase_us);
    munmap(sh, sizeof *sh);
    mmp_shm_unlink_prefix(addr); /* only if something failed before the connect */
    return us;
}

static double memcpy_us(size_t bytes, int reps)
{
    shared *sh = new_shared();
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        memcpy_d2d(sh, bytes, reps);
    }
    double us = reap(p) ? sh->result_us : -1;
    munmap(sh, sizeof *sh);
    return us;
}

static int probe_devices(void)
{
    shared *sh = new_shared();
    fflush(stdout);
    fflush(stderr);
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) {
            n = 0;
        }
        sh->result_us = n;
        _exit(0);
    }
    int n = reap(p) ? (int)sh->result_us : 0;
    munmap(sh, sizeof *sh);
    return n;
}

static double gbps(size_t bytes, double us)
{
    return us > 0 ? (double)bytes / (us * 1e-6) / 1e9 : 0;
}

int main(int argc, char **argv)
{
    int reps = 100;
    int sizes[MAX_SIZES] = {1, 4, 16, 64}, n_sizes = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            n_sizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_sizes < MAX_SIZES;
                 tok = strtok(NULL, ",")) {
                sizes[n_sizes++] = atoi(tok);
            }
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--sizes 1,4,16,64]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "--reps must be 1..%d\n", MAX_REPS);
        return 2;
    }
    if (probe_devices() <= 0) {
        fprintf(stderr, "bench_cuda_ipc: no CUDA device\n");
        return 77;
    }
    static const char *const syncs[] = {"memops", "events"};
    int bad = 0;
    for (int m = 0; m < 2; m++) {
        printf("cuda_ipc (signalling: %s), 2 slots, device 0 to device 0, median of %d "
               "one-at-a-time hand-offs\n\n",
               syncs[m], reps);
        printf("| MB | hand-off µs | hand-off GB/s | send (D2D into slot) µs | send GB/s | "
               "cudaMemcpy D2D µs | memcpy GB/s |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|\n");
        double ph[MAX_SIZES][4], ph_send[4];
        for (int i = 0; i < n_sizes; i++) {
            size_t bytes = (size_t)sizes[i] << 20;
            double h = handoff(bytes, reps, 0, 4 * i + 2 * m, ph[i], syncs[m]);
            double s = handoff(bytes, reps, 1, 4 * i + 2 * m + 1, ph_send, syncs[m]);
            double mc = memcpy_us(bytes, reps);
            bad += h < 0 || s < 0 || mc < 0;
            printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", sizes[i], h,
                   gbps(bytes, h), s, gbps(bytes, s), mc, gbps(bytes, mc));
            fflush(stdout);
        }
        printf("\nhand-off phases (%s), medians in µs: post call / post to recv returning / recv "
               "to the receiver's stream past the flag / release\n\n",
               syncs[m]);
        for (int i = 0; i < n_sizes; i++) {
            printf("- %d MB: %.1f / %.1f / %.1f / %.1f\n", sizes[i], ph[i][0], ph[i][1], ph[i][2],
                   ph[i][3]);
        }
        printf("\n");
    }
    if (bad) {
        fprintf(stderr, "bench_cuda_ipc: %d measurement(s) failed (-1 in the table)\n", bad);
    }
    return bad ? 1 : 0;
}

#endif
