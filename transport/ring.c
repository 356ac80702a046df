/* The slot ring with credit flow control (the contract is in ring.h), shared
 * by the shm and cuda_ipc data channels.
 *
 * Must never: trust head, tail or a header the peer wrote before checking
 * them, let the sender lap the receiver, or sleep without re-checking the
 * awaited condition after reading the bell. */
#include "transport/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "transport/segment.h"

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static const char *role_name(int role)
{
    return role == MMP_RING_CREATOR ? "creator" : "connector";
}

mmp_err mmp_ring_check_cfg(const char *what, const mmp_channel_cfg *cfg, int max_slots)
{
    const char *a = cfg ? cfg->address : NULL;
    MMP_TRY(mmp_segment_check_name(what, "address", a));
    if (cfg->slots < 1 || cfg->slots > max_slots) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: slots %d not in 1..%d", what, a, cfg->slots,
                          max_slots);
    }
    if (cfg->slot_bytes > ((size_t)1 << 40)) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: slot_bytes %zu is absurd", what, a,
                          cfg->slot_bytes);
    }
    return MMP_OK;
}

void mmp_ring_header_init(mmp_ring_header *h, const mmp_ring *r, uint32_t version, size_t stride,
                          size_t total_bytes)
{
    h->version = version;
    h->slots = r->slots;
    h->slot_bytes = r->slot_bytes;
    h->slot_stride = stride;
    h->total_bytes = total_bytes;
    h->creator_sends = r->send;
}

mmp_err mmp_ring_check_header(const mmp_ring *r, const mmp_ring_header *h, uint32_t version,
                              size_t stride, size_t total_bytes, size_t file_bytes)
{
    if (h->version != version) {
        return mmp_errorf(MMP_ERR_PROTO, "%s %s: segment version %u, this end speaks %u", r->what,
                          r->name, h->version, version);
    }
    if (h->slots != r->slots || h->slot_bytes != r->slot_bytes) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s %s: geometry mismatch: segment has %u slots of %llu bytes, this "
                          "end expects %u slots of %zu bytes",
                          r->what, r->name, h->slots, (unsigned long long)h->slot_bytes, r->slots,
                          r->slot_bytes);
    }
    if (h->slot_stride != stride || h->total_bytes != total_bytes || file_bytes != total_bytes) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "%s %s: layout mismatch: segment stride %llu size %lld, this end "
                          "computes stride %zu size %zu",
                          r->what, r->name, (unsigned long long)h->slot_stride,
                          (long long)file_bytes, stride, total_bytes);
    }
    if ((h->creator_sends != 0) == r->send) {
        return mmp_errorf(MMP_ERR_PROTO, "%s %s: both ends %s", r->what, r->name,
                          r->send ? "send" : "receive");
    }
    return MMP_OK;
}

void mmp_ring_init(mmp_ring *r, const char *what, const char *name, const mmp_channel_cfg *cfg,
                   int me, long spin_ns, const mmp_ring_hooks *hooks, void *ctx)
{
    *r = (mmp_ring){.what = what,
                    .name = name,
                    .slots = (uint32_t)cfg->slots,
                    .slot_bytes = cfg->slot_bytes,
                    .send = cfg->send != 0,
                    .me = me,
                    .peer = 1 - me,
                    .timeout_ms = cfg->timeout_ms,
                    .spin_ns = spin_ns,
                    .hooks = hooks,
                    .ctx = ctx,
                    .load_fd = -1,
                    .peer_pidfd = -1};
}

void mmp_ring_adaptive_spin(mmp_ring *r, long max_ns)
{
    r->spin_max_ns = max_ns > r->spin_ns ? max_ns : 0;
    r->wait_hist = 0xffffu; /* start as if the peer answered in time: a stream spins at once */
}

void mmp_ring_attach(mmp_ring *r, mmp_ring_shared *sh, mmp_msg_header *msg)
{
    r->sh = sh;
    r->msg = msg;
}

void mmp_ring_slots(mmp_ring *r, unsigned char *slot0, size_t stride)
{
    r->slot0 = slot0;
    r->stride = stride;
}

void mmp_ring_take_creator(mmp_ring *r)
{
    atomic_store(&r->sh->pid[MMP_RING_CREATOR], (int32_t)getpid());
}

int mmp_ring_peer_dead(mmp_ring *r)
{
    return mmp_segment_peer_dead(&r->sh->pid[r->peer], &r->peer_pidfd);
}

mmp_err mmp_ring_join(mmp_ring *r, int *joined)
{
    int32_t none = 0;
    *joined = 0;
    if (!atomic_compare_exchange_strong(&r->sh->pid[MMP_RING_CONNECTOR], &none,
                                        (int32_t)getpid())) {
        return mmp_errorf(MMP_ERR_PROTO, "%s %s: already has a connector (pid %d)", r->what,
                          r->name, (int)none);
    }
    *joined = 1;
    /* Both ends are attached: the name has done its job. */
    mmp_segment_unlink_once(&r->sh->unlinked, r->name);
    if (atomic_load(&r->sh->closed[MMP_RING_CREATOR])) {
        return mmp_errorf(MMP_ERR_PEER, "%s %s: the creator closed before the connect", r->what,
                          r->name);
    }
    if (mmp_ring_peer_dead(r)) {
        return mmp_errorf(MMP_ERR_PEER, "%s %s: the creator (pid %d) is dead", r->what, r->name,
                          (int)atomic_load(&r->sh->pid[MMP_RING_CREATOR]));
    }
    return MMP_OK;
}

/* Wakes the waiters of bell after this end moved the counter they wait on
 * (a release store just before). The steady state (the peer polling, nobody
 * asleep) costs no write to the shared line beyond the counter itself: the
 * bell is bumped only when a sleeper is counted. The fence pairs with the
 * waiter's (wait_counter): of "this store, then read sleepers" and "count
 * myself, then read the counter", one sees the other's write. A sleeper
 * found is told when the counter moved (*rung), so that it can tell how long
 * a spin would have had to last, whatever its own wake-up took. */
static void ring_wake(_Atomic uint32_t *bell, _Atomic uint32_t *sleepers, _Atomic int64_t *rung)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(sleepers, memory_order_relaxed) != 0) {
        atomic_store_explicit(rung, now_ns(), memory_order_release);
        mmp_segment_bell_ring(bell, NULL);
    }
}

/* Reads the peer's tail into *tail and refuses it when it is more than this
 * sender posted (a receiver cannot release what was never posted). */
static mmp_err read_tail(const mmp_ring *r, memory_order order, uint64_t *tail)
{
    *tail = atomic_load_explicit(&r->sh->tail, order);
    if (*tail > r->count) {
        return mmp_errorf(
            MMP_ERR_PROTO, "%s %s: header field tail = %llu, more than the %llu messages posted",
            r->what, r->name, (unsigned long long)*tail, (unsigned long long)r->count);
    }
    return MMP_OK;
}

/* Publishes the CPU this end runs on (cpu[me]) when it changed: a getcpu
 * (rseq or vDSO, no system call) and, rarely, a store to a read-mostly line. */
static int note_cpu(mmp_ring *r)
{
    int cpu = sched_getcpu();
    if (cpu >= 0 && cpu + 1 != r->cpu_said) {
        r->cpu_said = cpu + 1;
        atomic_store_explicit(&r->sh->cpu[r->me], cpu + 1, memory_order_relaxed);
    }
    return cpu;
}

/* 1 when the host has no more runnable tasks (this one included) than
 * online CPUs: /proc/loadavg's fourth field, sampled at most every 10 ms (a
 * pread of a small file, a few µs). Unreadable: 0, the old short poll. */
static int cpus_free(mmp_ring *r, int64_t now)
{
    if (r->load_at != 0 && now - r->load_at < 10000000) {
        return r->cpus_free;
    }
    r->load_at = now;
    r->cpus_free = 0;
    if (r->load_fd < 0) {
        r->load_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    }
    char buf[128];
    ssize_t n = r->load_fd >= 0 ? pread(r->load_fd, buf, sizeof buf - 1, 0) : -1;
    long running = 0, online = sysconf(_SC_NPROCESSORS_ONLN);
    if (n > 0) {
        buf[n] = 0;
        double l1, l5, l15;
        if (sscanf(buf, "%lf %lf %lf %ld/", &l1, &l5, &l15, &running) == 4) {
            r->cpus_free = running >= 1 && running <= online;
        }
    }
    return r->cpus_free;
}

/* How long the next wait polls before it sleeps (mmp_ring_adaptive_spin). */
static long spin_budget(mmp_ring *r, int64_t now)
{
    if (r->spin_max_ns <= r->spin_ns) {
        return r->spin_ns;
    }
    int cpu = note_cpu(r);
    if (cpu >= 0 && atomic_load_explicit(&r->sh->cpu[r->peer], memory_order_relaxed) == cpu + 1) {
        return 0; /* the peer shares this CPU: it cannot answer while we poll */
    }
    if (__builtin_popcount(r->wait_hist & 0xffffu) < 12 || !cpus_free(r, now)) {
        return r->spin_ns;
    }
    return r->spin_max_ns;
}

/* Records a wait that began at start (ns) and that the peer answered at
 * `answered`. */
static void note_wait(mmp_ring *r, int64_t start, int64_t answered)
{
    r->wait_hist = (r->wait_hist << 1) | (answered - start <= r->spin_max_ns);
}

/* Waits until *counter >= target (acquire). Polls (spin_budget), then
 * blocks on bell; reports a closed or dead peer and the channel's timeout as
 * MMP_ERR_PEER. `awaited` names the awaited event for the message; *rung is
 * where the peer stamps a post or release that found this end asleep. */
static mmp_err wait_counter(mmp_ring *r, _Atomic uint64_t *counter, uint64_t target,
                            _Atomic uint32_t *bell, _Atomic uint32_t *sleepers,
                            _Atomic int64_t *rung, const char *awaited)
{
    if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
        return MMP_OK;
    }
    int64_t start = now_ns();
    long spin = spin_budget(r, start);
    if (spin > 0) {
        for (int i = 1;; i++) {
            cpu_relax();
            if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
                note_wait(r, start, now_ns());
                return MMP_OK;
            }
            if (i % 32 == 0 && now_ns() - start >= spin) {
                break;
            }
        }
    }
    for (int slept = 0;; slept = 1) {
        uint32_t seen = atomic_load_explicit(bell, memory_order_acquire);
        if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
            /* Woken: when the peer moved the counter, not when this end woke. */
            int64_t at = slept ? atomic_load_explicit(rung, memory_order_acquire) : 0;
            note_wait(r, start, at > start ? at : now_ns());
            return MMP_OK;
        }
        if (atomic_load_explicit(&r->sh->closed[r->peer], memory_order_acquire)) {
            return mmp_errorf(MMP_ERR_PEER, "%s %s: waiting for %s: the %s end closed", r->what,
                              r->name, awaited, role_name(r->peer));
        }
        int slice = MMP_RING_SLICE_MS;
        if (r->timeout_ms > 0) {
            double left = r->timeout_ms - (now_ns() - start) * 1e-6;
            if (left <= 0) {
                return mmp_errorf(MMP_ERR_PEER,
                                  "%s %s: waiting for %s: nothing from the %s end in %d ms",
                                  r->what, r->name, awaited, role_name(r->peer), r->timeout_ms);
            }
            slice = left < MMP_RING_SLICE_MS ? (int)left + 1 : MMP_RING_SLICE_MS;
        }
        /* Counted among the sleepers before the last look (see ring_wake):
         * either that look sees the peer's counter move or the peer sees us
         * and rings, which changes the bell from `seen`. */
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
            atomic_fetch_sub_explicit(sleepers, 1, memory_order_relaxed);
            note_wait(r, start, now_ns());
            return MMP_OK;
        }
        int w = mmp_segment_bell_wait(bell, seen, NULL, slice);
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_relaxed);
        if (w == ETIMEDOUT && mmp_ring_peer_dead(r)) {
            return mmp_errorf(MMP_ERR_PEER, "%s %s: waiting for %s: the %s end (pid %d) died",
                              r->what, r->name, awaited, role_name(r->peer),
                              (int)atomic_load(&r->sh->pid[r->peer]));
        }
    }
}

/* acquire; wait 0: MMP_ERR_TIMEOUT (nothing recorded) instead of waiting. */
static mmp_err ring_acquire(mmp_ring *r, uint32_t *slot, int wait)
{
    if (!r->send) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: acquire on the receiving end", r->what, r->name);
    }
    if (r->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: acquire twice without a post", r->what, r->name);
    }
    if (atomic_load_explicit(&r->sh->closed[r->peer], memory_order_acquire)) {
        return mmp_errorf(MMP_ERR_PEER, "%s %s: the receiving %s end closed", r->what, r->name,
                          role_name(r->peer));
    }
    int reused = r->count >= r->slots;
    if (reused && r->peer_seen < r->count - r->slots + 1) {
        if (wait) {
            MMP_TRY(wait_counter(r, &r->sh->tail, r->count - r->slots + 1, &r->sh->credit_bell,
                                 &r->sh->credit_sleepers, &r->sh->credit_rung_ns, "a credit"));
        }
        uint64_t tail;
        MMP_TRY(read_tail(r, memory_order_acquire, &tail));
        r->peer_seen = tail; /* checked, and count only grows: it stays valid */
        if (tail < r->count - r->slots + 1) {
            return MMP_ERR_TIMEOUT; /* !wait: the slot is still the receiver's */
        }
    } else if (!reused) {
        /* the first lap needs no credit; a forged tail is still refused */
        uint64_t tail;
        MMP_TRY(read_tail(r, memory_order_relaxed, &tail));
    }
    uint32_t i = (uint32_t)(r->count % r->slots);
    if (r->hooks && r->hooks->acquire) {
        MMP_TRY(r->hooks->acquire(r->ctx, i, reused));
    }
    r->acquired = 1;
    *slot = i;
    return MMP_OK;
}

mmp_err mmp_ring_acquire(mmp_ring *r, uint32_t *slot)
{
    return ring_acquire(r, slot, 1);
}

mmp_err mmp_ring_try_acquire(mmp_ring *r, uint32_t *slot)
{
    return ring_acquire(r, slot, 0);
}

mmp_err mmp_ring_post(mmp_ring *r, const mmp_msg_header *h)
{
    if (!r->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: post without an acquired slot", r->what,
                          r->name);
    }
    if (h->bytes > r->slot_bytes) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: post of %llu bytes into %zu-byte slots", r->what,
                          r->name, (unsigned long long)h->bytes, r->slot_bytes);
    }
    uint32_t i = (uint32_t)(r->count % r->slots);
    if (r->hooks && r->hooks->post) {
        MMP_TRY(r->hooks->post(r->ctx, i));
    }
    r->msg[i] = *h;
    r->count++;
    r->acquired = 0;
    atomic_store_explicit(&r->sh->head, r->count, memory_order_release);
    if (r->spin_max_ns > 0) {
        note_cpu(r); /* the peer's spin_budget asks where this end runs */
    }
    ring_wake(&r->sh->data_bell, &r->sh->data_sleepers, &r->sh->data_rung_ns);
    return MMP_OK;
}

mmp_err mmp_ring_recv(mmp_ring *r, mmp_msg_header *h, uint32_t *slot)
{
    if (r->send) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: recv on the sending end", r->what, r->name);
    }
    if (r->peer_seen < r->count + 1) {
        MMP_TRY(wait_counter(r, &r->sh->head, r->count + 1, &r->sh->data_bell,
                             &r->sh->data_sleepers, &r->sh->data_rung_ns, "a message"));
        /* head is the peer's word: more than a ring ahead of what we took means
         * it is forged or corrupt (the sender may never lap the receiver). */
        uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
        if (head - r->count > r->slots) {
            return mmp_errorf(MMP_ERR_PROTO,
                              "%s %s: header field head = %llu, more than the %u slots ahead of "
                              "the %llu messages received",
                              r->what, r->name, (unsigned long long)head, (unsigned)r->slots,
                              (unsigned long long)r->count);
        }
        r->peer_seen = head; /* checked; the acquire load above covers every slot up to it */
    }
    uint32_t i = (uint32_t)(r->count % r->slots);
    *h = r->msg[i]; /* a copy: the checks below hold whatever the peer writes next */
    char what[NAME_MAX + 64];
    snprintf(what, sizeof what, "%s %s message %llu", r->what, r->name,
             (unsigned long long)r->count);
    MMP_TRY(mmp_msg_check(what, h, r->slot_bytes));
    if (r->hooks && r->hooks->recv) {
        MMP_TRY(r->hooks->recv(r->ctx, i));
    }
    r->count++;
    *slot = i;
    return MMP_OK;
}

mmp_err mmp_ring_release(mmp_ring *r)
{
    if (r->send || r->released == r->count) {
        return mmp_errorf(MMP_ERR_INVALID, "%s %s: release with no received slot held", r->what,
                          r->name);
    }
    uint32_t i = (uint32_t)(r->released % r->slots);
    if (r->hooks && r->hooks->release) {
        MMP_TRY(r->hooks->release(r->ctx, i));
    }
    r->released++;
    atomic_store_explicit(&r->sh->tail, r->released, memory_order_release);
    if (r->spin_max_ns > 0) {
        note_cpu(r);
    }
    ring_wake(&r->sh->credit_bell, &r->sh->credit_sleepers, &r->sh->credit_rung_ns);
    return MMP_OK;
}

/* ---- table entries ---- */

static mmp_ring *ring_of(mmp_channel_impl *c)
{
    return (mmp_ring *)(void *)c;
}

mmp_err mmp_ring_impl_acquire(mmp_channel_impl *c, void **payload)
{
    mmp_ring *r = ring_of(c);
    uint32_t i = 0;
    MMP_TRY(mmp_ring_acquire(r, &i));
    *payload = r->slot0 + (size_t)i * r->stride;
    return MMP_OK;
}

mmp_err mmp_ring_impl_try_acquire(mmp_channel_impl *c, void **payload)
{
    mmp_ring *r = ring_of(c);
    uint32_t i = 0;
    MMP_TRY(mmp_ring_try_acquire(r, &i));
    *payload = r->slot0 + (size_t)i * r->stride;
    return MMP_OK;
}

mmp_err mmp_ring_impl_post(mmp_channel_impl *c, const mmp_msg_header *h)
{
    return mmp_ring_post(ring_of(c), h);
}

mmp_err mmp_ring_impl_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload)
{
    mmp_ring *r = ring_of(c);
    uint32_t i = 0;
    MMP_TRY(mmp_ring_recv(r, h, &i));
    *payload = r->slot0 + (size_t)i * r->stride;
    return MMP_OK;
}

mmp_err mmp_ring_impl_release(mmp_channel_impl *c)
{
    return mmp_ring_release(ring_of(c));
}

size_t mmp_ring_impl_slot_bytes(const mmp_channel_impl *c)
{
    return ((const mmp_ring *)(const void *)c)->slot_bytes;
}

void mmp_ring_close(mmp_ring *r)
{
    if (!r->sh) {
        return;
    }
    atomic_store_explicit(&r->sh->closed[r->me], 1, memory_order_release);
    /* Every waiter, whatever the sleepers count says. */
    mmp_segment_bell_ring(&r->sh->data_bell, NULL);
    mmp_segment_bell_ring(&r->sh->credit_bell, NULL);
    if (r->me == MMP_RING_CREATOR) {
        mmp_segment_unlink_once(&r->sh->unlinked, r->name);
    }
}

void mmp_ring_fini(mmp_ring *r)
{
    if (r->load_fd >= 0) {
        close(r->load_fd);
        r->load_fd = -1;
    }
    if (r->peer_pidfd >= 0) {
        close(r->peer_pidfd);
        r->peer_pidfd = -1;
    }
}
