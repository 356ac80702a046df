/* The nccl data channel (transport/cuda/nccl.c) as far as one GPU allows;
 * NCCL refuses two ranks on one GPU, so no payload crosses here.
 *
 * On the host (no device needed; these run first and fail the test, not
 * skip it, when wrong):
 *  - address: a creator's "host:port#nccl:<hex id>" splits back into the
 *    host:port and the id bytes; a missing tag, a short or long id, a non-hex
 *    digit, an empty host:port are MMP_ERR_PROTO naming the fault;
 *  - can_connect: refuses host payloads and POSIX shm names, accepts
 *    on_gpu + "host:port", and touches no CUDA doing so;
 *  - id exchange timeout: a connector given a well-formed address where no
 *    creator listens gives MMP_ERR_PEER within its timeout (+ slack), before
 *    any CUDA or NCCL call.
 * On one GPU (skips with 77 without a device, after the host checks):
 *  - a 1-rank non-blocking communicator: ncclCommInitRankConfig(blocking=0)
 *    settles to ncclSuccess under ncclCommGetAsyncError polling; then
 *    ncclCommAbort;
 *  - a creator whose connector never comes: setup succeeds (its rank's init
 *    is in progress), the first acquire gives MMP_ERR_PEER after its timeout,
 *    naming NCCL's communicator init, and close (abort) returns promptly;
 *  - two ranks on one GPU: the creator in this process, the connector in a
 *    fresh process (this binary re-executed; the address handed over a
 *    pipe, standing in for the control plane): NCCL refuses the duplicate
 *    GPU and both ends end in a named error within their timeout, no hang;
 *  - two ranks on one GPU as two hosts (NCCL_HOSTID per process, NCCL's
 *    socket transport on loopback; both ends fresh processes): 40 payloads
 *    of changing sizes (one of 0 bytes) through 3 slots and a STOP, each
 *    read back to the host byte for byte: real ncclSend/ncclRecv, events,
 *    credits. (Its plumbing ran against tests/nccl_mock; not yet on a GPU.)
 * Untested until two GPUs (README, Across hosts): NVLink/PCIe transports,
 * peer death mid-transfer. */
#include "tests/harness.h"

#ifndef MMP_HAVE_CUDA

int main(void)
{
    return mmp_test_skip("gpu_nccl", "built without CUDA");
}

#else

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kernels/cuda.h"
#include "transport/channel.h"

#define NAME "gpu_nccl"

/* "host:port#nccl:" + hex of bytes 0, 1, 2, ... (NCCL_UNIQUE_ID_BYTES). */
static void make_address(char *out, size_t cap, const char *host_port)
{
    size_t n = (size_t)snprintf(out, cap, "%s#nccl:", host_port);
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES && n + 2 < cap; i++, n += 2) {
        snprintf(out + n, 3, "%02x", (unsigned)(i * 7 + 3) & 0xff);
    }
}

static int proto_error(const char *address, const char *want)
{
    char hp[600];
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
    mmp_err e = mmp_nccl_parse_address(address, hp, sizeof hp, id);
    if (e != MMP_ERR_PROTO || !strstr(mmp_last_error(), want)) {
        fprintf(stderr, "  '%.60s...': %s: %s (wanted MMP_ERR_PROTO with '%s')\n", address,
                mmp_err_name(e), mmp_last_error(), want);
        return 0;
    }
    return 1;
}

static void test_address(void)
{
    char a[600], hp[600];
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
    make_address(a, sizeof a, "10.77.0.2:40123");
    CHECK_OK(mmp_nccl_parse_address(a, hp, sizeof hp, id));
    CHECK(strcmp(hp, "10.77.0.2:40123") == 0);
    int same = 1;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        same &= id[i] == (unsigned char)((i * 7 + 3) & 0xff);
    }
    CHECK(same);
    CHECK(proto_error("10.77.0.2:40123", "no '#nccl:<id>'"));
    a[strlen(a) - 1] = 0; /* one digit short */
    CHECK(proto_error(a, "hex digits, not 256"));
    make_address(a, sizeof a, "10.77.0.2:40123");
    strcat(a, "0");
    CHECK(proto_error(a, "hex digits, not 256"));
    make_address(a, sizeof a, "10.77.0.2:40123");
    a[strlen("10.77.0.2:40123#nccl:") + 5] = 'g';
    CHECK(proto_error(a, "id digit 5 is not hex"));
    make_address(a, sizeof a, "");
    CHECK(proto_error(a, "not \"host:port\""));
    make_address(a, sizeof a, "nohostport");
    CHECK(proto_error(a, "not \"host:port\""));
    CHECK(proto_error(NULL, "no '#nccl:<id>'"));
}

static void test_can_connect(void)
{
    const char *why = NULL;
    mmp_channel_cfg cfg = {.address = "10.0.0.1:0", .slot_bytes = 64, .slots = 2, .send = 1};
    CHECK(!mmp_transport_nccl.can_connect(&cfg, &why) && why && strstr(why, "host memory"));
    cfg.on_gpu = 1;
    cfg.address = "/mmpipe-x-e1";
    CHECK(!mmp_transport_nccl.can_connect(&cfg, &why) && strstr(why, "cuda_ipc"));
    cfg.address = "10.0.0.1:0";
    CHECK(mmp_transport_nccl.can_connect(&cfg, &why));
    CHECK(mmp_transport_nccl.caps == (MMP_TRANSPORT_DEVICE_SLOTS | MMP_TRANSPORT_NETWORK));
}

/* A creator on 127.0.0.1 (a port of its own), 4 KiB slots; NULL (a failed
 * check) when it cannot open. */
static mmp_channel *open_creator(int timeout_ms)
{
    mmp_channel_cfg cfg;
    mmp_test_gpu_channel_cfg(&cfg, "127.0.0.1:0", 4096, 2, 1, timeout_ms);
    mmp_channel *ch = NULL;
    CHECK_OK(mmp_channel_open(&ch, "nccl", &cfg, 1));
    return ch;
}

static void test_connect_timeout(void)
{
    char hp[64], a[600];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", mmp_test_free_port());
    make_address(a, sizeof a, hp);
    mmp_channel_cfg cfg;
    mmp_test_gpu_channel_cfg(&cfg, a, 256, 2, 0, 400);
    mmp_channel *ch = NULL;
    double t0 = mmp_test_now_s();
    mmp_err e = mmp_channel_open(&ch, "nccl", &cfg, 0);
    double dt = mmp_test_now_s() - t0;
    CHECK(e == MMP_ERR_PEER && ch == NULL);
    CHECK(dt >= 0.3 && dt < 5.0);
    if (e != MMP_ERR_PEER || dt >= 5.0) {
        fprintf(stderr, "  connect with no creator: %s after %.2f s: %s\n", mmp_err_name(e), dt,
                mmp_last_error());
    }
    /* a malformed address: refused before any connection attempt */
    cfg.address = "127.0.0.1:1#nccl:zz";
    t0 = mmp_test_now_s();
    e = mmp_channel_open(&ch, "nccl", &cfg, 0);
    CHECK(e == MMP_ERR_PROTO && mmp_test_now_s() - t0 < 0.2);
}

/* ---- on a device ----------------------------------------------------------------- */

static void test_one_rank(void)
{
    CHECK(cudaSetDevice(0) == cudaSuccess);
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
    CHECK(r == ncclSuccess || r == ncclInProgress);
    double t0 = mmp_test_now_s();
    while (r == ncclInProgress && mmp_test_now_s() - t0 < 30) {
        ncclResult_t st = ncclInProgress;
        CHECK(ncclCommGetAsyncError(comm, &st) == ncclSuccess);
        r = st;
    }
    CHECK(r == ncclSuccess);
    int n = 0;
    CHECK(ncclCommCount(comm, &n) == ncclSuccess && n == 1);
    CHECK(ncclCommAbort(comm) == ncclSuccess);
}

static void test_creator_alone(void)
{
    mmp_channel *ch = open_creator(800);
    if (!ch) {
        return;
    }
    char hp[600];
    unsigned char id[NCCL_UNIQUE_ID_BYTES];
    CHECK_OK(mmp_nccl_parse_address(mmp_channel_address(ch), hp, sizeof hp, id));
    CHECK(strncmp(hp, "127.0.0.1:", 10) == 0 && strcmp(hp, "127.0.0.1:0") != 0);
    void *slot = NULL;
    double t0 = mmp_test_now_s();
    mmp_err e = mmp_channel_acquire(ch, &slot);
    double dt = mmp_test_now_s() - t0;
    CHECK(e == MMP_ERR_PEER && strstr(mmp_last_error(), "communicator init"));
    CHECK(dt >= 0.7 && dt < 10);
    if (e != MMP_ERR_PEER) {
        fprintf(stderr, "  acquire with no connector: %s after %.2f s: %s\n", mmp_err_name(e), dt,
                mmp_last_error());
    }
    t0 = mmp_test_now_s();
    mmp_channel_close(ch);
    CHECK(mmp_test_now_s() - t0 < 5);
}

static const char *self_path;

/* The connector's process: connects to argv's address on device 0 and
 * prints its result: "connect <errname> <message>". */
static int connector_main(const char *address)
{
    mmp_channel_cfg cfg;
    mmp_test_gpu_channel_cfg(&cfg, address, 4096, 2, 0, 20000);
    mmp_channel *ch = NULL;
    mmp_err e = mmp_channel_open(&ch, "nccl", &cfg, 0);
    printf("connect %s %s\n", mmp_err_name(e), e == MMP_OK ? "" : mmp_last_error());
    fflush(stdout);
    if (ch) {
        const void *p;
        mmp_msg_header h;
        e = mmp_channel_recv(ch, &h, &p);
        printf("recv %s\n", mmp_err_name(e));
        mmp_channel_close(ch);
    }
    return 0;
}

static void test_two_ranks_one_gpu(void)
{
    mmp_channel *ch = open_creator(20000);
    if (!ch) {
        return;
    }
    double t0 = mmp_test_now_s();
    int out = -1;
    pid_t pid = mmp_test_spawn_self(self_path, "--connector", mmp_channel_address(ch), &out);
    void *slot = NULL;
    mmp_err e = mmp_channel_acquire(ch, &slot);
    double dt = mmp_test_now_s() - t0;
    fprintf(stderr, "  creator (rank 0) after %.2f s: %s: %s\n", dt, mmp_err_name(e),
            e == MMP_OK ? "" : mmp_last_error());
    CHECK(e == MMP_ERR_PEER && strstr(mmp_last_error(), "nccl"));
    CHECK(dt < 30);
    mmp_channel_close(ch);
    char buf[2048];
    CHECK(mmp_test_child_output(pid, out, buf, sizeof buf));
    fprintf(stderr, "  connector (rank 1), %.2f s: %s", mmp_test_now_s() - t0, buf);
    CHECK(strncmp(buf, "connect ", 8) == 0 && strncmp(buf, "connect ok ", 11) != 0 &&
          strstr(buf, "nccl"));
    CHECK(mmp_test_now_s() - t0 < 40);
}

/* ---- two ranks on one GPU as two hosts ----------------------------------------------
 * With NCCL_HOSTID distinct per process (mmp_test_as_nccl_host) NCCL takes
 * the two ends for two hosts and moves the payloads over its socket
 * transport on loopback: the channel's real ncclSend/ncclRecv, events,
 * side channel and credits, on one GPU (nccl-tests run so with two ranks on
 * one GPU, NCCL 2.29). TH_MSGS messages of changing sizes through TH_SLOTS
 * slots (laps reuse every slot and event), one of 0 bytes (no NCCL call),
 * then a STOP; the receiver reads each payload back to the host. */
#define TH_MSGS 40
#define TH_SLOTS 3
#define TH_BYTES 65536

static size_t th_bytes(int k)
{
    return k == 5 ? 0 : TH_BYTES - (size_t)k * 1531;
}

static unsigned char th_byte(int k, size_t j)
{
    return (unsigned char)((size_t)k * 131 + j * 7 + (j >> 8));
}

/* The sending end (creator), NCCL host "a": prints "address <a>", then
 * sends, then "sender <errname> <messages sent> <message>". */
static int host_sender_main(void)
{
    mmp_test_as_nccl_host("mmp-gpu-nccl-a");
    mmp_channel_cfg cfg;
    mmp_test_gpu_channel_cfg(&cfg, "127.0.0.1:0", TH_BYTES, TH_SLOTS, 1, 30000);
    mmp_channel *ch = NULL;
    mmp_err e = mmp_channel_open_with(&ch, &mmp_transport_nccl, &cfg, 1);
    printf("address %s\n", e == MMP_OK ? mmp_channel_address(ch) : "-");
    fflush(stdout);
    static unsigned char buf[TH_BYTES];
    int k = 0;
    for (; e == MMP_OK && k < TH_MSGS; k++) {
        mmp_msg_header h = {.step = k, .mb = k % 4, .digest = 1000u + (unsigned)k, .n = 1};
        h.bytes = th_bytes(k);
        for (size_t j = 0; j < h.bytes; j++) {
            buf[j] = th_byte(k, j);
        }
        e = mmp_channel_send(ch, &h, buf);
    }
    if (e == MMP_OK) {
        mmp_msg_header stop = {.step = TH_MSGS, .flags = MMP_MSG_STOP};
        e = mmp_channel_send(ch, &stop, NULL);
    }
    printf("sender %s %d %s\n", mmp_err_name(e), k, e == MMP_OK ? "" : mmp_last_error());
    fflush(stdout);
    mmp_channel_close(ch);
    return 0;
}

/* The receiving end (connector), NCCL host "b": "receiver <errname>
 * <messages right> <message>". */
static int host_receiver_main(const char *address)
{
    mmp_test_as_nccl_host("mmp-gpu-nccl-b");
    mmp_channel_cfg cfg;
    mmp_test_gpu_channel_cfg(&cfg, address, TH_BYTES, TH_SLOTS, 0, 30000);
    mmp_channel *ch = NULL;
    mmp_err e = mmp_channel_open_with(&ch, &mmp_transport_nccl, &cfg, 0);
    static unsigned char buf[TH_BYTES];
    int right = 0;
    for (int k = 0; e == MMP_OK && k <= TH_MSGS; k++) {
        mmp_msg_header h;
        const void *p = NULL;
        if ((e = mmp_channel_recv(ch, &h, &p)) != MMP_OK) {
            break;
        }
        if (k == TH_MSGS) { /* the STOP */
            right += (h.flags & MMP_MSG_STOP) != 0 && h.bytes == 0;
            e = mmp_channel_release(ch);
            break;
        }
        int ok = h.step == k && h.mb == k % 4 && h.digest == 1000u + (unsigned)k &&
                 h.bytes == th_bytes(k) && !(h.flags & MMP_MSG_STOP);
        if (ok && h.bytes > 0) {
            memset(buf, 0xee, h.bytes);
            e = mmp_channel_read(ch, buf, p, (size_t)h.bytes);
            for (size_t j = 0; e == MMP_OK && j < h.bytes; j++) {
                ok &= buf[j] == th_byte(k, j);
            }
        }
        if (!ok && e == MMP_OK) {
            fprintf(stderr,
                    "receiver: message %d: step %d mb %d bytes %llu: header or bytes wrong\n", k,
                    h.step, h.mb, (unsigned long long)h.bytes);
        }
        right += ok;
        e = e == MMP_OK ? mmp_channel_release(ch) : e;
    }
    printf("receiver %s %d %s\n", mmp_err_name(e), right, e == MMP_OK ? "" : mmp_last_error());
    fflush(stdout);
    mmp_channel_close(ch);
    return 0;
}

static void test_two_hosts_one_gpu(void)
{
    double t0 = mmp_test_now_s();
    int sout = -1, rout = -1;
    pid_t sp = mmp_test_spawn_self(self_path, "--host-sender", "-", &sout);
    char line[1024], sbuf[2048], rbuf[2048];
    int got = mmp_test_read_line(sout, line, sizeof line, 30000);
    CHECK(got && strncmp(line, "address ", 8) == 0 && strcmp(line, "address -") != 0);
    if (!got || strncmp(line, "address ", 8) != 0 || strcmp(line, "address -") == 0) {
        mmp_test_child_output_within(sp, sout, sbuf, sizeof sbuf, 40);
        fprintf(stderr, "  two hosts on one GPU: the sender gave no address: '%s' %s", line, sbuf);
        return;
    }
    pid_t rp = mmp_test_spawn_self(self_path, "--host-receiver", line + 8, &rout);
    CHECK(mmp_test_child_output_within(rp, rout, rbuf, sizeof rbuf, 60));
    CHECK(mmp_test_child_output_within(sp, sout, sbuf, sizeof sbuf, 30));
    fprintf(stderr,
            "  two hosts on one GPU (NCCL_HOSTID, NCCL's socket transport), %.2f s:\n    %s    %s",
            mmp_test_now_s() - t0, sbuf, rbuf);
    char want[64];
    snprintf(want, sizeof want, "sender ok %d ", TH_MSGS);
    CHECK(strncmp(sbuf, want, strlen(want)) == 0);
    snprintf(want, sizeof want, "receiver ok %d ", TH_MSGS + 1);
    CHECK(strncmp(rbuf, want, strlen(want)) == 0);
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc == 3 && strcmp(argv[1], "--connector") == 0) {
        return connector_main(argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "--host-sender") == 0) {
        return host_sender_main();
    }
    if (argc == 3 && strcmp(argv[1], "--host-receiver") == 0) {
        return host_receiver_main(argv[2]);
    }
    signal(SIGPIPE, SIG_IGN);
    test_address();
    test_can_connect();
    test_connect_timeout();
    if (mmp_cuda_device_count() == 0) {
        return mmp_test_skip_after_host_checks(NAME, "no CUDA device");
    }
    test_one_rank();
    test_creator_alone();
    test_two_ranks_one_gpu();
    test_two_hosts_one_gpu();
    return mmp_test_finish(NAME);
}

#endif
