/* transport/cuda/nccl.c's and reduce_nccl.c's own logic on a machine
 * without a GPU: the files compiled against the stand-ins in this folder
 * (cuda_runtime_api.h, nccl.h, mock.c: host memory for device memory, unix
 * sockets for a communicator, the reduce's sum kernel run on the host).
 * What this proves is the channel's side: the ncclUniqueId carried in the
 * creator's address, the side channel's headers, sizes and credits, slot
 * indexing over laps, ordering, STOP, a forged size refused, peer death and
 * the timeouts, aborts on every error path. What it cannot prove is NCCL's
 * or the GPU's side (streams, events, real transfers): tests/gpu_nccl.c and
 * a 2-GPU machine (README, Launching on several hosts).
 *  1. 300 messages of varied sizes (0 included) through 3 slots, creator
 *     sending, connector in another process: bytes, headers, order, STOP,
 *     then MMP_ERR_PEER once the sender closed; clean finalize on both ends;
 *     first a post with no slot acquired and one larger than the slot, both
 *     MMP_ERR_INVALID with nothing sent (channel.h's post);
 *  2. the same with the connector sending (creator receives);
 *  3. a sender SIGKILLed after 3 messages: the receiver gets the 3, then
 *     MMP_ERR_PEER within its timeout, the communicator aborted;
 *  4. a forged side-channel size (slot_bytes + 1): MMP_ERR_PROTO naming it;
 *  5. a creator whose connector never comes: acquire gives MMP_ERR_PEER
 *     naming the communicator init after its timeout;
 *  5b. a close whose ncclCommFinalize never finishes (the mock stalls it),
 *     on a channel without a timeout: aborted after the close's own bound.
 * The replicas' reduce over NCCL (transport/cuda/reduce_nccl.c: all-gather,
 * then the rank-order sum):
 *  6. cfg checks, the id in rank 0's address read back whole, a 1-rank
 *     communicator (the sum is the input, bitwise);
 *  7. 3 ranks in 3 processes, 6 rounds of lengths 0 to capacity through
 *     300-double chunks, data whose sum order shows in the bits: every
 *     rank's result equals the rank-order sum and the tcp reduce's result,
 *     bitwise, and differs from the reverse order somewhere; an n over the
 *     capacity refused first, the ranks still in step; clean finalize;
 *  8. ranks disagreeing on n: MMP_ERR_PROTO on both, then MMP_ERR_PEER;
 *  9. a rank SIGKILLed inside the all-gather: the other two get
 *     MMP_ERR_PEER within their timeout, their communicators aborted;
 * 10. a rank stalled inside the all-gather: both ends MMP_ERR_PEER after
 *     their timeout, none hangs;
 * 11. a rank that never starts its NCCL init (its host reduce answers):
 *     rank 0's first sum gives MMP_ERR_PEER naming the init. */
#include <math.h>
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
#include "transport/reduce_nccl.h"

extern int mock_nccl_aborts, mock_nccl_destroys;
extern int mock_nccl_die_in_collective, mock_nccl_stall_collectives, mock_nccl_stall_finalize;

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
        if (k == 0) {
            /* channel.h's post: larger than the slot, or with no slot
             * acquired, is MMP_ERR_INVALID and sends nothing (ncclSend
             * would read past the slot); the acquired slot stays usable. */
            mmp_msg_header big = h;
            big.bytes = SLOT + 1;
            void *slot = NULL;
            if (mmp_channel_post(ch, &h) != MMP_ERR_INVALID ||
                !strstr(mmp_last_error(), "post without an acquired slot")) {
                PROBLEM(bad, "a post with no slot acquired: %s", mmp_last_error());
            }
            if (mmp_channel_acquire(ch, &slot) != MMP_OK ||
                mmp_channel_post(ch, &big) != MMP_ERR_INVALID ||
                !strstr(mmp_last_error(), "post of 4097 bytes into 4096-byte slots") ||
                mmp_channel_fill(ch, slot, buf, n) != MMP_OK ||
                mmp_channel_post(ch, &h) != MMP_OK) {
                PROBLEM(bad, "a post larger than the slot, then the slot's post: %s",
                        mmp_last_error());
                return bad;
            }
            continue;
        }
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

/* A close whose ncclCommFinalize never finishes (a peer that vanished
 * still owes it a transfer; the mock's finalize stalls), on a channel with
 * no timeout (timeout_ms 0: its calls wait for ever, as channel.h allows):
 * close gives up after its own bound (NC_CLOSE_MS) and aborts the
 * communicator. The old close waited the channel's timeout: here for ever
 * (the alarm ends the test), with the default 60 s a minute per channel. */
static void test_close_bounded(void)
{
    mmp_channel_cfg c = cfg_of("127.0.0.1:0", 1, 0);
    mmp_channel *ch = NULL;
    CHECK_OK(mmp_channel_open_with(&ch, &mmp_transport_nccl, &c, 1));
    if (!ch) {
        return;
    }
    pid_t pid = child(mmp_channel_address(ch), 0);
    CHECK(sender(ch, -1) == 0);
    int before = mock_nccl_aborts;
    mock_nccl_stall_finalize = 1;
    double t0 = mmp_test_now_s();
    alarm(100); /* a close that never returns fails the test (SIGALRM) */
    mmp_channel_close(ch);
    alarm(0);
    mock_nccl_stall_finalize = 0;
    printf("  close with a finalize that never finishes: aborted after %.1f s\n",
           mmp_test_now_s() - t0);
    CHECK(mock_nccl_aborts == before + 1);
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
    int fds[2] = {-1, -1};
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
    int fds[2] = {-1, -1};
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) { /* a forger: a raw tcp side channel and a mock id of its own */
        mmp_channel_cfg c = {.address = "127.0.0.1:0",
                             .slot_bytes = 8,
                             .slots = 3,
                             .send = 1,
                             .timeout_ms = 5000,
                             .secret = MMP_TEST_SECRET};
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

/* ---- the replicas' reduce over NCCL -------------------------------------------- */

#define RN_CAP 1000
#define RN_CHUNK 300
#define RN_MAX 3

typedef struct rn_rank {
    mmp_reduce *side;
    mmp_reduce_nccl *r;
} rn_rank;

static void rn_close(rn_rank *x)
{
    mmp_reduce_nccl_close(x->r);
    mmp_reduce_close(x->side);
    x->r = NULL;
    x->side = NULL;
}

/* Rank `rank` of R: rank 0 listens on 127.0.0.1 and writes the others'
 * address into out; rank k > 0 reads the id and the host reduce's address
 * from `address`. nccl = 0: the host reduce alone (a rank that never starts
 * its NCCL init). */
static mmp_err rn_open(rn_rank *x, int R, int rank, const char *address, int timeout_ms, int nccl,
                       char *out, size_t cap)
{
    memset(x, 0, sizeof *x);
    char host_port[700] = "127.0.0.1:0";
    unsigned char id[MMP_NCCL_ID_BYTES];
    if (rank > 0) {
        MMP_TRY(mmp_nccl_parse_address(address, host_port, sizeof host_port, id));
    }
    mmp_reduce_cfg rc = {.name = host_port,
                         .replicas = R,
                         .rank = rank,
                         .capacity = 2 * RN_CAP,
                         .timeout_ms = timeout_ms,
                         .secret = MMP_TEST_SECRET};
    MMP_TRY(mmp_reduce_open(&x->side, &rc));
    mmp_reduce_nccl_cfg nc = {.replicas = R,
                              .rank = rank,
                              .capacity = RN_CAP,
                              .device = 0,
                              .side = x->side,
                              .id = rank > 0 ? id : NULL,
                              .timeout_ms = timeout_ms,
                              .chunk = RN_CHUNK};
    mmp_err e = nccl ? mmp_reduce_nccl_open(&x->r, &nc) : MMP_OK;
    if (e == MMP_OK && rank == 0) {
        e = mmp_reduce_nccl_address(x->r, mmp_reduce_address(x->side), out, cap);
    }
    if (e != MMP_OK) {
        rn_close(x);
    }
    return e;
}

/* Rank 0's address to a child over a pipe (the control plane's stand-in). */
static void rn_hand(int fd, const char *address)
{
    if (fd < 0) {
        return;
    }
    if (write(fd, address, strlen(address) + 1) < 0) {
        perror("write");
    }
    close(fd);
}

static void rn_read(int fd, char *address, size_t cap)
{
    size_t got = 0;
    ssize_t k;
    memset(address, 0, cap);
    while (got + 1 < cap && (k = read(fd, address + got, cap - 1 - got)) > 0) {
        got += (size_t)k;
    }
    close(fd);
}

static const size_t rn_lengths[] = {RN_CAP, 7, 0, RN_CHUNK, RN_CHUNK + 1, 1};
#define RN_ROUNDS (sizeof rn_lengths / sizeof rn_lengths[0])

/* The rounds on rank `rank` of R; returns problems; *shows counts the
 * elements whose reverse-order sum has other bits. */
static int rn_rounds(rn_rank *x, int R, int rank, int *shows)
{
    static double v[RN_CAP + 1], host[RN_CAP], want[RN_CAP], g[RN_MAX * RN_CAP];
    int bad = 0;
    if (mmp_reduce_nccl_sum_f64(x->r, v, RN_CAP + 1) != MMP_ERR_INVALID) {
        PROBLEM(bad, "rank %d: n over the capacity not refused", rank);
    }
    for (size_t t = 0; t < RN_ROUNDS; t++) {
        size_t n = rn_lengths[t];
        for (int k = 0; k < R; k++) {
            for (size_t i = 0; i < n; i++) {
                g[(size_t)k * n + i] = mmp_test_order_value(k, (int)t, i);
            }
        }
        for (size_t i = 0; i < n; i++) {
            v[i] = host[i] = g[(size_t)rank * n + i];
            double acc = g[i], rev = g[(size_t)(R - 1) * n + i];
            for (int k = 1; k < R; k++) {
                acc = acc + g[(size_t)k * n + i];
                rev = rev + g[(size_t)(R - 1 - k) * n + i];
            }
            want[i] = acc;
            *shows += memcmp(&acc, &rev, sizeof acc) != 0;
        }
        mmp_err e = mmp_reduce_nccl_sum_f64(x->r, v, n);
        if (e != MMP_OK) {
            PROBLEM(bad, "rank %d round %zu (n %zu): %s", rank, t, n, mmp_last_error());
            return bad;
        }
        if (n > 0 && memcmp(v, want, n * sizeof *v) != 0) {
            PROBLEM(bad, "rank %d round %zu: not the rank-order sum's bits", rank, t);
        }
        e = mmp_reduce_sum_f64(x->side, host, n);
        if (e != MMP_OK || (n > 0 && memcmp(v, host, n * sizeof *v) != 0)) {
            PROBLEM(bad, "rank %d round %zu: not the tcp reduce's bits (%s)", rank, t,
                    e == MMP_OK ? "differ" : mmp_last_error());
        }
    }
    return bad;
}

/* Forks ranks 1 .. R-1, each running fn(rank, address) on the address rank
 * 0 hands it, exiting with its problem count. */
static void rn_fork(int R, int (*fn)(int rank, const char *address), pid_t *pids, int *fds)
{
    for (int k = 1; k < R; k++) {
        int p[2];
        fds[k] = -1;
        if (pipe(p) != 0) {
            pids[k] = -1;
            continue;
        }
        pids[k] = fork();
        if (pids[k] == 0) {
            close(p[1]);
            for (int j = 1; j < k; j++) { /* the earlier ranks' write ends: their end of file */
                if (fds[j] >= 0) {
                    close(fds[j]);
                }
            }
            char address[700];
            rn_read(p[0], address, sizeof address);
            _exit(fn(k, address));
        }
        close(p[0]);
        fds[k] = p[1];
    }
}

static void test_reduce_cfg_and_one_rank(void)
{
    mmp_reduce_nccl *r = NULL;
    mmp_reduce_nccl_cfg c = {.replicas = 0, .capacity = 8};
    CHECK(mmp_reduce_nccl_open(&r, &c) == MMP_ERR_INVALID &&
          strstr(mmp_last_error(), "0 replicas"));
    c = (mmp_reduce_nccl_cfg){.replicas = 2, .rank = 2, .capacity = 8};
    CHECK(mmp_reduce_nccl_open(&r, &c) == MMP_ERR_INVALID &&
          strstr(mmp_last_error(), "rank 2 of 2"));
    c.rank = 0;
    CHECK(mmp_reduce_nccl_open(&r, &c) == MMP_ERR_INVALID &&
          strstr(mmp_last_error(), "no side reduce"));
    c = (mmp_reduce_nccl_cfg){.replicas = 2, .rank = 1, .capacity = 8, .side = (mmp_reduce *)&c};
    CHECK(mmp_reduce_nccl_open(&r, &c) == MMP_ERR_INVALID && strstr(mmp_last_error(), "id"));
    CHECK(r == NULL);

    c = (mmp_reduce_nccl_cfg){.replicas = 1, .capacity = RN_CAP, .chunk = RN_CHUNK};
    CHECK_OK(mmp_reduce_nccl_open(&r, &c));
    if (!r) {
        return;
    }
    char a[700], hp[700], b[700];
    unsigned char id[MMP_NCCL_ID_BYTES];
    CHECK_OK(mmp_reduce_nccl_address(r, "10.1.2.3:4567", a, sizeof a));
    CHECK_OK(mmp_nccl_parse_address(a, hp, sizeof hp, id));
    CHECK(strcmp(hp, "10.1.2.3:4567") == 0);
    CHECK(mmp_reduce_nccl_address(r, "10.1.2.3:4567", b, strlen(a)) == MMP_ERR_INVALID);
    /* the id read back is the one made: formatted again, the same text */
    size_t n = (size_t)snprintf(b, sizeof b, "%s#nccl:", hp);
    for (int i = 0; i < MMP_NCCL_ID_BYTES; i++, n += 2) {
        snprintf(b + n, 3, "%02x", id[i]);
    }
    CHECK(strcmp(a, b) == 0);
    static double v[RN_CAP], in[RN_CAP];
    for (size_t i = 0; i < RN_CAP; i++) {
        v[i] = in[i] = mmp_test_order_value(0, 0, i);
    }
    CHECK_OK(mmp_reduce_nccl_sum_f64(r, v, RN_CAP));
    CHECK(memcmp(v, in, sizeof v) == 0);
    CHECK_OK(mmp_reduce_nccl_sum_f64(r, v, 0));
    CHECK(mmp_reduce_nccl_sum_f64(r, NULL, 3) == MMP_ERR_INVALID);
    int before = mock_nccl_aborts;
    mmp_reduce_nccl_close(r);
    CHECK(mock_nccl_aborts == before);
    mmp_reduce_nccl_close(NULL);
}

static int rn_shows;

static int rn_rank_main(int rank, const char *address)
{
    rn_rank x;
    if (rn_open(&x, 3, rank, address, 10000, 1, NULL, 0) != MMP_OK) {
        fprintf(stderr, "  rank %d: open: %s\n", rank, mmp_last_error());
        return 1;
    }
    int shows = 0;
    int bad = rn_rounds(&x, 3, rank, &shows);
    int before = mock_nccl_aborts;
    rn_close(&x);
    return bad + (mock_nccl_aborts != before);
}

static void test_reduce_three_ranks(void)
{
    pid_t pids[RN_MAX];
    int fds[RN_MAX] = {-1, -1, -1};
    rn_fork(3, rn_rank_main, pids, fds);
    rn_rank x;
    char a[700];
    mmp_err e = rn_open(&x, 3, 0, NULL, 10000, 1, a, sizeof a);
    CHECK_OK(e);
    for (int k = 1; k < 3; k++) {
        rn_hand(fds[k], e == MMP_OK ? a : "");
    }
    if (e == MMP_OK) {
        CHECK(rn_rounds(&x, 3, 0, &rn_shows) == 0);
        CHECK(rn_shows > 100); /* the data can tell a wrong order */
        int before = mock_nccl_aborts;
        rn_close(&x);
        CHECK(mock_nccl_aborts == before); /* finalized and destroyed */
    }
    for (int k = 1; k < 3; k++) {
        CHECK(child_problems(pids[k]) == 0);
    }
}

static int rn_disagree_main(int rank, const char *address)
{
    rn_rank x;
    int bad = 0;
    if (rn_open(&x, 2, rank, address, 10000, 1, NULL, 0) != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s", rank, mmp_last_error());
        return bad;
    }
    static double v[8];
    mmp_err e = mmp_reduce_nccl_sum_f64(x.r, v, (size_t)(5 + rank));
    if (e != MMP_ERR_PROTO || !strstr(mmp_last_error(), "ranks disagree on n in round 1")) {
        PROBLEM(bad, "rank %d: %s: %s", rank, mmp_err_name(e), mmp_last_error());
    }
    if (mmp_reduce_nccl_sum_f64(x.r, v, 5) != MMP_ERR_PEER) {
        PROBLEM(bad, "rank %d: a sum after the failure: %s", rank, mmp_last_error());
    }
    rn_close(&x);
    return bad;
}

static void test_reduce_disagree(void)
{
    pid_t pids[2];
    int fds[2] = {-1, -1};
    rn_fork(2, rn_disagree_main, pids, fds);
    char a[700];
    rn_rank x;
    mmp_err e = rn_open(&x, 2, 0, NULL, 10000, 1, a, sizeof a);
    CHECK_OK(e);
    rn_hand(fds[1], e == MMP_OK ? a : "");
    if (e == MMP_OK) {
        static double v[8];
        CHECK(mmp_reduce_nccl_sum_f64(x.r, v, 5) == MMP_ERR_PROTO &&
              strstr(mmp_last_error(), "rank 1 has 6"));
        int before = mock_nccl_aborts;
        CHECK(mmp_reduce_nccl_sum_f64(x.r, v, 5) == MMP_ERR_PEER &&
              strstr(mmp_last_error(), "out of step"));
        CHECK(mock_nccl_aborts == before); /* aborted once, at the failure, not again */
        rn_close(&x);
    }
    CHECK(child_problems(pids[1]) == 0);
}

/* A rank of 3 (or 2) whose mode is set before it sums: 'k' dies inside the
 * all-gather, 's' stalls in it, 'n' never starts its NCCL init, 'w' is a
 * well-behaved rank that must see MMP_ERR_PEER within its timeout. */
static char rn_mode[RN_MAX];
static int rn_timeout_ms = 10000;

static int rn_fault_main(int rank, const char *address)
{
    rn_rank x;
    int bad = 0, R = rn_mode[2] ? 3 : 2;
    char mode = rn_mode[rank];
    if (mode == 's') {
        rn_timeout_ms *= 3; /* rank 0 gives up first: its own bound, not this end's close */
    }
    if (rn_open(&x, R, rank, address, rn_timeout_ms, mode != 'n', NULL, 0) != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s", rank, mmp_last_error());
        return bad;
    }
    static double v[RN_CAP];
    if (mode == 'n') { /* only the host reduce's agreement round, as a sum would do */
        static double ns[RN_MAX];
        ns[rank] = RN_CAP;
        if (mmp_reduce_sum_f64(x.side, ns, (size_t)R) != MMP_OK) {
            PROBLEM(bad, "rank %d: the host round: %s", rank, mmp_last_error());
        }
        usleep((useconds_t)rn_timeout_ms * 3000); /* until rank 0 gave up */
        rn_close(&x);
        return bad;
    }
    mock_nccl_die_in_collective = mode == 'k';
    mock_nccl_stall_collectives = mode == 's';
    int before = mock_nccl_aborts;
    double t0 = mmp_test_now_s();
    mmp_err e = mmp_reduce_nccl_sum_f64(x.r, v, RN_CAP);
    double dt = mmp_test_now_s() - t0;
    if (e != MMP_ERR_PEER || dt > rn_timeout_ms / 1000.0 + 3 || mock_nccl_aborts != before + 1) {
        PROBLEM(bad, "rank %d (%c): %s after %.2f s, %d aborts: %s", rank, mode, mmp_err_name(e),
                dt, mock_nccl_aborts - before, mmp_last_error());
    }
    rn_close(&x);
    return bad;
}

/* Runs rank 0 (mode rn_mode[0], 'w') against the forked others; returns
 * rank 0's error and its message in msg. */
static mmp_err rn_fault_run(int R, char *msg, size_t cap, double *dt, int *aborts)
{
    pid_t pids[RN_MAX];
    int fds[RN_MAX] = {-1, -1, -1};
    rn_fork(R, rn_fault_main, pids, fds);
    char a[700];
    rn_rank x;
    mmp_err e = rn_open(&x, R, 0, NULL, rn_timeout_ms, 1, a, sizeof a);
    CHECK_OK(e);
    for (int k = 1; k < R; k++) {
        rn_hand(fds[k], e == MMP_OK ? a : "");
    }
    if (e == MMP_OK) {
        static double v[RN_CAP];
        int before = mock_nccl_aborts;
        double t0 = mmp_test_now_s();
        e = mmp_reduce_nccl_sum_f64(x.r, v, RN_CAP);
        *dt = mmp_test_now_s() - t0;
        snprintf(msg, cap, "%s", mmp_last_error());
        *aborts = mock_nccl_aborts - before;
        fprintf(stderr, "  rank 0: %s after %.2f s: %s\n", mmp_err_name(e), *dt, msg);
        CHECK(mmp_reduce_nccl_sum_f64(x.r, v, RN_CAP) == MMP_ERR_PEER);
        rn_close(&x);
    }
    for (int k = 1; k < R; k++) {
        int st = 0;
        CHECK(waitpid(pids[k], &st, 0) == pids[k]);
        if (rn_mode[k] == 'k') {
            CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        } else {
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        }
    }
    return e;
}

static void test_reduce_peer_killed(void)
{
    memcpy(rn_mode, "wwk", 3);
    rn_timeout_ms = 10000;
    char msg[512];
    double dt = 0;
    int aborts = 0;
    mmp_err e = rn_fault_run(3, msg, sizeof msg, &dt, &aborts);
    CHECK(e == MMP_ERR_PEER && strstr(msg, "ncclAllGather") && strstr(msg, "rank 2"));
    CHECK(dt < 5 && aborts == 1);
}

static void test_reduce_peer_stalled(void)
{
    memcpy(rn_mode, "ws\0", 3);
    rn_timeout_ms = 600;
    char msg[512];
    double dt = 0;
    int aborts = 0;
    mmp_err e = rn_fault_run(2, msg, sizeof msg, &dt, &aborts);
    CHECK(e == MMP_ERR_PEER && strstr(msg, "ncclAllGather: no progress after 600 ms"));
    CHECK(dt >= 0.55 && dt < 5 && aborts == 1);
}

static void test_reduce_init_never(void)
{
    memcpy(rn_mode, "wn\0", 3);
    rn_timeout_ms = 500;
    char msg[512];
    double dt = 0;
    int aborts = 0;
    mmp_err e = rn_fault_run(2, msg, sizeof msg, &dt, &aborts);
    CHECK(e == MMP_ERR_PEER && strstr(msg, "communicator init: no progress after 500 ms"));
    CHECK(dt >= 0.45 && dt < 5 && aborts == 1);
}

MMP_TEST_LIST("test_nccl_mock", MMP_TEST_CASE(test_roundtrip_creator_sends),
              MMP_TEST_CASE(test_roundtrip_creator_receives), MMP_TEST_CASE(test_sender_killed),
              MMP_TEST_CASE(test_forged_size), MMP_TEST_CASE(test_creator_alone),
              MMP_TEST_CASE(test_close_bounded), MMP_TEST_CASE(test_reduce_cfg_and_one_rank),
              MMP_TEST_CASE(test_reduce_three_ranks), MMP_TEST_CASE(test_reduce_disagree),
              MMP_TEST_CASE(test_reduce_peer_killed), MMP_TEST_CASE(test_reduce_peer_stalled),
              MMP_TEST_CASE(test_reduce_init_never))
