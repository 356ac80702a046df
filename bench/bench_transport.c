/* Benchmark of the shm data channel; prints Markdown tables, judges nothing.
 *
 * (a) Throughput between two processes (fork), slots=2: the sender either
 *     memcpy's each message from its own source buffer into the slot (what a
 *     stage that produced into its own buffer does, mmp_channel_send) or
 *     writes the slot in place (memset; the zero-copy producer); the receiver
 *     reads every byte in place (a 64-bit sum). Each rep sends enough messages
 *     for ~256 MB and is timed by the receiver from its first message to its
 *     last release (so the pipeline is full); the median rep is reported next
 *     to a plain memcpy of the same size in this process (median of as many
 *     reps) and to a memcpy across cores (a process on another CPU copying
 *     out what this one has just written: a transfer between cores pays for
 *     moving the bytes, which a memcpy inside one core's cache never does),
 *     with the futex sleeps per message of the two ends.
 * (b) Control overhead per message: a ping-pong of 8-byte messages (A posts
 *     on A->B, B answers on B->A); half the round trip is the latency from
 *     post to the peer's return. Back-to-back, a waiter's short spin can
 *     catch the reply; after a 50 µs gap the peer sleeps, so each message
 *     measures the futex doorbell's wake-up. The same over a ZeroMQ ipc PAIR
 *     socket pair, the alternative a doorbell must beat.
 *
 * (c) The tcp channel over loopback (transport/tcp.c; what stages on two
 *     hosts use): throughput as in (a), with the sender's memcpy into the
 *     slot, next to a plain loopback TCP socket moving the same bytes in
 *     the same messages (default socket options, write / recv into one
 *     buffer, the receiver summing every byte as the channel's does): the
 *     ratio of the medians is the channel's cost. Then the per-micro-batch
 *     latency: half a ping-pong round trip of one message of 64 B, 64 KB and
 *     1 MB (a micro-batch's activations), channel and plain socket.
 *
 * Options: --sizes 64K,256K,1M,4M,16M,64M (K/M suffix; bare numbers are MB,
 * fractions allowed) --tcp-sizes 1M,4M,16M (section (c)) --slots N (ring
 * depth of (a), default 2) --pin A,B (section (a): the sender and the memcpy
 * on CPU A, the receiver on CPU B) --reps N (default 15) --iters N (round trips,
 * default 20000) --busy N (N spinning processes during the measurements, to
 * see what the 2-core machine does when stages outnumber cores) --only shm|tcp
 * (sections (a) and (b), or (c), alone) --spin-ab 1 (instead of the rest:
 * zero-copy throughput with the shm waiters' adaptive spin against the old
 * 2 µs poll, two channels between the same two processes, reps alternating,
 * the ratio of each rep's pair; --pin, --busy, --sizes, --reps apply)
 * --ceiling 1 (instead of the rest: (d), the hand-off ceiling between two
 * cores without a channel, next to memcpy; --pin, --slots, --sizes, --reps
 * apply). */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/stats.h"
#include "transport/channel.h"

#define MAX_REPS 64
#define MAX_SIZES 16
#define REP_BYTES (256u << 20)
#define PING_BYTES 64
#define GAP_US 50
/* The tcp channels' job secret (transport/auth.h): both ends are this program. */
#define BENCH_SECRET "bench_transport"

static double now_s(void)
{
    return mmp_now(); /* CLOCK_MONOTONIC */
}

/* CPU time of this thread (s). */
static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The q-quantile (0..1) of v[0..n), sorting v. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, mmp_cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

static void die(const char *what)
{
    fprintf(stderr, "bench_transport: %s: %s\n", what, mmp_last_error());
    exit(1);
}

static void *shared_pages(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "bench_transport: mmap: %s\n", strerror(errno));
        exit(1);
    }
    return p;
}

/* ---- (a) throughput ----------------------------------------------------- */

enum { SEND_COPY = 0, SEND_IN_PLACE = 1, MODES = 2 };

typedef struct tp_result {
    double gbps[MODES][MAX_REPS];
    /* CPU seconds each end spent on a rep's messages (spinning included) */
    double cpu_s[2][MODES][MAX_REPS]; /* [0] sender, [1] receiver */
    /* voluntary context switches (a futex sleep each) per message, each end */
    double sleeps[2][MODES][MAX_REPS];
    uint64_t sink; /* the receiver's sums, so the reads are not optimised away */
} tp_result;

static uint64_t sum_bytes(const void *p, size_t n)
{
    const uint64_t *w = p;
    uint64_t s = 0;
    for (size_t i = 0; i < n / 8; i++) {
        s += w[i];
    }
    return s;
}

/* Voluntary context switches of this thread so far: one per futex sleep. */
static long nvcsw(void)
{
    struct rusage u;
    return getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_nvcsw : 0;
}

/* Receives msgs messages (each read in full into *sink) and returns GB/s of
 * slot_bytes messages, timed from the first one's arrival (one message fewer). */
static double recv_gbps(mmp_channel *ch, int msgs, size_t slot_bytes, uint64_t *sink,
                        const char *what)
{
    double t0 = 0;
    for (int m = 0; m < msgs; m++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
            die(what);
        }
        *sink += sum_bytes(p, h.bytes);
        mmp_channel_release(ch);
        if (m == 0) {
            t0 = now_s();
        }
    }
    return (double)(msgs - 1) * slot_bytes / (now_s() - t0) / 1e9;
}

static void tp_receiver(const mmp_channel_cfg *cfg, int reps, int msgs, tp_result *res)
{
    const mmp_transport *t = &mmp_transport_shm;
    mmp_channel *ch;
    if (mmp_channel_open_with(&ch, t, cfg, 0) != MMP_OK) {
        die("receiver connect");
    }
    uint64_t sink = 0;
    /* reps alternate between the modes (rep r of mode m is message block
     * r * MODES + m), so a load change on the machine hits both alike */
    for (int r = 0; r < reps; r++) {
        for (int mode = 0; mode < MODES; mode++) {
            double t0 = 0, c0 = 0;
            long v0 = 0;
            for (int m = 0; m < msgs; m++) {
                mmp_msg_header h;
                const void *p;
                if (mmp_channel_recv(ch, &h, &p) != MMP_OK) {
                    die("recv");
                }
                sink += sum_bytes(p, h.bytes);
                mmp_channel_release(ch);
                if (m == 0) {
                    t0 = now_s();
                    c0 = cpu_s();
                    v0 = nvcsw();
                }
            }
            res->sleeps[1][mode][r] = (double)(nvcsw() - v0) / (msgs - 1 > 0 ? msgs - 1 : 1);
            res->gbps[mode][r] = (double)(msgs - 1) * cfg->slot_bytes / (now_s() - t0) / 1e9;
            res->cpu_s[1][mode][r] = (cpu_s() - c0) * msgs / (msgs - 1 > 0 ? msgs - 1 : 1);
        }
    }
    res->sink = sink;
    mmp_channel_close(ch);
}

static void tp_sender(const mmp_channel_cfg *cfg, int reps, int msgs, pid_t receiver,
                      tp_result *cpu_res)
{
    const mmp_transport *t = &mmp_transport_shm;
    mmp_channel *ch;
    if (mmp_channel_open_with(&ch, t, cfg, 1) != MMP_OK) {
        die("sender setup");
    }
    unsigned char *src = malloc(cfg->slot_bytes);
    if (!src) {
        die("malloc");
    }
    memset(src, 0x5a, cfg->slot_bytes);
    tp_result *res = cpu_res;
    double c0 = 0;
    long v0 = 0;
    for (int k = 0; k < reps * MODES * msgs; k++) {
        int mode = (k / msgs) % MODES;
        if (k % msgs == 0) {
            c0 = cpu_s();
            v0 = nvcsw();
        }
        mmp_msg_header h = {.step = k, .bytes = cfg->slot_bytes};
        if (mode == SEND_COPY) {
            if (mmp_channel_send(ch, &h, src) != MMP_OK) {
                die("send");
            }
        } else {
            void *p;
            if (mmp_channel_acquire(ch, &p) != MMP_OK) {
                die("acquire");
            }
            memset(p, k & 0xff, cfg->slot_bytes);
            if (mmp_channel_post(ch, &h) != MMP_OK) {
                die("post");
            }
        }
        if (k % msgs == msgs - 1) {
            res->cpu_s[0][mode][k / (msgs * MODES)] = cpu_s() - c0;
            res->sleeps[0][mode][k / (msgs * MODES)] = (double)(nvcsw() - v0) / msgs;
        }
    }
    int st;
    waitpid(receiver, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_transport: receiver failed (status %#x)\n", st);
        exit(1);
    }
    free(src);
    mmp_channel_close(ch);
}

/* A plain memcpy of `bytes` between two private buffers, msgs times per rep,
 * into v[0..reps). */
static void memcpy_gbps(size_t bytes, int reps, int msgs, double *v, double *cpu)
{
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        die("malloc");
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(), c0 = cpu_s();
        for (int m = 0; m < msgs; m++) {
            memcpy(b, a, bytes);
            a[m % bytes] = b[bytes - 1 - m % bytes]; /* keep both buffers live */
        }
        v[r] = (double)msgs * bytes / (now_s() - t0) / 1e9;
        cpu[r] = (double)msgs * bytes / (cpu_s() - c0) / 1e9;
    }
    free(a);
    free(b);
}

/* The channel's work without the channel: the sender's write and the
 * receiver's read of each message, one after the other in this thread,
 * through two slot-sized buffers. Two processes on two cores beat it only if
 * memory bandwidth lets them overlap. */
static double serial_gbps(size_t bytes, int reps, int msgs, int mode)
{
    unsigned char *src = malloc(bytes), *slot[2] = {malloc(bytes), malloc(bytes)};
    double v[MAX_REPS];
    uint64_t sink = 0;
    if (!src || !slot[0] || !slot[1]) {
        die("malloc");
    }
    memset(src, 0x5a, bytes);
    memset(slot[0], 0, bytes);
    memset(slot[1], 0, bytes);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int m = 0; m < msgs; m++) {
            if (mode == SEND_COPY) {
                memcpy(slot[m % 2], src, bytes);
            } else {
                memset(slot[m % 2], m & 0xff, bytes);
            }
            sink += sum_bytes(slot[m % 2], bytes);
        }
        v[r] = (double)msgs * bytes / (now_s() - t0) / 1e9;
    }
    src[0] = (unsigned char)sink;
    free(src);
    free(slot[0]);
    free(slot[1]);
    return quantile(v, reps, 0.5);
}

/* "64 KB", "1 MB", "1.5 MB" */
static const char *size_name(size_t bytes, char *buf, size_t n)
{
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
        snprintf(buf, n, "%zu MB", bytes >> 20);
    } else if (bytes >= (1u << 20)) {
        snprintf(buf, n, "%.2f MB", (double)bytes / (1u << 20));
    } else if (bytes >= 1024 && bytes % 1024 == 0) {
        snprintf(buf, n, "%zu KB", bytes >> 10);
    } else {
        snprintf(buf, n, "%zu B", bytes);
    }
    return buf;
}

/* Messages per rep: ~REP_BYTES, at least 8. */
static int msgs_for(size_t bytes)
{
    return REP_BYTES / bytes < 8 ? 8 : (int)(REP_BYTES / bytes);
}

/* --pin A,B: the sender (and the memcpy) on CPU A, the receiver on CPU B;
 * -1: where the scheduler puts them. */
static int pin_cpu[2] = {-1, -1};

static void pin(int who)
{
    if (pin_cpu[who] < 0) {
        return;
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(pin_cpu[who], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "bench_transport: pin to CPU %d: %s\n", pin_cpu[who], strerror(errno));
        exit(1);
    }
}

/* memcpy across cores: another process, on another CPU, copies each message
 * out of a buffer this process has just written (memset, as the zero-copy
 * sender) into its own buffer, then hands the buffer back (a flag, not
 * timed), and this process writes it again: the bytes start in the writer's
 * cache, as a channel's do, and nothing else runs in the pair while the copy
 * is timed. GB/s of the copies alone (bytes over the time inside memcpy), one
 * figure per rep into v[0..reps). The two processes are pinned to the CPUs
 * xcore_cpus chose: a memcpy between two cores is what a transfer between
 * two processes can be held to (a memcpy inside one core's cache never pays
 * for the move). */
typedef struct xcore_shared {
    _Atomic uint64_t head; /* buffers written */
    char pad1[120];
    _Atomic uint64_t tail; /* buffers copied */
    char pad2[120];
    double gbps[MAX_REPS];
    uint64_t sink; /* the reader's sums, so its reads are not optimised away */
} xcore_shared;

/* The two CPUs of the cross-core memcpy: --pin's, else the first two this
 * process may run on; 0 when it may run on one CPU only. */
static int xcore_cpus(int cpu[2])
{
    if (pin_cpu[0] >= 0) {
        cpu[0] = pin_cpu[0];
        cpu[1] = pin_cpu[1];
        return cpu[0] != cpu[1];
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        return 0;
    }
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++) {
        if (CPU_ISSET(c, &set)) {
            cpu[n++] = c;
        }
    }
    return n == 2;
}

static void pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        fprintf(stderr, "bench_transport: pin to CPU %d: %s\n", cpu, strerror(errno));
        exit(1);
    }
}

static void xcore_wait(_Atomic uint64_t *c, uint64_t target)
{
    for (int i = 1; atomic_load_explicit(c, memory_order_acquire) < target; i++) {
        if (i % 4096 == 0) {
            sched_yield(); /* not timed; lets a loaded machine's other work through */
        }
    }
}

/* A writer and a reader on two CPUs (xcore_cpus), sharing x and a ring of
 * `slots` buffers of `bytes`: the writer writes message k into buffer
 * k % slots once the reader has freed it, the reader takes it and frees it
 * (two counters, spinning). */
typedef struct xcore_job {
    size_t bytes;
    int reps, msgs, slots, mode; /* mode: how the writer writes (CEIL_*) */
    unsigned char *ring;         /* shared: slots * bytes */
    xcore_shared *x;
} xcore_job;

static void ring_writer(const xcore_job *j);

/* Runs reader in a child pinned to the second CPU and ring_writer here on
 * the first; the reader leaves a GB/s per rep in x->gbps, copied to
 * v[0..reps). Fills v with NAN when there are not two CPUs to run it on. */
static void xcore_pair(xcore_job *j, void (*reader)(const xcore_job *), double *v)
{
    int cpu[2];
    if (!xcore_cpus(cpu)) {
        for (int r = 0; r < j->reps; r++) {
            v[r] = NAN;
        }
        return;
    }
    size_t ring_bytes = j->bytes * (size_t)j->slots;
    j->x = shared_pages(sizeof *j->x);
    j->ring = shared_pages(ring_bytes);
    memset(j->ring, 1, ring_bytes);
    cpu_set_t was;
    if (sched_getaffinity(0, sizeof was, &was) != 0) {
        die("sched_getaffinity");
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        pin_to(cpu[1]);
        reader(j);
        _exit(0);
    }
    pin_to(cpu[0]);
    ring_writer(j);
    int st;
    waitpid(pid, &st, 0);
    sched_setaffinity(0, sizeof was, &was);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_transport: cross-core reader failed\n");
        exit(1);
    }
    memcpy(v, j->x->gbps, sizeof(double) * (size_t)j->reps);
    munmap(j->ring, ring_bytes);
    munmap(j->x, sizeof *j->x);
}

static void memcpy_reader(const xcore_job *j)
{
    unsigned char *dst = malloc(j->bytes);
    if (!dst) {
        _exit(1);
    }
    memset(dst, 0, j->bytes);
    uint64_t k = 0;
    for (int r = 0; r < j->reps; r++) {
        double busy = 0;
        for (int m = 0; m < j->msgs; m++, k++) {
            xcore_wait(&j->x->head, k + 1);
            double t0 = now_s();
            memcpy(dst, j->ring + (k % (uint64_t)j->slots) * j->bytes, j->bytes);
            busy += now_s() - t0;
            dst[k % j->bytes] ^= 1; /* the copy is used */
            atomic_store_explicit(&j->x->tail, k + 1, memory_order_release);
        }
        j->x->gbps[r] = (double)j->msgs * j->bytes / busy / 1e9;
    }
    free(dst);
}

static void xcore_memcpy_gbps(size_t bytes, int reps, int msgs, double *v)
{
    xcore_job j = {.bytes = bytes, .reps = reps, .msgs = msgs, .slots = 1, .mode = 0};
    xcore_pair(&j, memcpy_reader, v);
}

/* ---- (d) the hardware's ceiling for a hand-off between two cores ---------- */

/* No channel: two processes pinned to two CPUs (xcore_cpus) share a ring of
 * `slots` buffers and two spin counters (no syscalls, no credits, no
 * checks). The writer writes each message into the next free buffer, the
 * reader sums it in place and frees it, as the channel's zero-copy ends do;
 * timed by the reader from its first message to its last. What a channel
 * between two cores could reach at best on this machine, whatever it is
 * built of; the writer's variants are the two ways x86 offers to hand lines
 * to another core sooner: CLDEMOTE (push each written line from the writer's
 * L1/L2 to the shared L3) and non-temporal stores (write around the
 * writer's caches). */
enum { CEIL_PLAIN, CEIL_DEMOTE, CEIL_NT, CEIL_MODES };
static const char *const ceil_name[CEIL_MODES] = {"plain", "cldemote", "non-temporal"};

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
static int have_cldemote(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 25));
}
__attribute__((target("cldemote"))) static void demote_lines(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        _cldemote(p + i);
    }
}
static void write_nt(unsigned char *p, size_t n, int v)
{
    __m128i x = _mm_set1_epi8((char)v);
    for (size_t i = 0; i + 16 <= n; i += 16) {
        _mm_stream_si128((__m128i *)(void *)(p + i), x);
    }
    _mm_sfence();
}
#else
static int have_cldemote(void)
{
    return 0;
}
static void demote_lines(unsigned char *p, size_t n)
{
    (void)p;
    (void)n;
}
static void write_nt(unsigned char *p, size_t n, int v)
{
    memset(p, v, n);
}
#endif

static void ring_writer(const xcore_job *j)
{
    for (uint64_t k = 0; k < (uint64_t)j->reps * (uint64_t)j->msgs; k++) {
        if (k >= (uint64_t)j->slots) {
            xcore_wait(&j->x->tail, k - (uint64_t)j->slots + 1);
        }
        unsigned char *p = j->ring + (k % (uint64_t)j->slots) * j->bytes;
        if (j->mode == CEIL_NT) {
            write_nt(p, j->bytes, (int)(k & 0xff));
        } else {
            memset(p, (int)(k & 0xff), j->bytes);
            if (j->mode == CEIL_DEMOTE) {
                demote_lines(p, j->bytes);
            }
        }
        atomic_store_explicit(&j->x->head, k + 1, memory_order_release);
    }
}

static void sum_reader(const xcore_job *j)
{
    uint64_t k = 0, sink = 0;
    for (int r = 0; r < j->reps; r++) {
        double t0 = 0;
        for (int m = 0; m < j->msgs; m++, k++) {
            xcore_wait(&j->x->head, k + 1);
            if (m == 0) {
                t0 = now_s();
            }
            sink += sum_bytes(j->ring + (k % (uint64_t)j->slots) * j->bytes, j->bytes);
            atomic_store_explicit(&j->x->tail, k + 1, memory_order_release);
        }
        /* the first message's wait is not timed: msgs - 1 transfers */
        j->x->gbps[r] = (double)(j->msgs - 1) * j->bytes / (now_s() - t0) / 1e9;
    }
    j->x->sink = sink; /* the sums are used */
}

/* GB/s of each rep into v[0..reps); NAN when there are not two CPUs. */
static void ceiling_gbps(size_t bytes, int reps, int msgs, int slots, int mode, double *v)
{
    xcore_job j = {.bytes = bytes, .reps = reps, .msgs = msgs, .slots = slots, .mode = mode};
    xcore_pair(&j, sum_reader, v);
}

static void ceiling(const size_t *sizes, int nsizes, int reps, int slots)
{
    int cpu[2];
    if (!xcore_cpus(cpu)) {
        printf("## hand-off ceiling: needs two CPUs, skipped\n\n");
        return;
    }
    int demote = have_cldemote();
    printf("## hand-off ceiling between two cores: no channel, slots=%d, CPUs %d and %d, median "
           "of %d reps of ~%u MB\n\n",
           slots, cpu[0], cpu[1], reps, REP_BYTES >> 20);
    printf("What is compared. Two processes pinned to two CPUs share a ring of %d buffers and "
           "two spin counters, nothing else (no syscalls, credits or checks): the writer writes "
           "each message into the next free buffer, the reader sums it in place and frees it, "
           "as the channel's zero-copy ends do; GB/s timed by the reader. The best any "
           "transfer between two cores can do on this machine, however built. Writers: plain "
           "(memset); cldemote (then CLDEMOTE each line, pushing it to the shared L3%s); "
           "non-temporal (streaming stores around the writer's caches). memcpy = one thread "
           "copying between two cache-warm buffers (the (a) section's), reps alternating with "
           "the ceiling's; ratio = ceiling / memcpy, medians.\n\n",
           slots, demote ? "" : "; this CPU has no CLDEMOTE, where it is a no-op");
    printf("| size | memcpy GB/s |");
    for (int m = 0; m < CEIL_MODES; m++) {
        printf(" %s GB/s | %s ratio |", ceil_name[m], ceil_name[m]);
    }
    printf("\n|---:|---:|");
    for (int m = 0; m < CEIL_MODES; m++) {
        printf("---:|---:|");
    }
    printf("\n");
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int msgs = msgs_for(bytes);
        double mc[MAX_REPS], mc_cpu[MAX_REPS], g[CEIL_MODES][MAX_REPS], one;
        for (int r = 0; r < reps; r++) {
            memcpy_gbps(bytes, 1, msgs, &mc[r], &mc_cpu[r]);
            for (int m = 0; m < CEIL_MODES; m++) {
                ceiling_gbps(bytes, 1, msgs, slots, m, &one);
                g[m][r] = one;
            }
        }
        char name[32];
        double mmed = quantile(mc, reps, 0.5);
        printf("| %s | %.2f |", size_name(bytes, name, sizeof name), mmed);
        for (int m = 0; m < CEIL_MODES; m++) {
            double med = quantile(g[m], reps, 0.5);
            printf(" %.2f | %.2f |", med, med / mmed);
        }
        printf("\n");
        fflush(stdout);
    }
    printf("\n");
}

static void throughput(const size_t *sizes, int nsizes, int reps, int slots)
{
    printf("## shm channel throughput: 2 processes, slots=%d, median of %d reps of ~%u MB\n\n",
           slots, reps, REP_BYTES >> 20);
    if (pin_cpu[0] >= 0) {
        printf("Sender and memcpy pinned to CPU %d, receiver to CPU %d.\n\n", pin_cpu[0],
               pin_cpu[1]);
    }
    cpu_set_t was;
    if (sched_getaffinity(0, sizeof was, &was) != 0) {
        die("sched_getaffinity");
    }
    pin(0);
    printf("What is compared. channel = GB/s (1e9 bytes/s) of payload delivered from one process "
           "to another: the sender produces each message and posts it, the receiver (another "
           "process) gets it, reads every byte in place (a 64-bit sum) and releases it; timed by "
           "the receiver from its first message to its last release, so the ring is full. Two "
           "senders, reps alternating between them: 'copy' = mmp_channel_send, a memcpy from the "
           "sender's own (cache-warm) buffer into the slot, as a stage that computed into its own "
           "buffer; 'zero-copy' = acquire, write the slot in place (memset), post, as a producer "
           "that writes its output straight into the slot. memcpy = one thread copying the same "
           "number of bytes between two private buffers of the message's size in one process "
           "(the same buffers every time, so as cache-warm as the slots), half its reps before "
           "the channel's and half after; ratio = channel / memcpy, medians of this run. A "
           "channel at ratio 1.0 moves bytes between processes as fast as one memcpy moves "
           "them inside one; below the size of a core's L2 that memcpy never leaves the core, "
           "which no transfer between two cores can match. memcpy across cores = the baseline a "
           "transfer can be held to: a process on another CPU (--pin's two, else the first two "
           "this one may use) memcpy's each message out of a buffer this process, on the first, "
           "has just written (memset) into its own buffer and hands it back, so the bytes start "
           "in the writer's cache as a channel's do; GB/s of the copies alone (the hand-offs "
           "not timed), a quarter as many messages a rep, half the reps before the channel's and "
           "half after; the 'across cores' ratios are channel / that. one "
           "thread = the sender's write and the receiver's read of each message done by one "
           "thread through two buffers (copy sender): no channel. CPU time column: the "
           "zero-copy ratio with each side's CPU time in place of wall time (the channel: bytes "
           "over the busier end's CPU seconds, its spinning included; memcpy: bytes over its CPU "
           "seconds): what the ratio would be if each process had a core of its own; on a "
           "loaded machine the wall-time ratio also counts the time the ends wait for a "
           "core.\n\n");
    printf("| size | copy GB/s | zero-copy GB/s | memcpy GB/s | memcpy across cores GB/s | copy "
           "ratio | zero-copy ratio | copy ratio, across cores | zero-copy ratio, across cores | "
           "zero-copy ratio, CPU time | zero-copy sleeps per message | one thread GB/s |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    tp_result *res = shared_pages(sizeof *res);
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int msgs = msgs_for(bytes);
        char addr[96], name[32];
        snprintf(addr, sizeof addr, "/mmpipe-bench-%d-tp%d", (int)getpid(), s);
        double cpv[MAX_REPS], cpc[MAX_REPS], xcv[MAX_REPS];
        int before = (reps + 1) / 2;
        memcpy_gbps(bytes, before, msgs, cpv, cpc);
        int xmsgs = msgs / 4 < 8 ? 8 : msgs / 4; /* its hand-offs are not timed: fewer */
        xcore_memcpy_gbps(bytes, before, xmsgs, xcv);
        mmp_channel_cfg scfg = {.address = addr,
                                .slot_bytes = bytes,
                                .slots = slots,
                                .send = 1,
                                .timeout_ms = 60000},
                        rcfg = scfg;
        rcfg.send = 0;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            pin(1);
            tp_receiver(&rcfg, reps, msgs, res);
            _exit(0);
        }
        tp_sender(&scfg, reps, msgs, pid, res);
        memcpy_gbps(bytes, reps - before, msgs, cpv + before, cpc + before);
        xcore_memcpy_gbps(bytes, reps - before, xmsgs, xcv + before);
        double cp = quantile(cpv, reps, 0.5), cpu_cp = quantile(cpc, reps, 0.5);
        double xc = quantile(xcv, reps, 0.5);
        double g[MODES], gc[MODES], sl[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            sl[r] = res->sleeps[0][SEND_IN_PLACE][r] + res->sleeps[1][SEND_IN_PLACE][r];
        }
        double sleeps = quantile(sl, reps, 0.5);
        for (int m = 0; m < MODES; m++) {
            g[m] = quantile(res->gbps[m], reps, 0.5);
            double v[MAX_REPS];
            for (int r = 0; r < reps; r++) {
                double c = res->cpu_s[0][m][r] > res->cpu_s[1][m][r] ? res->cpu_s[0][m][r]
                                                                     : res->cpu_s[1][m][r];
                v[r] = (double)msgs * bytes / c / 1e9;
            }
            gc[m] = quantile(v, reps, 0.5);
        }
        double one = serial_gbps(bytes, reps, msgs, SEND_COPY);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f "
               "|\n",
               size_name(bytes, name, sizeof name), g[SEND_COPY], g[SEND_IN_PLACE], cp, xc,
               g[SEND_COPY] / cp, g[SEND_IN_PLACE] / cp, g[SEND_COPY] / xc, g[SEND_IN_PLACE] / xc,
               gc[SEND_IN_PLACE] / cpu_cp, sleeps, one);
    }
    printf("\n");
    munmap(res, sizeof *res);
    sched_setaffinity(0, sizeof was, &was); /* the other sections: unpinned */
}

/* ---- (a') the adaptive spin against the old wait --------------------------- */

/* Opens one end with MMP_SHM_SPIN_MAX_NS set to `max` for the open only
 * (NULL: as the environment says). */
static mmp_channel *open_with_spin_max(const mmp_channel_cfg *cfg, int creator, const char *max)
{
    const char *was = getenv("MMP_SHM_SPIN_MAX_NS");
    char keep[32] = "";
    if (was) {
        snprintf(keep, sizeof keep, "%s", was);
    }
    if (max) {
        setenv("MMP_SHM_SPIN_MAX_NS", max, 1);
    }
    mmp_channel *ch;
    mmp_err e = mmp_channel_open_with(&ch, &mmp_transport_shm, cfg, creator);
    if (was) {
        setenv("MMP_SHM_SPIN_MAX_NS", keep, 1);
    } else {
        unsetenv("MMP_SHM_SPIN_MAX_NS");
    }
    if (e != MMP_OK) {
        die(creator ? "spin A/B setup" : "spin A/B connect");
    }
    return ch;
}

/* --spin-ab: zero-copy throughput as in (a) over two channels between the
 * same two processes, one with the waiting ends' adaptive spin (the
 * default) and one with MMP_SHM_SPIN_MAX_NS=0 (a 2 µs poll, then the futex:
 * the wait before the adaptive spin), reps alternating between them, so a
 * load change hits both alike; ratio = median of the per-rep ratios. */
static void spin_ab(const size_t *sizes, int nsizes, int reps, int slots)
{
    static const char *const max[2] = {NULL, "0"};
    printf("## adaptive spin against the old wait: zero-copy, 2 processes, slots=%d, %d reps "
           "each, alternating\n\n",
           slots, reps);
    printf("adaptive = this build's default; old = MMP_SHM_SPIN_MAX_NS=0 (poll 2 µs, then "
           "sleep on the futex); sleeps = the receiver's futex sleeps per message.\n\n");
    printf("| size | adaptive GB/s | old GB/s | adaptive / old | adaptive sleeps | old sleeps "
           "|\n|---:|---:|---:|---:|---:|---:|\n");
    pin(0);
    tp_result *res = shared_pages(sizeof *res);
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int msgs = msgs_for(bytes);
        char addr[2][96], name[32];
        mmp_channel_cfg cfg[2];
        for (int v = 0; v < 2; v++) {
            snprintf(addr[v], sizeof addr[v], "/mmpipe-bench-%d-ab%d-%d", (int)getpid(), s, v);
            cfg[v] = (mmp_channel_cfg){.address = addr[v],
                                       .slot_bytes = bytes,
                                       .slots = slots,
                                       .send = 1,
                                       .timeout_ms = 60000};
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            pin(1);
            mmp_channel *ch[2];
            uint64_t sink = 0;
            for (int v = 0; v < 2; v++) {
                cfg[v].send = 0;
                ch[v] = open_with_spin_max(&cfg[v], 0, max[v]);
            }
            for (int r = 0; r < reps; r++) {
                for (int v = 0; v < 2; v++) {
                    long v0 = nvcsw();
                    res->gbps[v][r] = recv_gbps(ch[v], msgs, bytes, &sink, "spin A/B recv");
                    res->sleeps[1][v][r] = (double)(nvcsw() - v0) / msgs;
                }
            }
            res->sink = sink;
            mmp_channel_close(ch[0]);
            mmp_channel_close(ch[1]);
            _exit(0);
        }
        mmp_channel *ch[2];
        for (int v = 0; v < 2; v++) {
            ch[v] = open_with_spin_max(&cfg[v], 1, max[v]);
        }
        for (int r = 0; r < reps; r++) {
            for (int v = 0; v < 2; v++) {
                for (int m = 0; m < msgs; m++) {
                    mmp_msg_header h = {.step = m, .bytes = bytes};
                    void *p;
                    if (mmp_channel_acquire(ch[v], &p) != MMP_OK) {
                        die("spin A/B acquire");
                    }
                    memset(p, m & 0xff, bytes);
                    if (mmp_channel_post(ch[v], &h) != MMP_OK) {
                        die("spin A/B post");
                    }
                }
            }
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "bench_transport: spin A/B receiver failed (status %#x)\n", st);
            exit(1);
        }
        mmp_channel_close(ch[0]);
        mmp_channel_close(ch[1]);
        double ratio[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            ratio[r] = res->gbps[0][r] / res->gbps[1][r];
        }
        double g0 = quantile(res->gbps[0], reps, 0.5), g1 = quantile(res->gbps[1], reps, 0.5);
        double s0 = quantile(res->sleeps[1][0], reps, 0.5);
        double s1 = quantile(res->sleeps[1][1], reps, 0.5);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |\n", size_name(bytes, name, sizeof name),
               g0, g1, quantile(ratio, reps, 0.5), s0, s1);
    }
    printf("\n");
    munmap(res, sizeof *res);
}

/* ---- (b) ping-pong latency --------------------------------------------- */

/* One end of the shm ping-pong: tx creates the channel at to, rx connects to
 * the peer's at from. */
static void open_ping_ends(const char *to, const char *from, mmp_channel **tx, mmp_channel **rx,
                           const char *what)
{
    const mmp_transport *t = &mmp_transport_shm;
    mmp_channel_cfg
        out = {.address = to, .slot_bytes = PING_BYTES, .slots = 2, .send = 1, .timeout_ms = 60000},
        in = {
            .address = from, .slot_bytes = PING_BYTES, .slots = 2, .send = 0, .timeout_ms = 60000};
    if (mmp_channel_open_with(tx, t, &out, 1) != MMP_OK ||
        mmp_channel_open_with(rx, t, &in, 0) != MMP_OK) {
        die(what);
    }
}

static void shm_pong(const char *ab, const char *ba, int n)
{
    mmp_channel *tx, *rx;
    open_ping_ends(ba, ab, &tx, &rx, "pong open");
    for (int i = 0; i < n; i++) {
        mmp_msg_header h;
        const void *p;
        void *q;
        if (mmp_channel_recv(rx, &h, &p) != MMP_OK) {
            die("pong recv");
        }
        mmp_channel_release(rx);
        if (mmp_channel_acquire(tx, &q) != MMP_OK || mmp_channel_post(tx, &h) != MMP_OK) {
            die("pong post");
        }
    }
    mmp_channel_close(rx);
    mmp_channel_close(tx);
}

/* One-way latencies in µs (half round trips) into us[0..n), each round trip
 * after gap_us. */
/* Busy-waits us microseconds: long enough for the peer to have gone to
 * sleep, without this process sleeping too. */
static void pause_us(double us)
{
    double end = now_s() + us * 1e-6;
    while (now_s() < end) {
    }
}

static void shm_ping(const char *ab, const char *ba, int warm, int n, double gap_us, double *us)
{
    mmp_channel *tx, *rx;
    open_ping_ends(ab, ba, &tx, &rx, "ping open");
    for (int i = 0; i < warm + n; i++) {
        mmp_msg_header h = {.step = i, .bytes = 8};
        const void *p;
        void *q;
        pause_us(gap_us);
        double t0 = now_s();
        if (mmp_channel_acquire(tx, &q) != MMP_OK) {
            die("ping acquire");
        }
        if (mmp_channel_fill(tx, q, &i, sizeof i) != MMP_OK) {
            die("ping fill");
        }
        if (mmp_channel_post(tx, &h) != MMP_OK || mmp_channel_recv(rx, &h, &p) != MMP_OK) {
            die("ping");
        }
        mmp_channel_release(rx);
        if (i >= warm) {
            us[i - warm] = (now_s() - t0) * 1e6 / 2;
        }
    }
    mmp_channel_close(rx);
    mmp_channel_close(tx);
}

static void *zmq_pair(void **ctx, const char *endpoint, int bind)
{
    *ctx = zmq_ctx_new();
    void *s = *ctx ? zmq_socket(*ctx, ZMQ_PAIR) : NULL;
    int zero = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        (bind ? zmq_bind(s, endpoint) : zmq_connect(s, endpoint)) != 0) {
        fprintf(stderr, "bench_transport: zmq %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        exit(1);
    }
    return s;
}

static void zmq_pong(const char *endpoint, int n)
{
    void *ctx, *s = zmq_pair(&ctx, endpoint, 0);
    char buf[PING_BYTES];
    for (int i = 0; i < n; i++) {
        int got = zmq_recv(s, buf, sizeof buf, 0);
        if (got < 0 || zmq_send(s, buf, (size_t)got, 0) < 0) {
            exit(1);
        }
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
}

static void zmq_ping(const char *endpoint, int warm, int n, double gap_us, double *us)
{
    void *ctx, *s = zmq_pair(&ctx, endpoint, 1);
    char buf[PING_BYTES] = {0};
    for (int i = 0; i < warm + n; i++) {
        pause_us(gap_us);
        double t0 = now_s();
        if (zmq_send(s, buf, 8, 0) < 0 || zmq_recv(s, buf, sizeof buf, 0) < 0) {
            fprintf(stderr, "bench_transport: zmq ping: %s\n", zmq_strerror(zmq_errno()));
            exit(1);
        }
        if (i >= warm) {
            us[i - warm] = (now_s() - t0) * 1e6 / 2;
        }
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
}

static void report_row(const char *name, double *us, int n)
{
    printf("| %s | %.2f | %.2f | %.2f |\n", name, quantile(us, n, 0.5), quantile(us, n, 0.9),
           quantile(us, n, 0.99));
}

static void latency(int iters)
{
    int warm = iters / 10 + 100;
    double *us = malloc(sizeof *us * (size_t)iters);
    char ab[96], ba[96], ipc[128];
    if (!us) {
        die("malloc");
    }
    printf("## control overhead: one-way latency (half a ping-pong round trip), 8-byte "
           "messages, %d round trips\n\n",
           iters);
    printf("back-to-back: the next ping follows the pong at once, so a waiter that spins "
           "catches it; after a %d µs gap: the peer has gone to sleep, so every message is a "
           "wake-up (the futex doorbell for shm, a socket wake-up for ZeroMQ), as for a stage "
           "waiting for a micro-batch.\n\n",
           GAP_US);
    printf("| channel | median µs | p90 µs | p99 µs |\n|---|---:|---:|---:|\n");
    static const struct {
        const char *name;
        int zmq;
        double gap_us;
    } rows[] = {
        {"shm, back-to-back", 0, 0},
        {"shm, after a gap (futex wake each way)", 0, GAP_US},
        {"ZeroMQ ipc PAIR, back-to-back", 1, 0},
        {"ZeroMQ ipc PAIR, after a gap", 1, GAP_US},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        snprintf(ab, sizeof ab, "/mmpipe-bench-%d-ab%zu", (int)getpid(), r);
        snprintf(ba, sizeof ba, "/mmpipe-bench-%d-ba%zu", (int)getpid(), r);
        snprintf(ipc, sizeof ipc, "ipc:///tmp/mmpipe-bench-%d-%zu.ipc", (int)getpid(), r);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            if (rows[r].zmq) {
                zmq_pong(ipc, warm + iters);
            } else {
                shm_pong(ab, ba, warm + iters);
            }
            _exit(0);
        }
        if (rows[r].zmq) {
            zmq_ping(ipc, warm, iters, rows[r].gap_us, us);
            unlink(ipc + strlen("ipc://"));
        } else {
            shm_ping(ab, ba, warm, iters, rows[r].gap_us, us);
        }
        waitpid(pid, NULL, 0);
        report_row(rows[r].name, us, iters);
    }
    printf("\n");
    free(us);
}

/* ---- (c) tcp over loopback ------------------------------------------------ */

/* The sender end of a tcp channel (the creator, on a free loopback port) and
 * a forked receiver connected to it running fn; the child's exit is checked
 * by the caller (waitpid). */
static pid_t tcp_pair(mmp_channel **snd, size_t bytes, void (*fn)(const mmp_channel_cfg *, void *),
                      void *arg)
{
    mmp_channel_cfg c = {.address = "127.0.0.1:0",
                         .slot_bytes = bytes,
                         .slots = 2,
                         .send = 1,
                         .timeout_ms = 60000,
                         .secret = BENCH_SECRET};
    if (mmp_channel_open(snd, "tcp", &c, 1) != MMP_OK) {
        die("tcp setup");
    }
    static char at[128];
    snprintf(at, sizeof at, "%s", mmp_channel_address(*snd));
    c.address = at;
    c.send = 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        fn(&c, arg);
        _exit(0);
    }
    return pid;
}

typedef struct tcp_tp_arg {
    int reps, msgs;
    tp_result *res;
} tcp_tp_arg;

static void tcp_tp_receiver(const mmp_channel_cfg *c, void *arg)
{
    tcp_tp_arg *a = arg;
    mmp_channel *ch;
    if (mmp_channel_open(&ch, "tcp", c, 0) != MMP_OK) {
        die("tcp connect");
    }
    uint64_t sink = 0;
    for (int r = 0; r < a->reps; r++) {
        a->res->gbps[SEND_COPY][r] = recv_gbps(ch, a->msgs, c->slot_bytes, &sink, "tcp recv");
    }
    a->res->sink = sink;
    mmp_channel_close(ch);
}

/* A plain loopback socket: a listener on a free port, its port in *port. */
static int plain_listen(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &l) != 0) {
        fprintf(stderr, "bench_transport: plain listen: %s\n", strerror(errno));
        exit(1);
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static int plain_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "bench_transport: plain connect: %s\n", strerror(errno));
        exit(1);
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void plain_write(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            fprintf(stderr, "bench_transport: plain send: %s\n", strerror(errno));
            exit(1);
        }
        p = (const char *)p + w;
        n -= (size_t)w;
    }
}

static void plain_read(int fd, void *p, size_t n)
{
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r <= 0) {
            fprintf(stderr, "bench_transport: plain recv: %s\n", r ? strerror(errno) : "EOF");
            exit(1);
        }
        p = (char *)p + r;
        n -= (size_t)r;
    }
}

/* The same bytes in the same messages over a plain loopback socket. */
static double plain_tp(size_t bytes, int reps, int msgs, tp_result *res)
{
    int port, lfd = plain_listen(&port);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = plain_connect(port);
        unsigned char *buf = malloc(bytes);
        uint64_t sink = 0;
        for (int r = 0; r < reps; r++) {
            double t0 = 0;
            for (int m = 0; m < msgs; m++) {
                plain_read(fd, buf, bytes);
                sink += sum_bytes(buf, bytes);
                if (m == 0) {
                    t0 = now_s();
                }
            }
            res->gbps[SEND_IN_PLACE][r] = (double)(msgs - 1) * bytes / (now_s() - t0) / 1e9;
        }
        res->sink += sink;
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    unsigned char *src = malloc(bytes);
    if (fd < 0 || !src) {
        die("plain accept");
    }
    memset(src, 0x5a, bytes);
    for (int k = 0; k < reps * msgs; k++) {
        plain_write(fd, src, bytes);
    }
    int st;
    waitpid(pid, &st, 0);
    close(fd);
    close(lfd);
    free(src);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_transport: plain receiver failed\n");
        exit(1);
    }
    return quantile(res->gbps[SEND_IN_PLACE], reps, 0.5);
}

static void tcp_throughput(const size_t *sizes, int nsizes, int reps)
{
    printf("## tcp channel throughput over loopback: 2 processes, slots=2, median of %d reps of "
           "~%u MB\n\n",
           reps, REP_BYTES >> 20);
    printf("channel = mmp_channel_send (memcpy into the slot, writev of header and slot) to a "
           "receiver that reads every byte in place; plain socket = the same messages written "
           "with send() from one buffer and recv()'d into one buffer (default socket options), "
           "summed the same way; ratio = channel / plain socket, this run.\n\n");
    printf("| size | channel GB/s | plain socket GB/s | ratio |\n|---:|---:|---:|---:|\n");
    tp_result *res = shared_pages(sizeof *res);
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        int msgs = msgs_for(bytes);
        char name[32];
        double plain = plain_tp(bytes, reps, msgs, res);
        mmp_channel *ch;
        tcp_tp_arg arg = {reps, msgs, res};
        pid_t pid = tcp_pair(&ch, bytes, tcp_tp_receiver, &arg);
        unsigned char *src = malloc(bytes);
        if (!src) {
            die("malloc");
        }
        memset(src, 0x5a, bytes);
        for (int k = 0; k < reps * msgs; k++) {
            mmp_msg_header h = {.step = k, .bytes = bytes};
            if (mmp_channel_send(ch, &h, src) != MMP_OK) {
                die("tcp send");
            }
        }
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "bench_transport: tcp receiver failed\n");
            exit(1);
        }
        mmp_channel_close(ch);
        free(src);
        double g = quantile(res->gbps[SEND_COPY], reps, 0.5);
        printf("| %s | %.2f | %.2f | %.2f |\n", size_name(bytes, name, sizeof name), g, plain,
               g / plain);
    }
    printf("\n");
    munmap(res, sizeof *res);
}

typedef struct tcp_pp_arg {
    int n;
    size_t bytes;
    char back[128]; /* the reverse channel's address (the child creates it) */
    _Atomic int ready;
} tcp_pp_arg;

/* The ponging child: receives on c, answers on its own B->A channel. */
static void tcp_pong(const mmp_channel_cfg *c, void *arg)
{
    tcp_pp_arg *a = arg;
    mmp_channel *in, *out;
    mmp_channel_cfg oc = *c;
    oc.address = "127.0.0.1:0";
    oc.send = 1;
    if (mmp_channel_open(&out, "tcp", &oc, 1) != MMP_OK) {
        die("pong setup");
    }
    snprintf(a->back, sizeof a->back, "%s", mmp_channel_address(out));
    atomic_store(&a->ready, 1);
    if (mmp_channel_open(&in, "tcp", c, 0) != MMP_OK) {
        die("pong connect");
    }
    for (int k = 0; k < a->n; k++) {
        mmp_msg_header h;
        const void *p;
        if (mmp_channel_recv(in, &h, &p) != MMP_OK || mmp_channel_send(out, &h, p) != MMP_OK) {
            die("pong");
        }
        mmp_channel_release(in);
    }
    mmp_channel_close(in);
    mmp_channel_close(out);
}

static void tcp_latency(int iters)
{
    printf("## tcp per-micro-batch latency over loopback: half a ping-pong round trip\n\n");
    printf("One message of the size below from post to the peer's return, the peer answering "
           "with the same bytes at once (mmp_channel_send of the received payload); plain = the "
           "same over a plain loopback socket (TCP_NODELAY, send/recv).\n\n");
    printf("| message | channel median µs | channel p90 µs | plain median µs | ratio |\n");
    printf("|---|---:|---:|---:|---:|\n");
    static const size_t sizes[] = {64, 64 << 10, 1 << 20};
    tcp_pp_arg *a = shared_pages(sizeof *a);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t bytes = sizes[si];
        int n = bytes >= (1 << 20) ? iters / 50 : bytes >= (64 << 10) ? iters / 10 : iters;
        n = n < 20 ? 20 : n;
        int warm = n / 10 + 1;
        double *us = malloc(sizeof(double) * (size_t)n), *pus = malloc(sizeof(double) * (size_t)n);
        unsigned char *buf = malloc(bytes);
        if (!us || !pus || !buf) {
            die("malloc");
        }
        memset(buf, 7, bytes);
        memset(a, 0, sizeof *a);
        a->n = n + warm;
        a->bytes = bytes;
        mmp_channel *out, *in;
        pid_t pid = tcp_pair(&out, bytes, tcp_pong, a);
        while (!atomic_load(&a->ready)) {
            pause_us(100);
        }
        mmp_channel_cfg ic = {.address = a->back,
                              .slot_bytes = bytes,
                              .slots = 2,
                              .send = 0,
                              .timeout_ms = 60000,
                              .secret = BENCH_SECRET};
        if (mmp_channel_open(&in, "tcp", &ic, 0) != MMP_OK) {
            die("ping connect");
        }
        for (int k = 0; k < n + warm; k++) {
            mmp_msg_header h = {.step = k, .bytes = bytes}, g;
            const void *p;
            double t0 = now_s();
            if (mmp_channel_send(out, &h, buf) != MMP_OK ||
                mmp_channel_recv(in, &g, &p) != MMP_OK) {
                die("ping");
            }
            mmp_channel_release(in);
            if (k >= warm) {
                us[k - warm] = (now_s() - t0) * 1e6 / 2;
            }
        }
        waitpid(pid, NULL, 0);
        mmp_channel_close(in);
        mmp_channel_close(out);
        /* the plain socket, the same exchange */
        int port, lfd = plain_listen(&port);
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            int fd = plain_connect(port);
            for (int k = 0; k < n + warm; k++) {
                plain_read(fd, buf, bytes);
                plain_write(fd, buf, bytes);
            }
            _exit(0);
        }
        int fd = accept(lfd, NULL, NULL);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (int k = 0; k < n + warm; k++) {
            double t0 = now_s();
            plain_write(fd, buf, bytes);
            plain_read(fd, buf, bytes);
            if (k >= warm) {
                pus[k - warm] = (now_s() - t0) * 1e6 / 2;
            }
        }
        waitpid(pid, NULL, 0);
        close(fd);
        close(lfd);
        double med = quantile(us, n, 0.5), p90 = quantile(us, n, 0.9), pm = quantile(pus, n, 0.5);
        char name[32];
        snprintf(name, sizeof name,
                 bytes >= (1 << 20) ? "%zu MB"
                 : bytes >= 1024    ? "%zu KB"
                                    : "%zu B",
                 bytes >= (1 << 20) ? bytes >> 20
                 : bytes >= 1024    ? bytes >> 10
                                    : bytes);
        printf("| %s | %.1f | %.1f | %.1f | %.2f |\n", name, med, p90, pm, med / pm);
        free(us);
        free(pus);
        free(buf);
    }
    printf("\n");
    munmap(a, sizeof *a);
}

/* ---- main --------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_transport [--sizes 64K,256K,1M,4M,16M,64M] [--tcp-sizes 1M,4M,16M] "
            "[--reps N] [--iters N] [--slots N] [--pin A,B] [--busy N] [--only shm|tcp] "
            "[--spin-ab 1] [--ceiling 1]\n"
            "  sizes: a number with K or M (KiB, MiB; no suffix: MiB, fractions allowed: "
            "0.0625 = 64K), 64 B to 1 GiB, up to %d of them\n",
            MAX_SIZES);
    exit(2);
}

/* "64K,0.25,1M" -> bytes; 0 when the list is malformed. */
static int parse_sizes(const char *arg, size_t *sizes)
{
    int n = 0;
    for (const char *s = arg; *s; n++) {
        char *end;
        double v = strtod(s, &end);
        double unit = 1 << 20;
        if (end == s || n == MAX_SIZES) {
            return 0;
        }
        if (*end == 'K' || *end == 'k') {
            unit = 1 << 10;
            end++;
        } else if (*end == 'M' || *end == 'm') {
            end++;
        }
        double bytes = v * unit;
        if (!(bytes >= 64 && bytes <= (double)(1u << 30)) || (*end && *end != ',')) {
            return 0;
        }
        sizes[n] = ((size_t)bytes + 63) / 64 * 64; /* whole 64-bit words and cache lines */
        s = *end ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20},
           tsizes[MAX_SIZES] = {1 << 20, 4 << 20, 16 << 20};
    int nsizes = 6, ntsizes = 3, reps = 15, iters = 20000, busy = 0, only = 0, slots = 2;
    int spin_ab_on = 0, ceiling_on = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            usage();
        }
        if (strcmp(argv[i], "--sizes") == 0) {
            nsizes = parse_sizes(argv[++i], sizes);
        } else if (strcmp(argv[i], "--tcp-sizes") == 0) {
            ntsizes = parse_sizes(argv[++i], tsizes);
        } else if (strcmp(argv[i], "--reps") == 0) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--iters") == 0) {
            iters = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--slots") == 0) {
            slots = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--pin") == 0) {
            if (sscanf(argv[++i], "%d,%d", &pin_cpu[0], &pin_cpu[1]) != 2 || pin_cpu[0] < 0 ||
                pin_cpu[1] < 0) {
                usage();
            }
        } else if (strcmp(argv[i], "--spin-ab") == 0) {
            spin_ab_on = strcmp(argv[++i], "1") == 0;
        } else if (strcmp(argv[i], "--ceiling") == 0) {
            ceiling_on = strcmp(argv[++i], "1") == 0;
        } else if (strcmp(argv[i], "--busy") == 0) {
            busy = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && strcmp(argv[i + 1], "tcp") == 0) {
            only = 2;
            i++;
        } else if (strcmp(argv[i], "--only") == 0 && strcmp(argv[i + 1], "shm") == 0) {
            only = 1;
            i++;
        } else {
            usage();
        }
    }
    if (nsizes < 1 || ntsizes < 1 || reps < 1 || reps > MAX_REPS || iters < 10 || busy < 0 ||
        busy > 64 || slots < 1 || slots > 64) {
        usage();
    }
    pid_t hogs[64];
    for (int b = 0; b < busy; b++) {
        hogs[b] = fork();
        if (hogs[b] == 0) {
            for (volatile unsigned long x = 0;; x++) {
            }
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const char *spin = getenv("MMP_SHM_SPIN_NS"), *spin_max = getenv("MMP_SHM_SPIN_MAX_NS");
    printf("# bench_transport (%ld CPUs online, %d extra spinning processes; shm waiters poll up "
           "to %s ns%s while their peer answers within that, else %s ns%s, before they "
           "sleep)\n\n",
           cpus, busy, spin_max ? spin_max : "50000", spin_max ? " (MMP_SHM_SPIN_MAX_NS)" : "",
           spin ? spin : "2000", spin ? " (MMP_SHM_SPIN_NS)" : "");
    double t0 = now_s();
    if (ceiling_on) {
        ceiling(sizes, nsizes, reps, slots);
    } else if (spin_ab_on) {
        spin_ab(sizes, nsizes, reps, slots);
    } else if (only != 2) {
        throughput(sizes, nsizes, reps, slots);
        latency(iters);
    }
    if (only != 1 && !spin_ab_on && !ceiling_on) {
        tcp_throughput(tsizes, ntsizes, reps);
        tcp_latency(iters);
    }
    for (int b = 0; b < busy; b++) {
        kill(hogs[b], SIGKILL);
        waitpid(hogs[b], NULL, 0);
    }
    printf("(%.1f s)\n", now_s() - t0);
    return 0;
}
