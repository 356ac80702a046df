/* Tests for the replica gradient reduce (transport/reduce.h).
 *
 * Ranks run as forked children of this process (one per rank) unless a case
 * only opens and closes, which it can do in-process. A child's body returns the
 * number of problems it found (printing the first few) as its exit status and
 * reports what the parent checks across ranks (digests, error codes, times)
 * through a `board` in an anonymous MAP_SHARED mapping. Every child is reaped
 * before its case ends; killed ones after the survivors, so the survivors must
 * notice a dead peer that is still an unreaped zombie.
 *
 * Every name a case creates starts with "/mmpipe-test-reduce-<pid>-"; after
 * each case /dev/shm must hold none of them, including after a rank was
 * SIGKILLed. SIGALRM is the watchdog: a hang fails the test instead of
 * stalling ctest. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "tests/harness.h"
#include "transport/channel.h"
#include "transport/reduce.h"

#define MAX_R 8
#define ROUNDS 250
#define CAP 10007 /* not a multiple of 16 floats, and more than two sum chunks */

/* ---- names and /dev/shm ------------------------------------------------- */

static char prefix[64]; /* "/mmpipe-test-reduce-<pid>-" */
static int next_name;

static const char *fresh_name(char *buf, size_t n)
{
    snprintf(buf, n, "%s%d", prefix, next_name++);
    return buf;
}

static int leftovers(void)
{
    return mmp_test_shm_count(prefix, 0);
}

static double now_ms(void)
{
    return mmp_now() * 1e3; /* CLOCK_MONOTONIC */
}

static void sleep_us(long us)
{
    struct timespec t = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&t, NULL);
}

static mmp_reduce_cfg make_cfg(const char *name, int replicas, int rank, size_t capacity,
                               int timeout_ms)
{
    mmp_reduce_cfg c = {.name = name,
                        .replicas = replicas,
                        .rank = rank,
                        .capacity = capacity,
                        .timeout_ms = timeout_ms,
                        .secret = MMP_TEST_SECRET};
    return c;
}

/* ---- ranks as processes ------------------------------------------------- */

/* What the ranks report to the parent. */
typedef struct board {
    uint64_t digest[MAX_R][ROUNDS]; /* FNV-1a of each round's result */
    int order_matters[MAX_R];       /* rounds where reverse order gives other bits */
    _Atomic int rounds_done[MAX_R];
    int err[MAX_R];       /* the mmp_err that ended a rank's run */
    int err_round[MAX_R]; /* in which round (0-based) */
    double err_at[MAX_R]; /* CLOCK_MONOTONIC ms (one clock for all processes) */
    char msg[MAX_R][512];
    double died_at; /* when the self-killing rank raised SIGKILL */
    _Atomic int go; /* the parent's signal to a waiting child */
    /* Over tcp: where rank 0 listens (mmp_reduce_address), for the others. */
    _Atomic int addr_ready;
    char addr[96];
} board;

typedef struct job {
    const char *name;
    int replicas;
    size_t capacity;
    int timeout_ms;
    int victim; /* the rank that dies, or -1 */
    int rounds; /* for the victim: rounds before dying (-1: run until killed) */
    int hold;   /* rank_idle: stay attached until the parent sets go */
    board *bd;
} job;

typedef int (*rank_fn)(const job *j, int rank);

/* The reduce over tcp: rank 0 listens on a loopback port of its choosing. */
#define TCP_NAME "127.0.0.1:0"

static int over_tcp(const job *j)
{
    return strcmp(j->name, TCP_NAME) == 0;
}

/* Opens rank `rank` of j with this capacity. Over tcp, rank 0 publishes
 * the port it got and the others wait (at most 20 s) to learn it. */
static mmp_err open_rank(const job *j, int rank, size_t capacity, mmp_reduce **r)
{
    mmp_reduce_cfg cfg = {.name = j->name,
                          .replicas = j->replicas,
                          .rank = rank,
                          .capacity = capacity,
                          .timeout_ms = j->timeout_ms,
                          .secret = MMP_TEST_SECRET};
    if (over_tcp(j) && rank > 0) {
        for (int i = 0; i < 20000 && !atomic_load(&j->bd->addr_ready); i++) {
            struct timespec t = {0, 1000000};
            nanosleep(&t, NULL);
        }
        cfg.name = j->bd->addr;
    }
    mmp_err e = mmp_reduce_open(r, &cfg);
    if (e == MMP_OK && over_tcp(j) && rank == 0) {
        snprintf(j->bd->addr, sizeof j->bd->addr, "%s", mmp_reduce_address(*r));
        atomic_store(&j->bd->addr_ready, 1);
    }
    return e;
}

static board *new_board(void)
{
    board *bd = mmap(NULL, sizeof *bd, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (bd == MAP_FAILED) {
        fprintf(stderr, "mmap: %s\n", strerror(errno));
        exit(1);
    }
    memset(bd, 0, sizeof *bd);
    return bd;
}

/* Forks one child per rank running fn (its problem count is the exit status). */
static void spawn(pid_t *pids, const job *j, rank_fn fn)
{
    for (int k = 0; k < j->replicas; k++) {
        fflush(stderr);
        pids[k] = fork();
        if (pids[k] == 0) {
            alarm(60);
            _exit(fn(j, k) ? 1 : 0);
        }
        if (pids[k] < 0) {
            fprintf(stderr, "fork: %s\n", strerror(errno));
            exit(1);
        }
    }
}

/* Reaps rank k's child; 1 when it exited 0. */
static int reaped_ok(pid_t pid, int k)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) {
        fprintf(stderr, "  waitpid rank %d: %s\n", k, strerror(errno));
        return 0;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "  rank %d (pid %d) failed: status %#x\n", k, (int)pid, st);
        return 0;
    }
    return 1;
}

/* Reaps rank k's child; 1 when SIGKILL ended it. */
static int reaped_killed(pid_t pid, int k)
{
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
        fprintf(stderr, "  rank %d (pid %d) did not die of SIGKILL: status %#x\n", k, (int)pid, st);
        return 0;
    }
    return 1;
}

/* ---- vectors ------------------------------------------------------------ */

/* The round's n, the same on every rank: 0, the capacity, and values between. */
static size_t round_n(int round, size_t cap)
{
    if (round % 23 == 5) {
        return 0;
    }
    if (round % 17 == 3) {
        return cap;
    }
    mmp_rng g;
    mmp_rng_seed(&g, 0xC0FFEE, (uint64_t)round);
    return (size_t)mmp_rng_below(&g, cap + 1);
}

/* Rank k's vector in a round: normals scaled by 2^-10 .. 2^10, so the order
 * of additions changes the rounding. */
static void rank_vector(float *x, size_t n, int round, int k)
{
    mmp_rng g;
    mmp_rng_seed(&g, 0xBEEF + (uint64_t)round, (uint64_t)k);
    for (size_t i = 0; i < n; i++) {
        int e = (int)mmp_rng_below(&g, 21) - 10;
        x[i] = ldexpf(mmp_rng_normal(&g), e);
    }
}

/* ref = x_0 + x_1 + ... + x_{R-1} in rank order (reverse: from R-1 down). */
static void local_sum(float *ref, float *tmp, size_t n, int round, int replicas, int reverse)
{
    for (int j = 0; j < replicas; j++) {
        int k = reverse ? replicas - 1 - j : j;
        rank_vector(j == 0 ? ref : tmp, n, round, k);
        if (j > 0) {
            for (size_t i = 0; i < n; i++) {
                ref[i] += tmp[i];
            }
        }
    }
}

/* Runs the rounds; a rank that fails records why in the board. With
 * j->victim == rank, dies by SIGKILL after j->rounds rounds. */
static int rank_rounds(const job *j, int rank)
{
    int bad = 0;
    board *bd = j->bd;
    float *v = malloc(j->capacity * sizeof(float));
    float *ref = malloc(j->capacity * sizeof(float));
    float *tmp = malloc(j->capacity * sizeof(float));
    mmp_reduce *r = NULL;
    mmp_rng jitter;
    mmp_rng_seed(&jitter, 77, (uint64_t)rank);
    if (!v || !ref || !tmp) {
        PROBLEM(bad, "rank %d: out of memory", rank);
        goto exit;
    }
    if (rank == 0) {
        sleep_us(20000); /* the others wait for the segment */
    }
    mmp_err e = open_rank(j, rank, j->capacity, &r);
    if (e != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s: %s", rank, mmp_err_name(e), mmp_last_error());
        goto exit;
    }
    for (int round = 0; round < ROUNDS || (rank == j->victim && j->rounds < 0); round++) {
        if (rank == j->victim && round == j->rounds) {
            bd->died_at = now_ms();
            raise(SIGKILL);
        }
        size_t n = round_n(round % ROUNDS, j->capacity);
        rank_vector(v, n, round % ROUNDS, rank);
        /* Different ranks arrive last, and some waits really sleep. */
        if (mmp_rng_below(&jitter, 8) == 0) {
            sleep_us((long)mmp_rng_below(&jitter, 2000));
        }
        e = mmp_reduce_sum(r, v, n);
        if (e != MMP_OK) {
            bd->err[rank] = (int)e;
            bd->err_round[rank] = round;
            bd->err_at[rank] = now_ms();
            snprintf(bd->msg[rank], sizeof bd->msg[rank], "%s", mmp_last_error());
            if (j->victim < 0) {
                PROBLEM(bad, "rank %d round %d: %s: %s", rank, round, mmp_err_name(e),
                        mmp_last_error());
            }
            break;
        }
        if (j->victim >= 0) {
            atomic_store(&bd->rounds_done[rank], round + 1);
            continue; /* only the death matters here */
        }
        local_sum(ref, tmp, n, round, j->replicas, 0);
        if (memcmp(v, ref, n * sizeof(float)) != 0) {
            size_t i = 0;
            while (memcmp(&v[i], &ref[i], sizeof(float)) == 0) {
                i++;
            }
            PROBLEM(bad, "rank %d round %d (n %zu): [%zu] = %.9g, rank-order sum %.9g", rank, round,
                    n, i, (double)v[i], (double)ref[i]);
        }
        bd->digest[rank][round] = mmp_fnv1a(MMP_FNV1A_INIT, v, n * sizeof(float));
        if (j->replicas >= 3) {
            local_sum(ref, tmp, n, round, j->replicas, 1);
            bd->order_matters[rank] += memcmp(v, ref, n * sizeof(float)) != 0;
        }
    }
    if (j->victim >= 0 && bd->err[rank] == 0) {
        PROBLEM(bad, "rank %d: %d rounds with a dead peer and no error", rank, ROUNDS);
    }

exit:
    mmp_reduce_close(r);
    free(v);
    free(ref);
    free(tmp);
    return bad;
}

/* ---- (1) one replica, bad configurations -------------------------------- */

static void test_single(void)
{
    char name[96];
    fresh_name(name, sizeof name);
    mmp_reduce *r = NULL;
    mmp_reduce_cfg c = make_cfg(name, 1, 0, 64, 1000);
    CHECK_OK(mmp_reduce_open(&r, &c));
    CHECK(r != NULL);
    CHECK(leftovers() == 0); /* one replica shares nothing */
    float v[64], keep[64];
    mmp_test_fill(v, 64, -1e3f, 1e3f, 5);
    memcpy(keep, v, sizeof v);
    for (int round = 0; round < 3; round++) {
        CHECK_OK(mmp_reduce_sum(r, v, 64));
        CHECK_OK(mmp_reduce_sum(r, v, 17));
    }
    CHECK(memcmp(v, keep, sizeof v) == 0);
    CHECK_OK(mmp_reduce_sum(r, NULL, 0));
    CHECK(mmp_reduce_sum(r, v, 65) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "65") && strstr(mmp_last_error(), name));
    CHECK(mmp_reduce_sum(r, NULL, 3) == MMP_ERR_INVALID);
    CHECK(mmp_reduce_sum(NULL, v, 3) == MMP_ERR_INVALID);
    mmp_reduce_close(r);
    mmp_reduce_close(NULL);

    /* Bad configurations are named and leave *out NULL. */
    const struct {
        const char *name;
        int replicas, rank;
        size_t capacity;
        const char *says;
    } bad[] = {
        {"no-slash", 2, 0, 8, "no-slash"},
        {"/a/b", 2, 0, 8, "/a/b"},
        {"/", 2, 0, 8, "POSIX"},
        {NULL, 2, 0, 8, "(null)"},
        {name, 0, 0, 8, "replicas 0"},
        {name, 257, 0, 8, "replicas 257"}, /* MMP_MAX_REPLICAS + 1 */
        {name, 2, -1, 8, "rank -1"},
        {name, 2, 2, 8, "rank 2"},
        {name, 2, 0, (size_t)1 << 50, "capacity"},
    };
    static char sentinel;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mmp_reduce_cfg b =
            make_cfg(bad[i].name, bad[i].replicas, bad[i].rank, bad[i].capacity, 100);
        r = (mmp_reduce *)(void *)&sentinel; /* must be overwritten */
        CHECK(mmp_reduce_open(&r, &b) == MMP_ERR_INVALID && r == NULL);
        CHECK(strstr(mmp_last_error(), bad[i].says) != NULL);
    }
    CHECK(mmp_reduce_open(&r, NULL) == MMP_ERR_INVALID && r == NULL);
    CHECK(mmp_reduce_open(NULL, &c) == MMP_ERR_INVALID);
}

/* ---- (2) many rounds, bitwise ------------------------------------------- */

static int tcp_now; /* the case runs over tcp (its tcp/ twin) */

/* The name of a new reduce: a fresh shm name, or TCP_NAME. */
static const char *reduce_name(char *buf, size_t n)
{
    return tcp_now ? TCP_NAME : fresh_name(buf, n);
}

static void test_rounds(int replicas)
{
    char name[96];
    board *bd = new_board();
    job j = {.name = reduce_name(name, sizeof name),
             .replicas = replicas,
             .capacity = CAP,
             .timeout_ms = 30000,
             .victim = -1,
             .bd = bd};
    pid_t pids[MAX_R];
    spawn(pids, &j, rank_rounds);
    for (int k = 0; k < replicas; k++) {
        CHECK(reaped_ok(pids[k], k));
    }
    int differ = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int k = 1; k < replicas; k++) {
            differ += bd->digest[k][round] != bd->digest[0][round];
        }
    }
    CHECK(differ == 0);
    if (differ) {
        fprintf(stderr, "  %d (round, rank) results differ from rank 0's\n", differ);
    }
    if (replicas >= 3) {
        /* Otherwise the bitwise checks above could not tell orders apart. */
        CHECK(bd->order_matters[0] > ROUNDS / 4);
    }
    munmap(bd, sizeof *bd);
}

static void test_rounds_2(void)
{
    test_rounds(2);
}

static void test_rounds_3(void)
{
    test_rounds(3);
}

static void test_rounds_4(void)
{
    test_rounds(4);
}

/* ---- (3) a rank is SIGKILLed -------------------------------------------- */

/* Reaps the survivors (the victim stays a zombie meanwhile) and checks their
 * errors: MMP_ERR_PEER naming the victim, within 1 s of t0 (the kill), or of
 * the victim's own time of death when t0 < 0. */
static void check_survivors(const job *j, const pid_t *pids, double t0)
{
    for (int k = 0; k < j->replicas; k++) {
        if (k != j->victim) {
            CHECK(reaped_ok(pids[k], k));
        }
    }
    if (t0 < 0) {
        t0 = j->bd->died_at;
    }
    for (int k = 0; k < j->replicas; k++) {
        if (k == j->victim) {
            continue;
        }
        char want[64];
        /* Over tcp no pid crosses: the rank and its address are named. */
        if (over_tcp(j)) {
            snprintf(want, sizeof want, "rank %d (", j->victim);
        } else {
            snprintf(want, sizeof want, "rank %d (pid %d) is gone", j->victim,
                     (int)pids[j->victim]);
        }
        double after = j->bd->err_at[k] - t0;
        CHECK(j->bd->err[k] == MMP_ERR_PEER);
        CHECK(strstr(j->bd->msg[k], want) != NULL &&
              strstr(j->bd->msg[k], over_tcp(j) ? j->bd->addr : j->name) != NULL);
        CHECK(after >= 0 && after < 1000);
        if (j->bd->err[k] != MMP_ERR_PEER || after < 0 || after >= 1000 ||
            !strstr(j->bd->msg[k], want)) {
            fprintf(stderr, "  rank %d: %s %.0f ms after the kill: %s\n", k,
                    mmp_err_name((mmp_err)j->bd->err[k]), after, j->bd->msg[k]);
        }
    }
}

static void test_killed(void)
{
    char name[96];
    pid_t pids[MAX_R];

    /* A rank SIGKILLs itself between two sums: the others are in (or soon
     * in) the next one. timeout_ms is long: only noticing the death ends it. */
    board *bd = new_board();
    job j = {.name = reduce_name(name, sizeof name),
             .replicas = 3,
             .capacity = 1000,
             .timeout_ms = 30000,
             .victim = 1,
             .rounds = 30,
             .bd = bd};
    spawn(pids, &j, rank_rounds);
    check_survivors(&j, pids, -1);
    CHECK(reaped_killed(pids[1], 1));
    CHECK(bd->died_at > 0 && bd->err_round[0] == 30 && bd->err_round[2] == 30);
    CHECK(leftovers() == 0);
    munmap(bd, sizeof *bd);

    /* Rank 0, the creator, killed from outside at a random point; it stays
     * an unreaped zombie until the survivors are done. */
    bd = new_board();
    j = (job){.name = reduce_name(name, sizeof name),
              .replicas = 4,
              .capacity = 3000,
              .timeout_ms = 30000,
              .victim = 0,
              .rounds = -1,
              .bd = bd};
    spawn(pids, &j, rank_rounds);
    double start = now_ms();
    while (atomic_load(&bd->rounds_done[0]) < 40 && now_ms() - start < 20000) {
        sleep_us(1000);
    }
    CHECK(atomic_load(&bd->rounds_done[0]) >= 40);
    sleep_us(1357);
    double t0 = now_ms();
    kill(pids[0], SIGKILL);
    check_survivors(&j, pids, t0);
    CHECK(reaped_killed(pids[0], 0));
    munmap(bd, sizeof *bd);
}

/* ---- (4) a peer that never comes, closes, or is slow -------------------- */

/* Opens, tells the parent (rounds_done[rank] = 1), never sums, and closes at
 * once or, with j->hold, once the parent sets go. */
static int rank_idle(const job *j, int rank)
{
    int bad = 0;
    mmp_reduce *r = NULL;
    mmp_reduce_cfg cfg = make_cfg(j->name, j->replicas, rank, j->capacity, j->timeout_ms);
    mmp_err e = mmp_reduce_open(&r, &cfg);
    if (e != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s", rank, mmp_last_error());
    }
    atomic_store(&j->bd->rounds_done[rank], 1); /* attached */
    while (j->hold && !atomic_load(&j->bd->go)) {
        sleep_us(1000);
    }
    mmp_reduce_close(r);
    return bad;
}

static void wait_attached(board *bd, int rank)
{
    double start = now_ms();
    while (!atomic_load(&bd->rounds_done[rank]) && now_ms() - start < 10000) {
        sleep_us(1000);
    }
}

static void test_absent_peer(void)
{
    char name[96];
    float v[16] = {1};

    /* No rank 0: attach gives up after timeout_ms. */
    mmp_reduce *r = NULL;
    mmp_reduce_cfg c = make_cfg(fresh_name(name, sizeof name), 2, 1, 16, 300);
    double t0 = now_ms();
    CHECK(mmp_reduce_open(&r, &c) == MMP_ERR_PEER && r == NULL);
    double waited = now_ms() - t0;
    CHECK(waited >= 290 && waited < 800);
    CHECK(strstr(mmp_last_error(), name) && strstr(mmp_last_error(), "did not appear"));

    /* A slow peer (attached, never sums): the sum times out naming it, and
     * the handle stays failed. */
    board *bd = new_board();
    job j = {.name = fresh_name(name, sizeof name),
             .replicas = 2,
             .capacity = 16,
             .timeout_ms = 300,
             .victim = -1,
             .hold = 1,
             .bd = bd};
    c = make_cfg(name, 2, 0, 16, 300);
    CHECK_OK(mmp_reduce_open(&r, &c));
    pid_t pid[MAX_R];
    fflush(stderr);
    pid[1] = fork();
    if (pid[1] == 0) {
        alarm(60);
        _exit(rank_idle(&j, 1) ? 1 : 0);
    }
    wait_attached(bd, 1);
    CHECK(leftovers() == 0); /* both attached */
    t0 = now_ms();
    CHECK(mmp_reduce_sum(r, v, 16) == MMP_ERR_PEER);
    waited = now_ms() - t0;
    CHECK(waited >= 290 && waited < 900);
    char want[64];
    snprintf(want, sizeof want, "waiting for rank 1 (pid %d)", (int)pid[1]);
    CHECK(strstr(mmp_last_error(), "timed out") && strstr(mmp_last_error(), want));
    t0 = now_ms();
    CHECK(mmp_reduce_sum(r, v, 16) == MMP_ERR_PEER);
    /* Failed before: at once, not after another timeout_ms (300). */
    CHECK(now_ms() - t0 < 200 && strstr(mmp_last_error(), "earlier"));
    mmp_reduce_close(r);
    atomic_store(&bd->go, 1);
    CHECK(reaped_ok(pid[1], 1));

    /* A peer that closes: the sum fails at once, not after timeout_ms. */
    memset(bd, 0, sizeof *bd);
    j.name = fresh_name(name, sizeof name);
    j.timeout_ms = 30000;
    j.hold = 0;
    c = make_cfg(name, 2, 0, 16, 30000);
    CHECK_OK(mmp_reduce_open(&r, &c));
    fflush(stderr);
    pid[1] = fork();
    if (pid[1] == 0) {
        alarm(60);
        _exit(rank_idle(&j, 1) ? 1 : 0);
    }
    CHECK(reaped_ok(pid[1], 1));
    t0 = now_ms();
    CHECK(mmp_reduce_sum(r, v, 16) == MMP_ERR_PEER);
    CHECK(now_ms() - t0 < 300);
    CHECK(strstr(mmp_last_error(), "rank 1") && strstr(mmp_last_error(), "closed"));
    mmp_reduce_close(r);

    /* A rank that never attaches: named as such; close removes the name. */
    c = make_cfg(fresh_name(name, sizeof name), 3, 0, 16, 300);
    CHECK_OK(mmp_reduce_open(&r, &c));
    CHECK(leftovers() == 1);
    CHECK(mmp_reduce_sum(r, v, 16) == MMP_ERR_PEER);
    CHECK(strstr(mmp_last_error(), "rank 1 (never attached)"));
    mmp_reduce_close(r);
    munmap(bd, sizeof *bd);
}

/* ---- (5) geometry, attach, names ---------------------------------------- */

static void test_geometry(void)
{
    char name[96];
    fresh_name(name, sizeof name);
    mmp_reduce *r0 = NULL, *r1 = NULL, *r2 = NULL, *x = NULL;
    mmp_reduce_cfg c0 = make_cfg(name, 3, 0, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    CHECK(leftovers() == 1);

    mmp_reduce_cfg bad = make_cfg(name, 3, 1, 200, 1000);
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "mismatch") && strstr(mmp_last_error(), "100") &&
          strstr(mmp_last_error(), "200"));
    bad = make_cfg(name, 2, 1, 100, 1000);
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "3 replicas") && strstr(mmp_last_error(), "2 replicas"));
    bad = make_cfg(name, 3, 0, 100, 1000); /* a second rank 0 */
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_IO && x == NULL);

    /* Failed attaches leave the segment usable and the name in place. */
    mmp_reduce_cfg c1 = make_cfg(name, 3, 1, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r1, &c1));
    CHECK(leftovers() == 1);
    CHECK(mmp_reduce_open(&x, &c1) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "rank 1 is already attached"));
    float v[101] = {0};
    CHECK(mmp_reduce_sum(r1, v, 101) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "capacity 100"));

    /* The last attach removes the name; closing removes nothing twice. */
    mmp_reduce_cfg c2 = make_cfg(name, 3, 2, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r2, &c2));
    CHECK(leftovers() == 0);
    mmp_reduce_close(r1);
    mmp_reduce_close(r0);
    mmp_reduce_close(r2);

    /* Closing before everyone attached removes the name, whoever closes. */
    c0 = make_cfg(fresh_name(name, sizeof name), 2, 0, 8, 1000);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    CHECK(leftovers() == 1);
    mmp_reduce_close(r0);
    CHECK(leftovers() == 0);
    c0 = make_cfg(fresh_name(name, sizeof name), 3, 0, 8, 1000);
    c1 = make_cfg(name, 3, 1, 8, 1000);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    CHECK_OK(mmp_reduce_open(&r1, &c1));
    mmp_reduce_close(r1);
    CHECK(leftovers() == 0);
    mmp_reduce_close(r0);

    /* Capacity 0 is a valid geometry (a stage without parameters). */
    c0 = make_cfg(fresh_name(name, sizeof name), 2, 0, 0, 1000);
    c1 = make_cfg(name, 2, 1, 0, 1000);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    CHECK_OK(mmp_reduce_open(&r1, &c1));
    CHECK(mmp_reduce_sum(r0, v, 1) == MMP_ERR_INVALID);
    mmp_reduce_close(r0);
    mmp_reduce_close(r1);
}

/* ---- (5b) over tcp: geometry, absent and closing peers ------------------
 * In this process: rank 0's accepting thread answers every rank that opens. */

static void test_tcp_geometry(void)
{
    mmp_reduce *r0 = NULL, *r1 = NULL, *r2 = NULL, *x = NULL;
    mmp_reduce_cfg c0 = make_cfg(TCP_NAME, 3, 0, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    char at[96];
    snprintf(at, sizeof at, "%s", r0 ? mmp_reduce_address(r0) : "127.0.0.1:1");
    CHECK(strncmp(at, "127.0.0.1:", 10) == 0 && atoi(at + 10) > 0);

    mmp_reduce_cfg bad = make_cfg(at, 3, 1, 200, 1000);
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "100") && strstr(mmp_last_error(), "200"));
    bad = make_cfg(at, 2, 1, 100, 1000);
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "3 replicas") && strstr(mmp_last_error(), "2 replicas"));

    /* A process of another job (or of none) cannot claim a rank: refused in
     * the job-key handshake at once, before its hello. */
    bad = make_cfg(at, 3, 1, 100, 1000);
    bad.secret = "another job's token";
    double t0 = now_ms();
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_PROTO && x == NULL && now_ms() - t0 < 900 &&
          strstr(mmp_last_error(), "does not hold this job's key"));
    bad.secret = NULL;
    CHECK(mmp_reduce_open(&x, &bad) == MMP_ERR_INVALID && x == NULL &&
          strstr(mmp_last_error(), "secret"));

    /* Refused ranks leave rank 0 listening; a rank attaches once. */
    mmp_reduce_cfg c1 = make_cfg(at, 3, 1, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r1, &c1));
    CHECK(mmp_reduce_open(&x, &c1) == MMP_ERR_PEER && x == NULL);
    CHECK(strstr(mmp_last_error(), "already attached"));
    float v[101] = {0};
    CHECK(mmp_reduce_sum(r1, v, 101) == MMP_ERR_INVALID);
    CHECK(strstr(mmp_last_error(), "capacity 100"));
    mmp_reduce_cfg c2 = make_cfg(at, 3, 2, 100, 1000);
    CHECK_OK(mmp_reduce_open(&r2, &c2));
    mmp_reduce_close(r1);
    mmp_reduce_close(r2);

    /* A rank that closed: rank 0's next sum fails at once, naming it. */
    t0 = now_ms();
    CHECK(r0 && mmp_reduce_sum(r0, v, 16) == MMP_ERR_PEER);
    CHECK(now_ms() - t0 < 300 && strstr(mmp_last_error(), "rank 1 (") &&
          strstr(mmp_last_error(), "closed"));
    t0 = now_ms();
    CHECK(r0 && mmp_reduce_sum(r0, v, 16) == MMP_ERR_PEER && now_ms() - t0 < 200 &&
          strstr(mmp_last_error(), "earlier"));
    mmp_reduce_close(r0);

    /* A rank that never connects: rank 0's sum gives up after timeout_ms. */
    c0 = make_cfg(TCP_NAME, 2, 0, 16, 300);
    CHECK_OK(mmp_reduce_open(&r0, &c0));
    t0 = now_ms();
    CHECK(r0 && mmp_reduce_sum(r0, v, 16) == MMP_ERR_PEER);
    double waited = now_ms() - t0;
    CHECK(waited >= 290 && waited < 900 && strstr(mmp_last_error(), "rank 1 did not connect"));
    mmp_reduce_close(r0);

    /* No rank 0 at all (a port held bound, never listening): open gives up
     * after timeout_ms. */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(held >= 0 && bind(held, (struct sockaddr *)&a, sizeof a) == 0 &&
          getsockname(held, (struct sockaddr *)&a, &l) == 0);
    snprintf(at, sizeof at, "127.0.0.1:%d", ntohs(a.sin_port));
    c1 = make_cfg(at, 2, 1, 16, 300);
    t0 = now_ms();
    CHECK(mmp_reduce_open(&x, &c1) == MMP_ERR_PEER && x == NULL);
    waited = now_ms() - t0;
    CHECK(waited >= 290 && waited < 800 && strstr(mmp_last_error(), at));
    close(held);
}

/* ---- (6) ranks disagree on n -------------------------------------------- */

static int rank_mismatch(const job *j, int rank)
{
    int bad = 0;
    mmp_reduce *r = NULL;
    float v[64];
    mmp_err e = open_rank(j, rank, 64, &r);
    if (e != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s", rank, mmp_last_error());
        return bad;
    }
    /* A too-long n is refused before anything is shared: the group goes on. */
    if (rank == 1 && mmp_reduce_sum(r, v, 65) != MMP_ERR_INVALID) {
        PROBLEM(bad, "rank 1: n 65 > capacity 64 accepted");
    }
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 64; i++) {
            v[i] = (float)(rank + 1);
        }
        e = mmp_reduce_sum(r, v, 64);
        if (e != MMP_OK || v[0] != 3.0f || v[63] != 3.0f) {
            PROBLEM(bad, "rank %d round %d: %s, v[0] = %g", rank, round, mmp_last_error(),
                    (double)v[0]);
        }
    }
    double t0 = now_ms();
    e = mmp_reduce_sum(r, v, rank == 0 ? 10 : 11);
    if (e != MMP_ERR_PROTO || !strstr(mmp_last_error(), "rank 0 has 10") ||
        !strstr(mmp_last_error(), "rank 1 has 11") || now_ms() - t0 > 500) {
        PROBLEM(bad, "rank %d: n 10 against 11: %s: %s", rank, mmp_err_name(e), mmp_last_error());
    }
    if (mmp_reduce_sum(r, v, 10) != MMP_ERR_PEER) {
        PROBLEM(bad, "rank %d: a sum after the mismatch did not fail", rank);
    }
    mmp_reduce_close(r);
    return bad;
}

static void test_mismatch(void)
{
    char name[96];
    board *bd = new_board();
    job j = {.name = reduce_name(name, sizeof name),
             .replicas = 2,
             .capacity = 64,
             .timeout_ms = 5000,
             .victim = -1,
             .bd = bd};
    pid_t pids[MAX_R];
    spawn(pids, &j, rank_mismatch);
    for (int k = 0; k < 2; k++) {
        CHECK(reaped_ok(pids[k], k));
    }
    munmap(bd, sizeof *bd);
}

/* ---- (7) vectors of several buckets, staggered arrivals --------------- */

/* A reduce whose vectors span several buckets (the segment cuts them at
 * least every 2^18 floats), in floats and in doubles, with n changing every
 * round (0, a bucket's edge, the capacity): each rank arrives a few
 * milliseconds after the one before it, or before the one after it, or all
 * at once, so some ranks add while later ones still "compute" and some wait
 * for their turn. Every rank ends with the rank-order sum, bitwise. */
#define BIG_CAP (3 * ((size_t)1 << 18) + 1001) /* 4 buckets */
#define BIG_ROUNDS 12

static size_t big_n(int round)
{
    const size_t edge = (size_t)1 << 18;
    const size_t ns[] = {BIG_CAP, 0, edge, edge + 1, 17, BIG_CAP - 3, 2 * edge - 1};
    return ns[round % 7];
}

/* Cheap values whose sum's rounding depends on the order: 2^-12 .. 2^12. */
static double big_value(int round, int k, size_t i)
{
    uint64_t x = ((uint64_t)round * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(k + 1) << 40) ^ i;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return ldexp((double)(int32_t)(x & 0xffffff) - 8388608.0, (int)(x >> 59) - 16 - 23);
}

static int rank_big(const job *j, int rank)
{
    int bad = 0;
    mmp_reduce *r = NULL;
    double *d = malloc(BIG_CAP / 2 * sizeof(double));
    float *f = malloc(BIG_CAP * sizeof(float));
    if (!d || !f) {
        PROBLEM(bad, "rank %d: out of memory", rank);
        goto exit;
    }
    if (rank == 0) {
        sleep_us(20000);
    }
    mmp_err e = open_rank(j, rank, BIG_CAP, &r);
    if (e != MMP_OK) {
        PROBLEM(bad, "rank %d: open: %s", rank, mmp_last_error());
        goto exit;
    }
    for (int round = 0; round < BIG_ROUNDS; round++) {
        int dbl = round % 2 == 1;
        size_t n = dbl ? big_n(round) / 2 : big_n(round);
        for (size_t i = 0; i < n; i++) {
            double x = big_value(round, rank, i);
            if (dbl) {
                d[i] = x;
            } else {
                f[i] = (float)x;
            }
        }
        int order = round % 3; /* 0: ranks in order, 1: reversed, 2: together */
        int late = order == 0 ? rank : order == 1 ? j->replicas - 1 - rank : 0;
        sleep_us(3000L * late);
        e = dbl ? mmp_reduce_sum_f64(r, d, n) : mmp_reduce_sum(r, f, n);
        if (e != MMP_OK) {
            PROBLEM(bad, "rank %d round %d: %s", rank, round, mmp_last_error());
            break;
        }
        size_t wrong = n;
        for (size_t i = 0; i < n && wrong == n; i++) {
            double sd = 0;
            float sf = 0;
            for (int k = 0; k < j->replicas; k++) {
                double x = big_value(round, k, i);
                sd = k == 0 ? x : sd + x;
                sf = k == 0 ? (float)x : sf + (float)x;
            }
            if (dbl ? memcmp(&d[i], &sd, sizeof sd) != 0 : memcmp(&f[i], &sf, sizeof sf) != 0) {
                wrong = i;
            }
        }
        if (wrong < n) {
            PROBLEM(bad, "rank %d round %d (n %zu %s): [%zu] is not the rank-order sum", rank,
                    round, n, dbl ? "doubles" : "floats", wrong);
        }
        j->bd->digest[rank][round] = dbl ? mmp_fnv1a(MMP_FNV1A_INIT, d, n * sizeof(double))
                                         : mmp_fnv1a(MMP_FNV1A_INIT, f, n * sizeof(float));
    }
exit:
    mmp_reduce_close(r);
    free(d);
    free(f);
    return bad;
}

static void test_buckets(void)
{
    char name[96];
    board *bd = new_board();
    job j = {.name = reduce_name(name, sizeof name),
             .replicas = 3,
             .capacity = BIG_CAP,
             .timeout_ms = 30000,
             .victim = -1,
             .bd = bd};
    pid_t pids[MAX_R];
    spawn(pids, &j, rank_big);
    for (int k = 0; k < j.replicas; k++) {
        CHECK(reaped_ok(pids[k], k));
    }
    for (int round = 0; round < BIG_ROUNDS; round++) {
        for (int k = 1; k < j.replicas; k++) {
            CHECK(bd->digest[k][round] == bd->digest[0][round]);
        }
    }
    munmap(bd, sizeof *bd);
}

/* ---- forged progress counter --------------------------------------------- */

/* Two ranks as two threads of this process, and a third mapping of their
 * segment written behind their backs (what a hostile or broken rank could
 * do). The bucket's progress counter is found without knowing the layout: a
 * 64-bit word a round moves by 2 ranks x 1 bucket (the doorbell's word, rung
 * once per addition, may move alike: forging it too only rings). Forged far
 * ahead, the next sum fails on both ranks with MMP_ERR_PROTO naming the
 * field, instead of taking turns nobody gave. */
typedef struct forged_rank {
    mmp_reduce *r;
    float v[64];
    mmp_err e;
} forged_rank;

static void *forged_sum(void *arg)
{
    forged_rank *fr = arg;
    fr->e = mmp_reduce_sum(fr->r, fr->v, 64);
    return NULL;
}

static void both_sum(forged_rank *fr)
{
    pthread_t th;
    fr[1].e = MMP_ERR_INTERNAL;
    if (pthread_create(&th, NULL, forged_sum, &fr[1]) != 0) {
        fr[0].e = fr[1].e = MMP_ERR_INTERNAL;
        return;
    }
    forged_sum(&fr[0]);
    pthread_join(th, NULL);
}

/* ---- (5c) over tcp: idle strangers at rank 0's door -----------------------
 * Connections to rank 0's port that say nothing must not hold the door:
 * before the gate (transport/auth.h) rank 0's thread served one connection
 * at a time, each for up to 5 s, so rank 1 (timeout 3 s) behind three of
 * them never attached. Now it attaches, a sum goes through, and each
 * stranger is refused (the first handshake part, then the end) and logged
 * with its address. */

enum { IDLE_STRANGERS = 3 };

typedef struct strangers_run {
    int fd[IDLE_STRANGERS];
    char at[96];
} strangers_run;

static int idle_connect(const char *address)
{
    const char *colon = strrchr(address, ':');
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)atoi(colon ? colon + 1 : "0")),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd >= 0) {
        struct timeval tv = {10, 0}; /* a bound for the test, never reached when it passes */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static void strangers_body(void *arg)
{
    strangers_run *sr = arg;
    forged_rank fr[2] = {0};
    mmp_reduce_cfg c0 = make_cfg(TCP_NAME, 2, 0, 64, 3000);
    CHECK_OK(mmp_reduce_open(&fr[0].r, &c0));
    snprintf(sr->at, sizeof sr->at, "%s", fr[0].r ? mmp_reduce_address(fr[0].r) : "127.0.0.1:1");
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        sr->fd[i] = idle_connect(sr->at);
        CHECK(sr->fd[i] >= 0);
    }
    mmp_reduce_cfg c1 = make_cfg(sr->at, 2, 1, 64, 3000);
    CHECK_OK(mmp_reduce_open(&fr[1].r, &c1));
    if (fr[0].r && fr[1].r) {
        for (int i = 0; i < 64; i++) {
            fr[0].v[i] = 1.0f;
            fr[1].v[i] = (float)i;
        }
        both_sum(fr);
        CHECK_OK(fr[0].e);
        CHECK_OK(fr[1].e);
        CHECK(fr[0].v[5] == 6.0f && fr[1].v[63] == 64.0f);
    }
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        unsigned char part[128];
        ssize_t got = sr->fd[i] >= 0 ? recv(sr->fd[i], part, sizeof part, MSG_WAITALL) : -1;
        CHECK(sr->fd[i] < 0 || (got == 40 && memcmp(part, "MMPAUTH1", 8) == 0));
    }
    mmp_reduce_close(fr[1].r);
    mmp_reduce_close(fr[0].r);
}

static void test_idle_strangers(void)
{
    strangers_run sr;
    memset(&sr, 0, sizeof sr);
    char *log = mmp_test_stderr_of("reduce-strangers", strangers_body, &sr);
    CHECK(log != NULL);
    int refused = 0;
    for (const char *p = log; p && (p = strstr(p, "every rank is attached; refused")); p++) {
        refused++;
    }
    char tag[160];
    snprintf(tag, sizeof tag, "reduce %s rank 0: connector 127.0.0.1:", sr.at);
    CHECK(refused == IDLE_STRANGERS && log && strstr(log, tag));
    free(log);
    for (int i = 0; i < IDLE_STRANGERS; i++) {
        if (sr.fd[i] >= 0) {
            close(sr.fd[i]);
        }
    }
}

static void test_forged(void)
{
    char name[96];
    fresh_name(name, sizeof name);
    forged_rank fr[2] = {0};
    unsigned char *seg = NULL;
    size_t seg_n = 0;
    mmp_reduce_cfg c0 = {
        .name = name, .replicas = 2, .rank = 0, .capacity = 64, .timeout_ms = 2000};
    mmp_reduce_cfg c1 = c0;
    c1.rank = 1;
    CHECK_OK(mmp_reduce_open(&fr[0].r, &c0));
    int fd = shm_open(name, O_RDWR, 0); /* before rank 1's attach unlinks it */
    CHECK(fd >= 0);
    if (fd >= 0) {
        seg_n = (size_t)lseek(fd, 0, SEEK_END);
        seg = mmap(NULL, seg_n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        CHECK(seg != MAP_FAILED);
        if (seg == MAP_FAILED) {
            seg = NULL;
        }
    }
    CHECK_OK(mmp_reduce_open(&fr[1].r, &c1));
    if (!fr[0].r || !fr[1].r || !seg) {
        goto exit;
    }
    enum { SCAN = 16384 }; /* the header: bucket_done lies past the per-rank arrays */
    static unsigned char before[SCAN];
    size_t scan = seg_n < SCAN ? seg_n : SCAN;
    memcpy(before, seg, scan);
    both_sum(fr);
    CHECK_OK(fr[0].e);
    CHECK_OK(fr[1].e);
    int found = 0;
    for (size_t off = 0; off + 8 <= scan; off += 8) {
        uint64_t was, now;
        memcpy(&was, before + off, 8);
        memcpy(&now, seg + off, 8);
        if (now == was + 2) {
            uint64_t bad = now + 1000;
            memcpy(seg + off, &bad, 8);
            found++;
        }
    }
    CHECK(found == 1 || found == 2);
    both_sum(fr);
    for (int k = 0; k < 2; k++) {
        CHECK(fr[k].e == MMP_ERR_PROTO);
        if (fr[k].e != MMP_ERR_PROTO) {
            fprintf(stderr, "  rank %d: %s\n", k, mmp_err_name(fr[k].e));
        }
    }
    CHECK(strstr(mmp_last_error(), "field done[0]") != NULL);
exit:
    if (seg) {
        munmap(seg, seg_n);
    }
    mmp_reduce_close(fr[0].r);
    mmp_reduce_close(fr[1].r);
}

/* Every case ends with nothing of its own in /dev/shm and every child it
 * forked reaped: none is left, zombie or running. */
static void run_case(const char *name, void (*fn)(void))
{
    int before = mmp_test_failures;
    double t0 = now_ms();
    fn();
    CHECK(mmp_test_shm_count(prefix, 1) == 0);
    CHECK(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD);
    fprintf(stderr, "%-12s %s (%.0f ms)\n", name, mmp_test_failures == before ? "ok" : "FAILED",
            now_ms() - t0);
}

#define CASE(fn, name)                                                                             \
    static void case_##fn(void)                                                                    \
    {                                                                                              \
        run_case(name, test_##fn);                                                                 \
    }
CASE(single, "single")
CASE(rounds_2, "rounds-2")
CASE(rounds_3, "rounds-3")
CASE(rounds_4, "rounds-4")
CASE(killed, "killed")
CASE(absent_peer, "absent-peer")
CASE(geometry, "geometry")
CASE(mismatch, "n-mismatch")
CASE(forged, "forged")
CASE(buckets, "buckets")

/* The tcp twins: the same cases with the sums over loopback tcp. */
#define TCP_CASE(fn, name)                                                                         \
    static void case_tcp_##fn(void)                                                                \
    {                                                                                              \
        tcp_now = 1;                                                                               \
        run_case(name, test_##fn);                                                                 \
        tcp_now = 0;                                                                               \
    }
TCP_CASE(rounds_2, "tcp/rounds-2")
TCP_CASE(rounds_3, "tcp/rounds-3")
TCP_CASE(killed, "tcp/killed")
TCP_CASE(mismatch, "tcp/n-mismatch")
TCP_CASE(tcp_geometry, "tcp/geometry")
TCP_CASE(buckets, "tcp/buckets")
TCP_CASE(idle_strangers, "tcp/idle-strangers")

static const mmp_test_case cases[] = {
    {"single", case_single},
    {"rounds-2", case_rounds_2},
    {"rounds-3", case_rounds_3},
    {"rounds-4", case_rounds_4},
    {"killed", case_killed},
    {"absent-peer", case_absent_peer},
    {"geometry", case_geometry},
    {"n-mismatch", case_mismatch},
    {"forged", case_forged},
    {"buckets", case_buckets},
    {"tcp/rounds-2", case_tcp_rounds_2},
    {"tcp/rounds-3", case_tcp_rounds_3},
    {"tcp/killed", case_tcp_killed},
    {"tcp/n-mismatch", case_tcp_mismatch},
    {"tcp/geometry", case_tcp_tcp_geometry},
    {"tcp/buckets", case_tcp_buckets},
    {"tcp/idle-strangers", case_tcp_idle_strangers},
};

int main(int argc, char **argv)
{
    snprintf(prefix, sizeof prefix, "/mmpipe-test-reduce-%d-", (int)getpid());
    alarm(300);
    int rc = MMP_TEST_MAIN("test_reduce", cases, argc, argv);
    mmp_shm_unlink_prefix(prefix); /* whatever a failure left */
    return rc;
}
