/* transport/cuda/nccl.c's own logic on a machine without a GPU: the file
 * compiled against the stand-ins in this folder (cuda_runtime_api.h, nccl.h,
 * mock.c: host memory for device memory, one unix socket per communicator).
 * What this proves is the channel's side: the ncclUniqueId carried in the
 * creator's address, the side channel's headers, sizes and credits, slot
 * indexing over laps, ordering, STOP, a forged size refused, peer death and
 * the timeouts, aborts on every error path. What it cannot prove is NCCL's
 * or the GPU's side (streams, events, real transfers): tests/gpu_nccl.c and
 * a 2-GPU machine (README, Launching on several hosts).
 *  1. 300 messages of varied sizes (0 included) through 3 slots, creator
 *     sending, connector in another process: bytes, headers, order, STOP,
 *     then MMP_ERR_PEER once the sender closed; clean finalize on both ends;
 *  2. the same with the connector sending (creator receives);
 *  3. a sender SIGKILLed after 3 messages: the receiver gets the 3, then
 *     MMP_ERR_PEER within its timeout, the communicator aborted;
 *  4. a forged side-channel size (slot_bytes + 1): MMP_ERR_PROTO naming it;
 *  5. a creator whose connector never comes: acquire gives MMP_ERR_PEER
 *     naming the communicator init after its timeout. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"
#include "tests/harness.h"
#include "transport/channel.h"

extern int mock_nccl_aborts, mock_nccl_destroys;

#define SLOT 4096
#define N 300

static size_t size_of(int k)
{
    return k % 11 == 0 ? 0 : (size_t)(k * 977) % SLOT + 1;
}

static mmp_channel_cfg cfg_of(const char *address, int send, int timeout_ms)
{
    mmp_channel_cfg c;
    mmp_test_gpu_channel_cfg(&c, address, SLOT, 3, send, timeout_ms);
    return c;
}

/* Sends N messages then STOP; returns problems. */
static int sender(mmp_channel *ch, int die_after)
{
    int bad = 0;
    unsigned char buf[SLOT];
    for (int k = 0; k < N; k++) {
        if (k == die_after) {
            raise(SIGKILL);
        }
        size_t n = size_of(k);
        for (size_t i = 0; i < n; i++) {
            buf[i] = (unsigned char)(k + 3 * i);
        }
        mmp_msg_header h = {.step = k, .mb = k % 7, .digest = (uint64_t)k * 31, .bytes = n, .n = 1};
        if (mmp_channel_send(ch, &h, buf) != MMP_OK) {
            PROBLEM(bad, "send %d: %s", k, mmp_last_error());
            return bad;
        }
    }
    mmp_msg_header stop = {.flags = MMP_MSG_STOP};
    if (mmp_channel_send(ch, &stop, NULL) != MMP_OK) {
        PROBLEM(bad, "send STOP: %s", mmp_last_error());
    }
    return bad;
}

/* Receives up to `upto` messages, checking each, then (upto == N) STOP
 * and MMP_ERR_PEER; returns problems. */
static int receiver(mmp_channel *ch, int upto)
{
    int bad = 0;
    unsigned char buf[SLOT];
    for (int k = 0; k < upto; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
            PROBLEM(bad, "recv %d: %s", k, mmp_last_error());
            return bad;
        }
        size_t n = size_of(k);
        if (h.step != k || h.mb != k % 7 || h.digest != (uint64_t)k * 31 || h.bytes != n ||
            h.flags != 0) {
            PROBLEM(bad, "message %d: header step %d mb %d bytes %llu", k, h.step, h.mb,
                    (unsigned long long)h.bytes);
        }
        if (n > 0 && mmp_channel_read(ch, buf, p, n) != MMP_OK) {
            PROBLEM(bad, "read %d: %s", k, mmp_last_error());
        }
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != (unsigned char)(k + 3 * i)) {
                PROBLEM(bad, "message %d: byte %zu is %u", k, i, buf[i]);
                break;
            }
        }
        if (mmp_channel_release(ch) != MMP_OK) {
            PROBLEM(bad, "release %d: %s", k, mmp_last_error());
        }
    }
    if (upto == N) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK || h.flags != MMP_MSG_STOP || h.bytes != 0) {
            PROBLEM(bad, "no STOP: %s", mmp_last_error());
        }
        mmp_channel_release(ch);
    }
    return bad;
}

/* Runs the connector's end in a child: mode 's' sends, 'r' receives. */
static pid_t child(const char *address, int send)
{
    pid_t pid = fork();
    if (pid != 0) {
        return pid;
    }
    mmp_channel_cfg c = cfg_of(address, send, 10000);
    mmp_channel *ch = NULL;
    int bad = 0;
    if (mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 0) != MMP_OK) {
        PROBLEM(bad, "connect: %s", mmp_last_error());
        _exit(bad);
    }
    bad += send ? sender(ch, -1) : receiver(ch, N);
    if (!send) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_ERR_PEER) {
            PROBLEM(bad, "after STOP and the sender's close: %s", mmp_last_error());
        }
    }
    mmp_channel_close(ch);
    _exit(bad);
}

static int child_problems(pid_t pid)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        return 1;
    }
    return WEXITSTATUS(st);
}

static void test_roundtrip(int creator_sends)
{
    mmp_channel_cfg c = cfg_of("127.0.0.1:0", creator_sends, 10000);
    mmp_channel *ch = NULL;
    CHECK_OK(mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 1));
    if (!ch) {
        return;
    }
    CHECK(strstr(mmp_channel_address(ch), "#nccl:") != NULL);
    pid_t pid = child(mmp_channel_address(ch), !creator_sends);
    int before = mock_nccl_aborts;
    CHECK((creator_sends ? sender(ch, -1) : receiver(ch, N)) == 0);
    mmp_channel_close(ch);
    CHECK(mock_nccl_aborts == before); /* finalized and destroyed, not aborted */
    CHECK(child_problems(pid) == 0);
}

static void test_roundtrip_creator_sends(void)
{
    test_roundtrip(1);
}

static void test_roundtrip_creator_receives(void)
{
    test_roundtrip(0);
}

/* The connector's end (3 s timeout) of the address a forked creator writes
 * into the pipe FD (read to its end of file, then closed); NULL (a failed
 * check) when it cannot open. */
static mmp_channel *connect_piped(int fd)
{
    char address[700] = {0};
    size_t got = 0;
    ssize_t k;
    while (got + 1 < sizeof address &&
           (k = read(fd, address + got, sizeof address - 1 - got)) > 0) {
        got += (size_t)k;
    }
    close(fd);
    mmp_channel_cfg c = cfg_of(address, 0, 3000);
    mmp_channel *ch = NULL;
    CHECK_OK(mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 0));
    return ch;
}

static void test_sender_killed(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* the creator, sending 3 then SIGKILLed */
        mmp_channel_cfg c = cfg_of("127.0.0.1:0", 1, 10000);
        mmp_channel *ch = NULL;
        if (mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 1) != MMP_OK) {
            _exit(1);
        }
        const char *a = mmp_channel_address(ch);
        if (write(fds[1], a, strlen(a) + 1) < 0) {
            _exit(1);
        }
        close(fds[1]); /* the reader's end of file */
        sender(ch, 3);
        _exit(1);
    }
    close(fds[1]);
    mmp_channel *ch = connect_piped(fds[0]);
    if (ch) {
        CHECK(receiver(ch, 3) == 0);
        int before = mock_nccl_aborts;
        mmp_msg_header h;
        const void *p;
        double t0 = mmp_test_now_s();
        CHECK(mmp_channel_recv(ch, &h, &p) == MMP_ERR_PEER);
        CHECK(mmp_test_now_s() - t0 < 5);
        CHECK(mock_nccl_aborts == before + 1);
        /* and after the abort, every call is an error, none touches NCCL */
        CHECK(mmp_channel_recv(ch, &h, &p) == MMP_ERR_PEER);
        mmp_channel_close(ch);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

static void test_forged_size(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* a forger: a raw tcp side channel and a mock id of its own */
        mmp_channel_cfg c = {
            .address = "127.0.0.1:0", .slot_bytes = 8, .slots = 3, .send = 1, .timeout_ms = 5000};
        mmp_channel *side = NULL;
        ncclUniqueId id;
        ncclComm_t comm;
        ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
        cc.blocking = 0;
        if (mmp_channel_open(&side, "tcp", &c, 1) != MMP_OK ||
            ncclGetUniqueId(&id) != ncclSuccess ||
            ncclCommInitRankConfig(&comm, 2, id, 0, &cc) != ncclInProgress) {
            _exit(1);
        }
        char a[700];
        size_t n = (size_t)snprintf(a, sizeof a, "%s#nccl:", mmp_channel_address(side));
        for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++, n += 2) {
            snprintf(a + n, 3, "%02x", (unsigned char)id.internal[i]);
        }
        if (write(fds[1], a, n + 1) < 0) {
            _exit(1);
        }
        close(fds[1]); /* the reader's end of file */
        ncclResult_t st = ncclInProgress;
        for (int i = 0; i < 50000 && st == ncclInProgress; i++) {
            ncclCommGetAsyncError(comm, &st);
            usleep(100);
        }
        uint64_t forged = SLOT + 1;
        mmp_msg_header h = {.step = 0, .bytes = sizeof forged, .n = 1};
        mmp_channel_send(side, &h, &forged);
        usleep(500000);
        _exit(0);
    }
    close(fds[1]);
    mmp_channel *ch = connect_piped(fds[0]);
    if (ch) {
        mmp_msg_header h;
        const void *p;
        mmp_err e = mmp_channel_recv(ch, &h, &p);
        CHECK(e == MMP_ERR_PROTO &&
              strstr(mmp_last_error(), "message of 4097 bytes in 4096-byte slots"));
        if (e != MMP_ERR_PROTO) {
            fprintf(stderr, "  forged size: %s: %s\n", mmp_err_name(e), mmp_last_error());
        }
        mmp_channel_close(ch);
    }
    CHECK(child_problems(pid) == 0);
}

static void test_creator_alone(void)
{
    mmp_channel_cfg c = cfg_of("127.0.0.1:0", 1, 500);
    mmp_channel *ch = NULL;
    CHECK_OK(mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 1));
    if (!ch) {
        return;
    }
    void *slot;
    double t0 = mmp_test_now_s();
    CHECK(mmp_channel_acquire(ch, &slot) == MMP_ERR_PEER &&
          strstr(mmp_last_error(), "communicator init: no progress after 500 ms"));
    CHECK(mmp_test_now_s() - t0 >= 0.45 && mmp_test_now_s() - t0 < 5);
    mmp_channel_close(ch);
}

MMP_TEST_LIST("test_nccl_mock", MMP_TEST_CASE(test_roundtrip_creator_sends),
              MMP_TEST_CASE(test_roundtrip_creator_receives), MMP_TEST_CASE(test_sender_killed),
              MMP_TEST_CASE(test_forged_size), MMP_TEST_CASE(test_creator_alone))
