/* The `shm` data channel: a POSIX shared-memory ring between two processes
 * on one host, with credit flow control and a futex doorbell.
 *
 * One segment per channel, named cfg->address, mapped once by each end:
 *
 *   page 0..   shm_header: magic (stored last by the creator), version,
 *              geometry, both ends' pids and closed flags, the head (posted)
 *              and tail (released) counters and the two doorbell words, each
 *              counter on its own cache line, then one mmp_msg_header per slot.
 *   then       `slots` payload areas of slot_stride bytes (slot_bytes rounded
 *              up to 64), starting on a page boundary, so every payload
 *              pointer is 64-byte aligned.
 *
 * Slot i of lap k is message k*slots+i: slots are used strictly in ring order.
 * The sender may fill a slot only while head - tail < slots; the receiver may
 * read it only while its index < head. Payload and per-slot header are plain
 * memory ordered by the release store of head (sender) and of tail (receiver).
 *
 * Doorbells: each direction has a 32-bit sequence word (data_bell, rung on
 * post; credit_bell, rung on release) used as a cross-process futex (never
 * FUTEX_PRIVATE: the two ends are different processes). A waiter first polls
 * for MMP_SHM_SPIN_NS (2 µs; measurements beside it), then reads the
 * bell, re-checks its condition, announces itself in the sleepers count and
 * sleeps only while the bell still holds the value it read, so a ring between
 * the check and the sleep is never lost. The ringer calls FUTEX_WAKE only when
 * the sleepers count says someone may sleep, so the steady state (the peer is
 * busy, the ring neither full nor empty) makes no system call at all.
 *
 * A blocked call sleeps in slices of SLICE_MS and after each slice checks the
 * peer's closed flag and whether the peer's process still exists (a pidfd,
 * which also sees a zombie as dead), so a SIGKILLed peer is reported as
 * MMP_ERR_PEER, never as a hang.
 *
 * Naming: the creator creates the name with O_CREAT|O_EXCL; the connector
 * unlinks it as soon as it has mapped the segment, so once both ends are
 * attached nothing is left in /dev/shm whatever happens to either process. A
 * creator closing before anyone connected unlinks it itself. Exactly one of
 * them unlinks: the one that wins the `unlinked` flag in the header.
 *
 * Creating, attaching, the futex calls, the pidfd and the unlink flag are
 * transport/segment.h's, shared with the replica reduce; this file owns the
 * layout, the roles and the ring protocol.
 *
 * Must never: allocate or map per message, leave a name behind on an error
 * path, or trust the peer's header fields without checking them. */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "transport/channel.h"
#include "transport/segment.h"

#define SHM_MAGIC 0x31304d4853504d4dull /* "MMPSHM01" */
#define SHM_VERSION 1u
#define SHM_ALIGN 64
#define SHM_PAGE 4096
#define SHM_MAX_SLOTS 4096
/* A blocked call checks on its peer this often: a dead peer is noticed
 * within one slice. */
#define SLICE_MS 100
/* Before sleeping, a waiter polls its condition for this long (ns). Measured
 * on the 2-core development VM (bench_transport and a 64-byte stream):
 * - a futex sleep/wake costs ~3-8 µs one way (a halted vCPU must be woken);
 *   a 2 µs spin does not hide that in a ping-pong, 10 µs does (0.1 µs);
 * - streaming 64-byte messages: no spin 0.5-9 M msg/s (both ends fall into
 *   sleep/wake lock-step), 2 µs spin 11-12 M msg/s with no system calls;
 * - a stage's real wait (a micro-batch being computed upstream) lasts ms, so
 *   the spin rarely wins there and costs at most 2 µs of CPU per wait, which
 *   matters when stages outnumber cores. Hence short, not none.
 * Build with -DMMP_SHM_SPIN_NS=... to measure another value. */
#ifndef MMP_SHM_SPIN_NS
#define MMP_SHM_SPIN_NS 2000
#endif

enum { CREATOR = 0, CONNECTOR = 1 };

typedef struct shm_header {
    _Atomic uint64_t magic; /* SHM_MAGIC once the creator has set up the rest */
    uint32_t version;
    uint32_t slots;
    uint64_t slot_bytes;
    uint64_t slot_stride;    /* slot_bytes rounded up to SHM_ALIGN */
    uint64_t payload_offset; /* from the segment's start; a multiple of SHM_PAGE */
    uint64_t total_bytes;
    int32_t creator_sends;      /* 1: the creator is the sending end */
    _Atomic uint32_t unlinked;  /* 1 once one end has claimed unlinking the name */
    _Atomic int32_t pid[2];     /* [CREATOR], [CONNECTOR]; 0 until attached */
    _Atomic uint32_t closed[2]; /* [CREATOR], [CONNECTOR] */
    /* Written by the sender. */
    alignas(SHM_ALIGN) _Atomic uint64_t head; /* messages posted */
    _Atomic uint32_t data_bell;               /* futex word: rung on post and close */
    _Atomic uint32_t data_sleepers;
    /* Written by the receiver. */
    alignas(SHM_ALIGN) _Atomic uint64_t tail; /* messages released */
    _Atomic uint32_t credit_bell;             /* futex word: rung on release and close */
    _Atomic uint32_t credit_sleepers;
    alignas(SHM_ALIGN) mmp_msg_header msg[]; /* one per slot */
} shm_header;

static_assert(offsetof(shm_header, magic) == 0, "a segment's magic comes first (segment.h)");
static_assert(sizeof(mmp_msg_header) == 32, "mmp_msg_header is part of the segment layout");
static_assert(sizeof(shm_header) == 256, "shm_header is part of the segment layout");

typedef struct shm_channel {
    shm_header *hdr;
    size_t map_bytes;       /* the segment's size, as this end computes it */
    size_t payload_offset;  /* from hdr to slot 0's payload */
    unsigned char *payload; /* slot 0 */
    size_t slot_bytes, stride;
    uint32_t slots;
    int send;          /* this end sends */
    int me, peer;      /* CREATOR / CONNECTOR */
    int timeout_ms;    /* <= 0: blocking calls wait for ever */
    uint64_t count;    /* sender: messages posted; receiver: messages received */
    uint64_t released; /* receiver: messages released */
    int acquired;      /* sender: a slot is acquired and not yet posted */
    int peer_pidfd;    /* -1 until opened */
    char name[NAME_MAX + 1];
} shm_channel;

static shm_channel *shm_of(mmp_channel_impl *c)
{
    return (shm_channel *)(void *)c;
}

/* ---- small helpers ------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

#if MMP_SHM_SPIN_NS > 0
static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}
#endif

/* 1 when the peer's process is known to have exited (a zombie counts). */
static int peer_dead(shm_channel *ch)
{
    return mmp_segment_peer_dead(&ch->hdr->pid[ch->peer], &ch->peer_pidfd);
}

static const char *role_name(int role)
{
    return role == CREATOR ? "creator" : "connector";
}

/* Waits until *counter >= target (acquire). Blocks on bell; reports a closed
 * or dead peer and the channel's timeout as MMP_ERR_PEER. `what` names the
 * awaited event for the message. */
static mmp_err wait_counter(shm_channel *ch, _Atomic uint64_t *counter, uint64_t target,
                            _Atomic uint32_t *bell, _Atomic uint32_t *sleepers, const char *what)
{
    if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
        return MMP_OK;
    }
    double start = now_ms();
#if MMP_SHM_SPIN_NS > 0
    for (int i = 1;; i++) {
        cpu_relax();
        if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
            return MMP_OK;
        }
        if (i % 32 == 0 && (now_ms() - start) * 1e6 >= MMP_SHM_SPIN_NS) {
            break;
        }
    }
#endif
    for (;;) {
        uint32_t seen = atomic_load_explicit(bell, memory_order_acquire);
        if (atomic_load_explicit(counter, memory_order_acquire) >= target) {
            return MMP_OK;
        }
        if (atomic_load_explicit(&ch->hdr->closed[ch->peer], memory_order_acquire)) {
            return mmp_errorf(MMP_ERR_PEER, "shm %s: waiting for %s: the %s end closed", ch->name,
                              what, role_name(ch->peer));
        }
        int slice = SLICE_MS;
        if (ch->timeout_ms > 0) {
            double left = ch->timeout_ms - (now_ms() - start);
            if (left <= 0) {
                return mmp_errorf(MMP_ERR_PEER,
                                  "shm %s: waiting for %s: nothing from the %s end in %d ms",
                                  ch->name, what, role_name(ch->peer), ch->timeout_ms);
            }
            slice = left < SLICE_MS ? (int)left + 1 : SLICE_MS;
        }
        int r = mmp_segment_bell_wait(bell, seen, sleepers, slice);
        if (r == ETIMEDOUT && peer_dead(ch)) {
            return mmp_errorf(MMP_ERR_PEER, "shm %s: waiting for %s: the %s end (pid %d) died",
                              ch->name, what, role_name(ch->peer),
                              (int)atomic_load(&ch->hdr->pid[ch->peer]));
        }
    }
}

/* ---- geometry ----------------------------------------------------------- */

typedef struct shm_geometry {
    size_t stride, payload_offset, total;
} shm_geometry;

static mmp_err check_cfg(const mmp_channel_cfg *cfg, shm_geometry *g)
{
    const char *a = cfg ? cfg->address : NULL;
    MMP_TRY(mmp_segment_check_name("shm", "address", a));
    if (cfg->slots < 1 || cfg->slots > SHM_MAX_SLOTS) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: slots %d not in 1..%d", a, cfg->slots,
                          SHM_MAX_SLOTS);
    }
    if (cfg->slot_bytes > ((size_t)1 << 40)) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: slot_bytes %zu is absurd", a, cfg->slot_bytes);
    }
    g->stride = (cfg->slot_bytes + SHM_ALIGN - 1) / SHM_ALIGN * SHM_ALIGN;
    size_t head = sizeof(shm_header) + (size_t)cfg->slots * sizeof(mmp_msg_header);
    g->payload_offset = (head + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
    g->total = g->payload_offset + (size_t)cfg->slots * g->stride;
    return MMP_OK;
}

/* This end of the channel cfg describes (checked), not attached yet. */
static mmp_err new_channel(shm_channel **out, const mmp_channel_cfg *cfg, int me)
{
    shm_geometry g = {0};
    MMP_TRY(check_cfg(cfg, &g));
    shm_channel *ch = calloc(1, sizeof *ch);
    if (!ch) {
        return mmp_errorf(MMP_ERR_NOMEM, "shm %s: channel", cfg->address);
    }
    snprintf(ch->name, sizeof ch->name, "%s", cfg->address);
    ch->slot_bytes = cfg->slot_bytes;
    ch->stride = g.stride;
    ch->slots = (uint32_t)cfg->slots;
    ch->send = cfg->send != 0;
    ch->me = me;
    ch->peer = 1 - me;
    ch->timeout_ms = cfg->timeout_ms;
    ch->peer_pidfd = -1;
    ch->map_bytes = g.total;
    ch->payload_offset = g.payload_offset;
    *out = ch;
    return MMP_OK;
}

/* ---- the transport ------------------------------------------------------ */

static int shm_can_connect(const mmp_channel_cfg *cfg, const char **why_not)
{
    /* Same host is assumed for now: the coordinator only asks for shm between
     * processes it placed on one machine. */
    if (!cfg || !cfg->address || cfg->address[0] != '/') {
        if (why_not) {
            *why_not = "address is not a POSIX shm name (must start with '/')";
        }
        return 0;
    }
    return 1;
}

static mmp_err shm_setup(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    shm_channel *ch = NULL;
    void *base = NULL;
    *out = NULL;
    MMP_TRY(new_channel(&ch, cfg, CREATOR));
    mmp_err ret = mmp_segment_create(&base, "shm", ch->name, ch->map_bytes);
    if (ret != MMP_OK) {
        free(ch);
        return ret;
    }
    ch->hdr = base;
    ch->payload = (unsigned char *)base + ch->payload_offset;
    shm_header *h = ch->hdr; /* a fresh segment reads as zeros */
    h->version = SHM_VERSION;
    h->slots = ch->slots;
    h->slot_bytes = ch->slot_bytes;
    h->slot_stride = ch->stride;
    h->payload_offset = ch->payload_offset;
    h->total_bytes = ch->map_bytes;
    h->creator_sends = ch->send;
    atomic_store(&h->pid[CREATOR], (int32_t)getpid());
    mmp_segment_publish(base, SHM_MAGIC);
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

/* The creator's header against the connecting end ch (an mmp_segment_check):
 * magic, version, geometry and layout as ch computes them, and opposite
 * directions. */
static mmp_err check_header(void *ctx, const void *header, uint64_t magic, size_t file_bytes)
{
    const shm_channel *ch = ctx;
    const shm_header *h = header;
    if (magic != SHM_MAGIC) {
        return mmp_errorf(MMP_ERR_PROTO, "shm %s: not an mmpipe channel (magic %#llx, want %#llx)",
                          ch->name, (unsigned long long)magic, (unsigned long long)SHM_MAGIC);
    }
    if (h->version != SHM_VERSION) {
        return mmp_errorf(MMP_ERR_PROTO, "shm %s: segment version %u, this end speaks %u", ch->name,
                          h->version, SHM_VERSION);
    }
    if (h->slots != ch->slots || h->slot_bytes != ch->slot_bytes) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "shm %s: geometry mismatch: segment has %u slots of %llu bytes, this "
                          "end expects %u slots of %zu bytes",
                          ch->name, h->slots, (unsigned long long)h->slot_bytes, ch->slots,
                          ch->slot_bytes);
    }
    if (h->slot_stride != ch->stride || h->payload_offset != ch->payload_offset ||
        h->total_bytes != ch->map_bytes || file_bytes != ch->map_bytes) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "shm %s: layout mismatch: segment stride %llu offset %llu size %lld, "
                          "this end computes stride %zu offset %zu size %zu",
                          ch->name, (unsigned long long)h->slot_stride,
                          (unsigned long long)h->payload_offset, (long long)file_bytes, ch->stride,
                          ch->payload_offset, ch->map_bytes);
    }
    if ((h->creator_sends != 0) == ch->send) {
        return mmp_errorf(MMP_ERR_PROTO, "shm %s: both ends %s", ch->name,
                          ch->send ? "send" : "receive");
    }
    return MMP_OK;
}

/* Takes the connector's place in the segment mapped at base (map_bytes,
 * header checked). Once the place is taken ch owns the mapping, whatever this
 * returns: closing ch then closes this end like any other close, so the
 * creator sees it. When another connector holds the place, unmaps base. */
static mmp_err join(shm_channel *ch, void *base)
{
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&((shm_header *)base)->pid[CONNECTOR], &none,
                                        (int32_t)getpid())) {
        mmp_segment_unmap(base, ch->map_bytes);
        return mmp_errorf(MMP_ERR_PROTO, "shm %s: already has a connector (pid %d)", ch->name,
                          (int)none);
    }
    ch->hdr = base;
    ch->payload = (unsigned char *)base + ch->payload_offset;
    /* Both ends are attached: the name has done its job. */
    mmp_segment_unlink_once(&ch->hdr->unlinked, ch->name);
    if (atomic_load(&ch->hdr->closed[CREATOR])) {
        return mmp_errorf(MMP_ERR_PEER, "shm %s: the creator closed before the connect", ch->name);
    }
    if (peer_dead(ch)) {
        return mmp_errorf(MMP_ERR_PEER, "shm %s: the creator (pid %d) is dead", ch->name,
                          (int)atomic_load(&ch->hdr->pid[CREATOR]));
    }
    return MMP_OK;
}

static void shm_close(mmp_channel_impl *c);

static mmp_err shm_connect(mmp_channel_impl **out, const mmp_channel_cfg *cfg)
{
    shm_channel *ch = NULL;
    void *base = NULL;
    *out = NULL;
    MMP_TRY(new_channel(&ch, cfg, CONNECTOR));
    mmp_err ret = mmp_segment_attach(&base, "shm", ch->name, sizeof(shm_header), ch->map_bytes,
                                     ch->timeout_ms, check_header, ch);
    if (ret == MMP_ERR_TIMEOUT) {
        ret = mmp_errorf(MMP_ERR_PEER, "shm %s: no ready creator after %d ms", ch->name,
                         ch->timeout_ms);
    }
    if (ret == MMP_OK) {
        ret = join(ch, base);
    }
    if (ret != MMP_OK) {
        /* unmaps if joined; never unlinks a creator's name */
        shm_close((mmp_channel_impl *)(void *)ch);
        return ret;
    }
    *out = (mmp_channel_impl *)(void *)ch;
    return MMP_OK;
}

static mmp_err shm_acquire(mmp_channel_impl *c, void **payload)
{
    shm_channel *ch = shm_of(c);
    if (!ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: acquire on the receiving end", ch->name);
    }
    if (ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: acquire twice without a post", ch->name);
    }
    if (atomic_load_explicit(&ch->hdr->closed[ch->peer], memory_order_acquire)) {
        return mmp_errorf(MMP_ERR_PEER, "shm %s: the receiving %s end closed", ch->name,
                          role_name(ch->peer));
    }
    if (ch->count >= ch->slots) {
        MMP_TRY(wait_counter(ch, &ch->hdr->tail, ch->count - ch->slots + 1, &ch->hdr->credit_bell,
                             &ch->hdr->credit_sleepers, "a credit"));
    }
    /* tail is the peer's word: a receiver cannot release what was never posted. */
    uint64_t tail = atomic_load_explicit(&ch->hdr->tail, memory_order_acquire);
    if (tail > ch->count) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "shm %s: header field tail = %llu, more than the %llu messages posted",
                          ch->name, (unsigned long long)tail, (unsigned long long)ch->count);
    }
    ch->acquired = 1;
    *payload = ch->payload + (size_t)(ch->count % ch->slots) * ch->stride;
    return MMP_OK;
}

static mmp_err shm_post(mmp_channel_impl *c, const mmp_msg_header *h)
{
    shm_channel *ch = shm_of(c);
    if (!ch->acquired) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: post without an acquired slot", ch->name);
    }
    if (h->bytes > ch->slot_bytes) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: post of %llu bytes into %zu-byte slots",
                          ch->name, (unsigned long long)h->bytes, ch->slot_bytes);
    }
    ch->hdr->msg[ch->count % ch->slots] = *h;
    ch->count++;
    ch->acquired = 0;
    atomic_store_explicit(&ch->hdr->head, ch->count, memory_order_release);
    mmp_segment_bell_ring(&ch->hdr->data_bell, &ch->hdr->data_sleepers);
    return MMP_OK;
}

static mmp_err shm_recv(mmp_channel_impl *c, mmp_msg_header *h, const void **payload)
{
    shm_channel *ch = shm_of(c);
    if (ch->send) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: recv on the sending end", ch->name);
    }
    MMP_TRY(wait_counter(ch, &ch->hdr->head, ch->count + 1, &ch->hdr->data_bell,
                         &ch->hdr->data_sleepers, "a message"));
    /* head is the peer's word: more than a ring ahead of what we took means
     * it is forged or corrupt (the sender may never lap the receiver). */
    uint64_t head = atomic_load_explicit(&ch->hdr->head, memory_order_acquire);
    if (head - ch->count > ch->slots) {
        return mmp_errorf(MMP_ERR_PROTO,
                          "shm %s: header field head = %llu, more than the %u slots ahead of the "
                          "%llu messages received",
                          ch->name, (unsigned long long)head, ch->slots,
                          (unsigned long long)ch->count);
    }
    uint32_t i = (uint32_t)(ch->count % ch->slots);
    *h = ch->hdr->msg[i]; /* a copy: the checks below hold whatever the peer writes next */
    char what[NAME_MAX + 40];
    snprintf(what, sizeof what, "shm %s message %llu", ch->name, (unsigned long long)ch->count);
    MMP_TRY(mmp_msg_check(what, h, ch->slot_bytes));
    ch->count++;
    *payload = ch->payload + (size_t)i * ch->stride;
    return MMP_OK;
}

static mmp_err shm_release(mmp_channel_impl *c)
{
    shm_channel *ch = shm_of(c);
    if (ch->send || ch->released == ch->count) {
        return mmp_errorf(MMP_ERR_INVALID, "shm %s: release with no received slot held", ch->name);
    }
    ch->released++;
    atomic_store_explicit(&ch->hdr->tail, ch->released, memory_order_release);
    mmp_segment_bell_ring(&ch->hdr->credit_bell, &ch->hdr->credit_sleepers);
    return MMP_OK;
}

/* Marks this end closed, wakes the peer (its blocked call returns
 * MMP_ERR_PEER once it has drained what was posted), unmaps and frees ch. A
 * creator no one connected to unlinks the name. NULL is a no-op; ch is freed,
 * so the caller drops its pointer (closing twice is closing NULL). */
static void shm_close(mmp_channel_impl *c)
{
    shm_channel *ch = shm_of(c);
    if (!ch) {
        return;
    }
    if (ch->hdr) {
        atomic_store_explicit(&ch->hdr->closed[ch->me], 1, memory_order_release);
        /* Every waiter, whatever the sleepers count says. */
        mmp_segment_bell_ring(&ch->hdr->data_bell, NULL);
        mmp_segment_bell_ring(&ch->hdr->credit_bell, NULL);
        if (ch->me == CREATOR) {
            mmp_segment_unlink_once(&ch->hdr->unlinked, ch->name);
        }
        mmp_segment_unmap(ch->hdr, ch->map_bytes);
    }
    if (ch->peer_pidfd >= 0) {
        close(ch->peer_pidfd);
    }
    free(ch);
}

static size_t shm_slot_bytes(const mmp_channel_impl *c)
{
    return ((const shm_channel *)(const void *)c)->slot_bytes;
}

const mmp_transport mmp_transport_shm = {
    .name = "shm",
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = shm_connect,
    .acquire = shm_acquire,
    .post = shm_post,
    .recv = shm_recv,
    .release = shm_release,
    .close = shm_close,
    .slot_bytes = shm_slot_bytes,
};
