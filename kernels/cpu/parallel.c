/* The CPU kernels' fork-join pool (see parallel.h): one mutex, a generation
 * counter the workers wait on, a pending count the caller waits on. Never
 * fails: a worker that cannot be started leaves the pool smaller.
 *
 * Both waits poll for a moment (SPIN_NS, yielding the CPU between looks)
 * before they sleep on their condition variable: a kernel runs its loops
 * back to back (a convolution's blocks of GEMM, then its im2col), and on a
 * VM a futex wake-up costs tens of microseconds (measured: the demo at 2
 * threads spent 22% of its time in futex wake and wait). gen and pending
 * are written under the mutex and read outside it with atomic loads. */
#include "kernels/cpu/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 63
#define SPIN_NS 100000 /* 0.1 ms */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Polls until done(arg) holds or SPIN_NS have passed; whether it held.
 * Called without the mutex. */
static int spin_until(int (*done)(const void *), const void *arg)
{
    double t0 = now_ns();
    for (;;) {
        if (done(arg)) {
            return 1;
        }
        if (now_ns() - t0 > SPIN_NS) {
            return 0;
        }
        sched_yield();
    }
}

static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    int threads;       /* chosen by mmp_cpu_pool_resize, caller included */
    int workers;       /* started */
    pid_t pid;         /* the process that started them */
    int busy;          /* a loop is in flight */
    unsigned long gen; /* bumped once per loop */
    /* the gen each worker was started at: a loop begun before the worker
     * first takes the lock is still its to run */
    unsigned long start_gen[MAX_WORKERS + 1];
    int parts, pending;
    size_t n;
    mmp_cpu_range_fn fn;
    void *ctx;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER,
          .threads = 1};

static void run_part(mmp_cpu_range_fn fn, void *ctx, size_t n, int part, int parts)
{
    size_t lo = n * (size_t)part / (size_t)parts, hi = n * (size_t)(part + 1) / (size_t)parts;
    if (lo < hi) {
        fn(ctx, lo, hi);
    }
}

static int gen_moved(const void *seen)
{
    return __atomic_load_n(&pool.gen, __ATOMIC_ACQUIRE) != *(const unsigned long *)seen;
}

static int none_pending(const void *unused)
{
    (void)unused;
    return __atomic_load_n(&pool.pending, __ATOMIC_ACQUIRE) == 0;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg; /* 1 .. workers; the caller is part 0 */
    pthread_mutex_lock(&pool.mu);
    unsigned long seen = pool.start_gen[id];
    for (;;) {
        if (pool.gen == seen) { /* the next loop may come at once: look before sleeping */
            pthread_mutex_unlock(&pool.mu);
            spin_until(gen_moved, &seen);
            pthread_mutex_lock(&pool.mu);
        }
        while (pool.gen == seen) {
            pthread_cond_wait(&pool.wake, &pool.mu);
        }
        seen = pool.gen;
        if (id >= pool.parts) {
            continue;
        }
        mmp_cpu_range_fn fn = pool.fn;
        void *ctx = pool.ctx;
        size_t n = pool.n;
        int parts = pool.parts;
        pthread_mutex_unlock(&pool.mu);
        run_part(fn, ctx, n, id, parts);
        pthread_mutex_lock(&pool.mu);
        if (__atomic_sub_fetch(&pool.pending, 1, __ATOMIC_RELEASE) == 0) {
            pthread_cond_signal(&pool.done);
        }
    }
    return NULL;
}

void mmp_cpu_pool_resize(int n)
{
    pthread_mutex_lock(&pool.mu);
    if (pool.pid != getpid()) {
        pool.workers = 0; /* a fork child: its parent's workers are not here */
        pool.pid = getpid();
    }
    pool.threads = n > 1 ? n : 1;
    int want = pool.threads - 1 < MAX_WORKERS ? pool.threads - 1 : MAX_WORKERS;
    while (pool.workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pool.start_gen[pool.workers + 1] = pool.gen;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)(pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            break;
        }
        pool.workers++;
    }
    pthread_mutex_unlock(&pool.mu);
}

int mmp_cpu_pool_threads(void)
{
    pthread_mutex_lock(&pool.mu);
    int t = pool.threads < pool.workers + 1 ? pool.threads : pool.workers + 1;
    if (pool.pid != getpid()) {
        t = 1;
    }
    pthread_mutex_unlock(&pool.mu);
    return t;
}

void mmp_cpu_parallel_for(size_t n, size_t grain, mmp_cpu_range_fn fn, void *ctx)
{
    if (grain < 1) {
        grain = 1;
    }
    size_t parts = n / grain;
    pthread_mutex_lock(&pool.mu);
    if (parts > (size_t)pool.threads) {
        parts = (size_t)pool.threads;
    }
    if (parts > (size_t)pool.workers + 1) {
        parts = (size_t)pool.workers + 1;
    }
    if (parts < 2 || pool.busy || pool.pid != getpid()) {
        pthread_mutex_unlock(&pool.mu);
        fn(ctx, 0, n);
        return;
    }
    pool.busy = 1;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.parts = (int)parts;
    __atomic_store_n(&pool.pending, (int)parts - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.gen, pool.gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
    run_part(fn, ctx, n, 0, (int)parts);
    spin_until(none_pending, NULL); /* the workers' parts may be done in a moment */
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) {
        pthread_cond_wait(&pool.done, &pool.mu);
    }
    pool.busy = 0;
    pthread_mutex_unlock(&pool.mu);
}
