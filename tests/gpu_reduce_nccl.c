/* The replicas' reduce over NCCL (transport/cuda/reduce_nccl.c) as far as
 * one GPU allows; NCCL refuses two ranks on one GPU, so no gradient crosses
 * between devices here.
 *
 * On the host (no device needed; these run first and fail the test, not
 * skip it, when wrong):
 *  - cfg checks: 0 replicas, a rank out of range, R > 1 without the side
 *    reduce, rank 1 without rank 0's id: MMP_ERR_INVALID naming the fault,
 *    before any CUDA or NCCL call.
 * On one GPU (skips with 77 without a device, after the host checks):
 *  - the sum kernel (mmp_rank_sum_f64_launch) for R = 1 to 5 vectors of up
 *    to 2^20 + 3 doubles (many grid-stride laps; rows stride apart):
 *    bitwise the host's rank order ((v0 + v1) + v2) + ... of
 *    transport/rank_sum.h, which the shm and tcp reduces use, on data whose
 *    reverse order gives other bits;
 *  - the whole path on a 1-rank communicator (device vector, the caller's
 *    stream, non-blocking init settled in the first sum, all-gather, sum
 *    kernel, event wait): 10007 doubles through 1000-double chunks and
 *    through the default chunk, each time equal to the input bitwise; n over
 *    the capacity refused; n = 0; a clean close within its bound;
 *  - two ranks on one GPU: rank 0 here, rank 1 in a fresh process (this
 *    binary re-executed, the address on its command line standing in for
 *    the control plane), each with its tcp host reduce on 127.0.0.1: NCCL
 *    refuses the duplicate GPU and both sums end in MMP_ERR_PEER naming the
 *    nccl reduce within their bound, no hang (or, were two ranks on one GPU
 *    accepted, both sums give the rank-order bits);
 *  - two ranks on one GPU as two hosts (NCCL_HOSTID per process, NCCL's
 *    socket transport on loopback): two sums of 4096 doubles in chunks of
 *    1000, both ranks with the rank-order bits: a gradient really crosses
 *    between the processes. (Its plumbing ran against tests/nccl_mock; not
 *    yet on a GPU.)
 * Untested until two GPUs (README, Launching on several hosts): NCCL moving
 * a gradient between two devices, a peer dying mid-collective on a device. */
#include "tests/harness.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_reduce_nccl", "built without CUDA");
}

#else

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "kernels/cuda.h"
#include "transport/channel.h"
#include "transport/rank_sum.h"
#include "transport/reduce_nccl.h"

#define NAME "gpu_reduce_nccl"
#define TWO_N 4096

static int invalid(const mmp_reduce_nccl_cfg *c, const char *want)
{
    mmp_reduce_nccl *r = (mmp_reduce_nccl *)(uintptr_t)1;
    mmp_err e = mmp_reduce_nccl_open(&r, c);
    if (e != MMP_ERR_INVALID || r != NULL || !strstr(mmp_last_error(), want)) {
        fprintf(stderr, "  cfg: %s: %s (wanted MMP_ERR_INVALID with '%s')\n", mmp_err_name(e),
                mmp_last_error(), want);
        return 0;
    }
    return 1;
}

static void test_cfg(void)
{
    mmp_reduce_nccl_cfg c = {.replicas = 0, .capacity = 8};
    CHECK(invalid(&c, "0 replicas"));
    c = (mmp_reduce_nccl_cfg){.replicas = 2, .rank = 2, .capacity = 8};
    CHECK(invalid(&c, "rank 2 of 2"));
    c.rank = 0;
    CHECK(invalid(&c, "no side reduce"));
    c = (mmp_reduce_nccl_cfg){.replicas = 2, .rank = 1, .capacity = 8, .side = (mmp_reduce *)&c};
    CHECK(invalid(&c, "without rank 0's id"));
    c = (mmp_reduce_nccl_cfg){.replicas = 1, .capacity = 8, .device = -1};
    CHECK(invalid(&c, "device -1"));
}

/* ---- on a device ----------------------------------------------------------------- */

static void test_kernel(void)
{
    const size_t ns[] = {1, 255, 257, 10007, ((size_t)1 << 20) + 3};
    int shows = 0;
    for (int R = 1; R <= 5; R++) {
        for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
            size_t n = ns[t], stride = n + 17;
            double *g = malloc((size_t)R * stride * sizeof *g), *want = malloc(n * sizeof *want);
            double *got = malloc(n * sizeof *got), *dg = NULL, *dout = NULL;
            CHECK(g && want && got);
            if (!g || !want || !got) {
                free(g), free(want), free(got);
                return;
            }
            for (int k = 0; k < R; k++) {
                for (size_t i = 0; i < stride; i++) {
                    g[(size_t)k * stride + i] = mmp_test_order_value(k, (int)t, i);
                }
            }
            int spec_same = 1;
            for (size_t i = 0; i < n; i++) {
                double acc = g[i], rev = g[(size_t)(R - 1) * stride + i];
                for (int k = 1; k < R; k++) {
                    acc = acc + g[(size_t)k * stride + i];
                    rev = rev + g[(size_t)(R - 1 - k) * stride + i];
                }
                want[i] = acc;
                double spec = mmp_rank_sum_f64(g, stride, R, i);
                shows += memcmp(&acc, &rev, sizeof acc) != 0;
                spec_same &= memcmp(&spec, &acc, sizeof acc) == 0; /* rank_sum.h: the rank order */
            }
            CHECK(cudaMalloc((void **)&dg, (size_t)R * stride * sizeof *g) == cudaSuccess);
            CHECK(cudaMalloc((void **)&dout, n * sizeof *got) == cudaSuccess);
            CHECK(cudaMemcpy(dg, g, (size_t)R * stride * sizeof *g, cudaMemcpyHostToDevice) ==
                  cudaSuccess);
            CHECK(mmp_rank_sum_f64_launch(dout, dg, n, stride, R, NULL) == 0);
            CHECK(cudaMemcpy(got, dout, n * sizeof *got, cudaMemcpyDeviceToHost) == cudaSuccess);
            CHECK(spec_same);
            int device_same = memcmp(got, want, n * sizeof *got) == 0;
            CHECK(device_same); /* the device's rank-order sum has the host's bits */
            if (!device_same) {
                size_t i = 0;
                while (i < n && memcmp(&got[i], &want[i], sizeof got[i]) == 0) {
                    i++;
                }
                fprintf(stderr, "  R %d n %zu: element %zu is %.17g on the device, %.17g here\n", R,
                        n, i, got[i], want[i]);
            }
            cudaFree(dg);
            cudaFree(dout);
            free(g), free(want), free(got);
        }
    }
    CHECK(mmp_rank_sum_f64_launch(NULL, NULL, 0, 0, 2, NULL) == 0); /* nothing to do */
    CHECK(mmp_rank_sum_f64_launch((double *)8, (double *)8, 4, 3, 2, NULL) != 0); /* stride < n */
    (void)cudaGetLastError();
    fprintf(stderr, "  kernel: %d elements where the reverse order has other bits\n", shows);
    CHECK(shows > 1000);
}

static void one_rank(size_t chunk)
{
    enum { N = 10007 };
    static double in[N], out[N];
    cudaStream_t s = NULL;
    double *dv = NULL;
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaMalloc((void **)&dv, N * sizeof *dv) == cudaSuccess);
    mmp_reduce_nccl_cfg c = {.replicas = 1,
                             .capacity = N,
                             .device = 0,
                             .stream = s,
                             .timeout_ms = 30000,
                             .chunk = chunk};
    mmp_reduce_nccl *r = NULL;
    CHECK_OK(mmp_reduce_nccl_open(&r, &c));
    for (int round = 0; r && round < 3; round++) {
        for (size_t i = 0; i < N; i++) {
            in[i] = mmp_test_order_value(0, round, i);
        }
        CHECK(cudaMemcpyAsync(dv, in, sizeof in, cudaMemcpyHostToDevice, s) == cudaSuccess);
        double t0 = mmp_test_now_s();
        CHECK_OK(mmp_reduce_nccl_sum_f64(r, dv, N));
        if (round == 0) {
            fprintf(stderr, "  1 rank, chunk %zu: first sum (init settled) %.3f s\n", chunk,
                    mmp_test_now_s() - t0);
        }
        CHECK(cudaMemcpyAsync(out, dv, sizeof out, cudaMemcpyDeviceToHost, s) == cudaSuccess);
        CHECK(cudaStreamSynchronize(s) == cudaSuccess);
        CHECK(memcmp(in, out, sizeof in) == 0);
    }
    if (r) {
        CHECK(mmp_reduce_nccl_sum_f64(r, dv, N + 1) == MMP_ERR_INVALID);
        CHECK_OK(mmp_reduce_nccl_sum_f64(r, dv, 0));
        CHECK_OK(mmp_reduce_nccl_sum_f64(r, dv, N)); /* still in step after the refusal */
        double t0 = mmp_test_now_s();
        mmp_reduce_nccl_close(r);
        CHECK(mmp_test_now_s() - t0 < 11);
    }
    cudaFree(dv);
    cudaStreamDestroy(s);
}

static void test_one_rank(void)
{
    one_rank(1000);
    one_rank(0);
}

/* Rank `rank` of 2 on device 0: a tcp host reduce ("127.0.0.1:0" for rank
 * 0, else the address's host:port) and the nccl reduce. */
static size_t two_chunk; /* the nccl reduce's cfg.chunk (0: its default) */

typedef struct two {
    mmp_reduce *side;
    mmp_reduce_nccl *r;
    double *dv;
    cudaStream_t s;
} two;

static mmp_err two_open(two *x, int rank, const char *address)
{
    memset(x, 0, sizeof *x);
    char hp[700] = "127.0.0.1:0";
    unsigned char id[MMP_NCCL_ID_BYTES];
    if (rank > 0) {
        MMP_TRY(mmp_nccl_parse_address(address, hp, sizeof hp, id));
    }
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&x->s) != cudaSuccess ||
        cudaMalloc((void **)&x->dv, TWO_N * sizeof(double)) != cudaSuccess) {
        return mmp_errorf(MMP_ERR_CUDA, "device set-up");
    }
    mmp_reduce_cfg rc = {.name = hp,
                         .replicas = 2,
                         .rank = rank,
                         .capacity = 2 * TWO_N,
                         .timeout_ms = 20000,
                         .secret = MMP_TEST_SECRET};
    MMP_TRY(mmp_reduce_open(&x->side, &rc));
    mmp_reduce_nccl_cfg c = {.replicas = 2,
                             .rank = rank,
                             .capacity = TWO_N,
                             .device = 0,
                             .stream = x->s,
                             .side = x->side,
                             .id = rank > 0 ? id : NULL,
                             .timeout_ms = 20000,
                             .chunk = two_chunk};
    return mmp_reduce_nccl_open(&x->r, &c);
}

static void two_close(two *x)
{
    mmp_reduce_nccl_close(x->r);
    mmp_reduce_close(x->side);
    cudaFree(x->dv);
    if (x->s) {
        cudaStreamDestroy(x->s);
    }
}

/* One sum of rank's vector; "ok" only with the rank-order bits. */
static mmp_err two_sum(two *x, int rank, int *right)
{
    static double v[TWO_N], want[TWO_N];
    for (size_t i = 0; i < TWO_N; i++) {
        v[i] = mmp_test_order_value(rank, 0, i);
        want[i] = mmp_test_order_value(0, 0, i) + mmp_test_order_value(1, 0, i);
    }
    *right = 0;
    if (cudaMemcpyAsync(x->dv, v, sizeof v, cudaMemcpyHostToDevice, x->s) != cudaSuccess) {
        return mmp_errorf(MMP_ERR_CUDA, "upload");
    }
    MMP_TRY(mmp_reduce_nccl_sum_f64(x->r, x->dv, TWO_N));
    if (cudaMemcpy(v, x->dv, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess) {
        return mmp_errorf(MMP_ERR_CUDA, "download");
    }
    *right = memcmp(v, want, sizeof v) == 0;
    return MMP_OK;
}

static const char *self_path;

/* Rank 1's process: prints "rank1 <errname> <right> <message>". */
static int rank1_main(const char *address)
{
    two x;
    int right = 0;
    mmp_err e = two_open(&x, 1, address);
    e = e == MMP_OK ? two_sum(&x, 1, &right) : e;
    printf("rank1 %s %d %s\n", mmp_err_name(e), right, e == MMP_OK ? "" : mmp_last_error());
    fflush(stdout);
    two_close(&x);
    return 0;
}

static void test_two_ranks_one_gpu(void)
{
    two x;
    mmp_err e = two_open(&x, 0, NULL);
    CHECK_OK(e);
    char a[700];
    if (e != MMP_OK || mmp_reduce_nccl_address(x.r, mmp_reduce_address(x.side), a, sizeof a)) {
        two_close(&x);
        return;
    }
    double t0 = mmp_test_now_s();
    int out = -1;
    pid_t pid = mmp_test_spawn_self(self_path, "--rank1", a, &out);
    int right = 0;
    e = two_sum(&x, 0, &right);
    double dt = mmp_test_now_s() - t0;
    fprintf(stderr, "  rank 0 after %.2f s: %s%s %s\n", dt, mmp_err_name(e),
            e == MMP_OK ? (right ? " (the rank-order bits)" : " (WRONG bits)") : "",
            e == MMP_OK ? "" : mmp_last_error());
    int refused = e == MMP_ERR_PEER && strstr(mmp_last_error(), "nccl reduce");
    CHECK(refused || (e == MMP_OK && right));
    CHECK(dt < 30);
    two_close(&x);
    char buf[2048];
    CHECK(mmp_test_child_output(pid, out, buf, sizeof buf));
    fprintf(stderr, "  rank 1 (a fresh process), %.2f s: %s", mmp_test_now_s() - t0, buf);
    if (refused) {
        CHECK(strncmp(buf, "rank1 peer 0 ", 13) == 0 && strstr(buf, "nccl reduce"));
    } else {
        CHECK(strncmp(buf, "rank1 ok 1", 10) == 0);
    }
    CHECK(mmp_test_now_s() - t0 < 50);
}

/* ---- two ranks on one GPU as two hosts ----------------------------------------------
 * NCCL_HOSTID distinct per process (mmp_test_as_nccl_host): NCCL takes the
 * ranks for two hosts and runs the all-gather over its socket transport on
 * loopback, so a gradient really crosses between the two processes' device
 * buffers: two sums of 4096 doubles in chunks of 1000 (5 all-gathers each),
 * both ranks must end with the rank-order bits. */
static int host_rank_main(int rank, const char *address)
{
    mmp_test_as_nccl_host(rank == 0 ? "mmp-gpu-reduce-a" : "mmp-gpu-reduce-b");
    two_chunk = 1000;
    two x;
    char a[700] = "-";
    mmp_err e = two_open(&x, rank, address);
    if (rank == 0) {
        if (e == MMP_OK) {
            e = mmp_reduce_nccl_address(x.r, mmp_reduce_address(x.side), a, sizeof a);
        }
        printf("address %s\n", e == MMP_OK ? a : "-");
        fflush(stdout);
    }
    int right = 0, again = 0;
    e = e == MMP_OK ? two_sum(&x, rank, &right) : e;
    e = e == MMP_OK ? two_sum(&x, rank, &again) : e;
    printf("rank%d %s %d %s\n", rank, mmp_err_name(e), right && again,
           e == MMP_OK ? "" : mmp_last_error());
    fflush(stdout);
    two_close(&x);
    return 0;
}

static void test_two_hosts_one_gpu(void)
{
    double t0 = mmp_test_now_s();
    int out0 = -1, out1 = -1;
    pid_t p0 = mmp_test_spawn_self(self_path, "--host-rank0", "-", &out0);
    char line[1024], b0[2048], b1[2048];
    int got = mmp_test_read_line(out0, line, sizeof line, 30000);
    int have = got && strncmp(line, "address ", 8) == 0 && strcmp(line, "address -") != 0;
    CHECK(have);
    if (!have) {
        mmp_test_child_output_within(p0, out0, b0, sizeof b0, 40);
        fprintf(stderr, "  two hosts on one GPU: rank 0 gave no address: '%s' %s", line, b0);
        return;
    }
    pid_t p1 = mmp_test_spawn_self(self_path, "--host-rank1", line + 8, &out1);
    CHECK(mmp_test_child_output_within(p1, out1, b1, sizeof b1, 60));
    CHECK(mmp_test_child_output_within(p0, out0, b0, sizeof b0, 30));
    fprintf(stderr,
            "  two hosts on one GPU (NCCL_HOSTID, NCCL's socket transport), %.2f s:\n    %s    %s",
            mmp_test_now_s() - t0, b0, b1);
    CHECK(strncmp(b0, "rank0 ok 1 ", 11) == 0);
    CHECK(strncmp(b1, "rank1 ok 1 ", 11) == 0);
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc == 3 && strcmp(argv[1], "--rank1") == 0) {
        return rank1_main(argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "--host-rank0") == 0) {
        return host_rank_main(0, NULL);
    }
    if (argc == 3 && strcmp(argv[1], "--host-rank1") == 0) {
        return host_rank_main(1, argv[2]);
    }
    signal(SIGPIPE, SIG_IGN);
    test_cfg();
    if (mmp_cuda_device_count() == 0) {
        return mmp_test_skip_after_host_checks(NAME, "no CUDA device");
    }
    test_kernel();
    test_one_rank();
    test_two_ranks_one_gpu();
    test_two_hosts_one_gpu();
    return mmp_test_finish(NAME);
}

#endif
